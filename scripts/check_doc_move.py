#!/usr/bin/env python3
"""Checks that moving README.md's text into docs/ lost nothing.

Compares README.md as it was at a git revision (OLD, e.g. 947024c, the last
revision with the whole 2,704-line README) with README.md and docs/**/*.md
as they are now:
- text: every run of 6 words inside one paragraph, table row, heading or
  code line of the old README must occur in the new files (punctuation at
  a word's ends, table bars, list markers and links added around words are
  ignored, so a table row split into a list still matches; whitespace and
  line breaks never count). A run that crosses a place where a paragraph
  was cut in two is reported too: read those by hand;
- figures: every number of the old README must occur at least as often in
  the new files.
Prints the old lines that start an uncovered run (with -v, the run), and
the numbers that occur fewer times; exit status 1 if any.

Usage: python3 scripts/check_doc_move.py OLD [-v]
"""
import collections
import glob
import os
import re
import subprocess
import sys

RUN = 6
NUMBER = r"\d[\d,.]*\d|\d"


def words(text):
    text = re.sub(r"\]\([^)]*\)", "", text).replace("[", "")
    text = text.replace("|", " ")
    text = re.sub(r"^\s*(#+|[-*]|\d+\.)\s", " ", text, flags=re.M)
    return [w.strip("():;,.") for w in text.split() if w.strip("():;,.")]


def units(text):
    """Paragraphs, with each table row, heading and code line a unit of its own."""
    out, cur = [], []
    for no, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            if cur:
                out.append(cur)
            cur = []
        elif line.lstrip().startswith(("|", "#", "```")):
            if cur:
                out.append(cur)
            cur = []
            out.append([(no, line)])
        else:
            cur.append((no, line))
    if cur:
        out.append(cur)
    return out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    if len(args) != 1:
        sys.exit(__doc__)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    old = subprocess.run(["git", "-C", root, "show", args[0] + ":README.md"],
                         capture_output=True, text=True, check=True).stdout
    files = [os.path.join(root, "README.md")]
    files += sorted(glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True))
    new = "\n".join(open(f, encoding="utf-8").read() for f in files)
    nw = words(new)
    have = {tuple(nw[i:i + RUN]) for i in range(len(nw) - RUN + 1)}
    joined = " ".join(nw)
    old_lines = old.split("\n")
    uncovered = {}
    for unit in units(old):
        ws, at = [], []
        for no, line in unit:
            w = words(line)
            ws += w
            at += [no] * len(w)
        if len(ws) < RUN:
            if ws and " ".join(ws) not in joined:
                uncovered.setdefault(at[0], " ".join(ws))
            continue
        for i in range(len(ws) - RUN + 1):
            if tuple(ws[i:i + RUN]) not in have:
                uncovered.setdefault(at[i], " ".join(ws[i:i + RUN]))
    for no in sorted(uncovered):
        print(f"{no}: {old_lines[no - 1][:100]}")
        if "-v" in sys.argv:
            print(f"    uncovered: {uncovered[no]}")
    before = collections.Counter(re.findall(NUMBER, old))
    after = collections.Counter(re.findall(NUMBER, new))
    fewer = {n: (c, after[n]) for n, c in before.items() if after[n] < c}
    print(f"{len(old_lines)} old lines; {len(uncovered)} start a {RUN}-word run not found; "
          f"{sum(before.values())} numbers, {len(fewer)} occurring fewer times now: {fewer}")
    sys.exit(1 if uncovered or fewer else 0)


if __name__ == "__main__":
    main()
