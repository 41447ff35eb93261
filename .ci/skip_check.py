#!/usr/bin/env python3
"""Fails where a test says "skipped" and then returns as if it had passed.

A test that cannot run must be reported by the test runner as ignored,
with its reason (`#[ignore = "..."]`, or `#[cfg_attr(not(CFG), ignore =
"...")]` with a cfg its build script sets), or fail. A test body (or a
helper it calls) that prints "skipped ..." / "skipping ..." and then
returns, ends, or hands back `None` / `false` / `true` for its caller to
return on, is counted as a pass by the runner: this check lists each such place and
exits 1.

Scope: the files under crates/*/tests/ and the `#[cfg(test)]` part of
the files under crates/*/src/.

    python3 .ci/skip_check.py [ROOT]     # default: the repository root
    python3 .ci/skip_check.py --selftest # shows it fails on offending samples
"""
import re
import sys
from pathlib import Path

PRINT = re.compile(r'\b(?:e?println|e?print)!\(\s*"(?:[^"\\]|\\.)*?\b[Ss]kipp(?:ed|ing)\b')
RETURN = re.compile(r"\breturn\b")
TAIL = re.compile(r"\b(?:None|false|true)\s*$")


def strip_comments(text):
    """The text with // comments blanked (string contents kept)."""
    out = []
    for line in text.split("\n"):
        i, in_str = 0, False
        while i < len(line):
            c = line[i]
            if c == "\\" and in_str:
                i += 2
                continue
            if c == '"':
                in_str = not in_str
            elif not in_str and line.startswith("//", i):
                line = line[:i]
                break
            i += 1
        out.append(line)
    return "\n".join(out)


def rest_of_block(text, pos):
    """The text from `pos`, inside a string literal, to the close of the
    block that holds that literal."""
    depth, i, in_str = 0, pos, True
    while i < len(text):
        c = text[i]
        if in_str:
            if c == "\\":
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c == "{":
            depth += 1
        elif c == "}":
            if depth == 0:
                return text[pos:i]
            depth -= 1
        i += 1
    return text[pos:]


def offences(text, name):
    """(file:line, excerpt) of each print of "skipped" followed by a return."""
    text = strip_comments(text)
    found = []
    for m in PRINT.finditer(text):
        after = rest_of_block(text, m.end())
        # The print's own statement, then what follows it in its block.
        stmt_end = after.find(");")
        follow = after[stmt_end + 2:] if stmt_end >= 0 else ""
        # Nothing after it (the test or helper ends there), a return, or
        # a flag handed back for the caller to return on.
        if not follow.strip() or RETURN.search(follow) or TAIL.search(follow.strip()):
            line = text.count("\n", 0, m.start()) + 1
            found.append((f"{name}:{line}", text[m.start():m.end()].strip()))
    return found


def test_part(path, text):
    """The part of a file that is test code."""
    if "/tests/" in path.as_posix():
        return text
    i = text.find("#[cfg(test)]")
    return "" if i < 0 else "\n" * text.count("\n", 0, i) + text[i:]


def scan(root):
    found = []
    for path in sorted(Path(root).glob("crates/*/**/*.rs")):
        rel = path.relative_to(root)
        if rel.parts[2] not in ("tests", "src"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        found += offences(test_part(rel, text), str(rel))
    return found


SAMPLES_BAD = [
    '''#[test]
fn t() {
    if !have("dtc") {
        eprintln!("skipped: dtc is missing");
        return;
    }
    assert!(true);
}''',
    '''fn kvm_usable() -> bool {
    match reason() {
        None => true,
        Some(r) => {
            println!("skipped: {r}");
            false
        }
    }
}''',
    '''pub fn machine() -> Option<u32> {
    if let Err(why) = available() {
        eprintln!("skipped: {why}");
        return None;
    }
    Some(1)
}''',
    '''#[test]
fn u() {
    let Some(a) = x() else {
        eprintln!("skipping: no assets ({})", "why");
        return;
    };
}''',
]
SAMPLES_BAD += [
    '''#[test]
fn w() {
    if s2mmu::STD {
        eprintln!("skipped: built with std");
    }
}''',
]
SAMPLES_GOOD = [
    '''#[test]
#[cfg_attr(not(s2mmu_dtc), ignore = "needs dtc")]
fn t() {
    assert!(have("dtc"), "the build found dtc, now missing");
}''',
    '''#[test]
fn column() {
    match reason() {
        None => assert!(phase),
        Some(why) => {
            eprintln!("arm64 column skipped: {why}");
            assert!(skipped.is_some());
        }
    }
}''',
    '''#[test]
fn v() {
    // eprintln!("skipped: a comment"); return;
    let s = "skipped: a string"; assert!(!s.is_empty());
}''',
]


def selftest():
    for i, s in enumerate(SAMPLES_BAD):
        if not offences(s, f"bad{i}"):
            sys.exit(f"skip_check selftest: offending sample {i} was not caught:\n{s}")
    for i, s in enumerate(SAMPLES_GOOD):
        got = offences(s, f"good{i}")
        if got:
            sys.exit(f"skip_check selftest: clean sample {i} was flagged: {got}")
    print(f"skip_check selftest: {len(SAMPLES_BAD)} offending samples caught, "
          f"{len(SAMPLES_GOOD)} clean ones passed")


def main():
    if sys.argv[1:] == ["--selftest"]:
        selftest()
        return
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent
    found = scan(root)
    for where, what in found:
        print(f"{where}: returns after printing {what!r}: report it as ignored "
              f"(#[ignore = \"...\"] or a build-script cfg) or fail", file=sys.stderr)
    if found:
        sys.exit(f"skip_check: {len(found)} test(s) count a skip as a pass")
    print("skip_check: no test returns early after printing \"skipped\"")


if __name__ == "__main__":
    main()
