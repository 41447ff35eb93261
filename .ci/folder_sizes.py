#!/usr/bin/env python3
"""No source folder holds more than 15 files: a folder that grows past it
is split into subfolders by concern (a module folder, a test target's
folder), so a reader finds a file by what it is about.

Counts the source files (.rs .c .h .S .s .py .sh .ld) directly in each
folder under the given roots (default: crates, fuzz, scripts), `target`
folders left out. Each folder over the limit is listed; the run fails
when one is not among KNOWN below, each of which names why it is still
over. A known exception that is back under the limit is reported too, so
the list shrinks as folders are split.

Usage: .ci/folder_sizes.py [ROOT...]; .ci/folder_sizes.py --selftest shows
the check fails on a folder of 16 files and passes on one of 15."""
import os
import sys
import tempfile

LIMIT = 15
SOURCE = (".rs", ".c", ".h", ".S", ".s", ".py", ".sh", ".ld")
# Folders allowed over the limit, each with the reason (none: every
# source folder fits).
KNOWN = {}


def counts(roots):
    """(folder, number of source files in it) for every folder under roots."""
    out = []
    for root in roots:
        for d, dirs, files in os.walk(root):
            dirs[:] = sorted(x for x in dirs if x != "target" and not x.startswith("."))
            n = sum(1 for f in files if f.endswith(SOURCE))
            out.append((os.path.normpath(d), n))
    return out


def check(roots, known, out=sys.stdout):
    """Prints the folders over the limit; returns 0 when each is known."""
    bad = 0
    over = set()
    for d, n in counts(roots):
        if n <= LIMIT:
            continue
        over.add(d)
        if d in known:
            print(f"{d}: {n} source files (known: {known[d]})", file=out)
        else:
            print(f"{d}: {n} source files, more than {LIMIT}: split it by concern", file=out)
            bad += 1
    for d in sorted(set(known) - over):
        if any(os.path.normpath(d).startswith(os.path.normpath(r)) for r in roots) and os.path.isdir(d):
            print(f"{d}: back under {LIMIT} files; drop it from KNOWN in {__file__}", file=out)
    return 1 if bad else 0


def selftest():
    with tempfile.TemporaryDirectory() as t:
        big = os.path.join(t, "big")
        ok = os.path.join(t, "ok")
        os.makedirs(os.path.join(big, "target"))
        os.makedirs(ok)
        for i in range(LIMIT):
            open(os.path.join(ok, f"f{i}.rs"), "w").close()
            open(os.path.join(big, f"f{i}.rs"), "w").close()
            # Build output and non-source files do not count.
            open(os.path.join(big, "target", f"g{i}.rs"), "w").close()
            open(os.path.join(ok, f"n{i}.md"), "w").close()
        assert check([ok], {}, out=open(os.devnull, "w")) == 0, "15 files passed"
        assert check([big], {}, out=open(os.devnull, "w")) == 0, "15 files and a target passed"
        open(os.path.join(big, "one_more.py"), "w").close()
        assert check([big], {}, out=open(os.devnull, "w")) == 1, "16 files must fail"
        assert check([big], {os.path.normpath(big): "why"}, out=open(os.devnull, "w")) == 0
    print("folder_sizes selftest: fails on 16 source files in a folder, passes on 15")
    return 0


def main(argv):
    if argv[1:] == ["--selftest"]:
        return selftest()
    roots = argv[1:] or [r for r in ("crates", "fuzz", "scripts") if os.path.isdir(r)]
    return check(roots, KNOWN)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
