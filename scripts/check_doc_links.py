#!/usr/bin/env python3
"""Checks the links between the project's Markdown files.

Every relative link `](path)`, `](path#anchor)` and `](#anchor)` in README.md
and docs/**/*.md must name a file that exists and, where it has an anchor, a
heading of that file (GitHub's anchors: lower case, punctuation dropped,
spaces as hyphens, a repeated heading numbered -1, -2, ...). Links to other
sites are not followed. Also lists every fenced code block without a
language tag (the README is compiled as the engine's doctests, where an
untagged block is Rust). Exit status 1 on any fault, each named.

Usage: python3 scripts/check_doc_links.py [--selftest]
"""
import glob
import os
import re
import sys

LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```(.*)$")


def anchors(path):
    """The anchors GitHub makes for the headings of a Markdown file."""
    seen = {}
    out = set()
    in_code = False
    for line in open(path, encoding="utf-8"):
        if FENCE.match(line):
            in_code = not in_code
            continue
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if in_code or not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(2).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def faults(root):
    files = [os.path.join(root, "README.md")]
    files += sorted(glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True))
    found = []
    for f in files:
        in_code = False
        for no, line in enumerate(open(f, encoding="utf-8"), 1):
            fence = FENCE.match(line)
            if fence:
                if not in_code and not fence.group(1).strip():
                    found.append(f"{f}:{no}: a code block without a language tag")
                in_code = not in_code
                continue
            if in_code:
                continue
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target):
                    continue
                path, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
                if not os.path.exists(dest):
                    found.append(f"{f}:{no}: {target}: no file {dest}")
                elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                    found.append(f"{f}:{no}: {target}: no heading #{anchor} in {dest}")
    return files, found


def selftest():
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "docs"))
        with open(os.path.join(d, "README.md"), "w") as w:
            w.write("# Top\n\n## A `b`, c!\n\n[ok](#a-b-c) [bad](#nope) [f](docs/x.md#x) [g](docs/y.md)\n\n```\nuntagged\n```\n")
        with open(os.path.join(d, "docs", "x.md"), "w") as w:
            w.write("# X\n")
        _, found = faults(d)
    want = ["#nope", "docs/y.md", "language tag"]
    assert len(found) == 3 and all(any(k in f for f in found) for k in want), found
    print("selftest: the three planted faults were found")


if __name__ == "__main__":
    if "--selftest" in sys.argv:
        selftest()
        sys.exit(0)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files, found = faults(root)
    for f in found:
        print(f)
    print(f"{len(files)} files, {len(found)} faults")
    sys.exit(1 if found else 0)
