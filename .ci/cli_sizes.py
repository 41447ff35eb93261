#!/usr/bin/env python3
"""The size rules: lists every .rs file under DIR (or
the one file DIR names) over MAX_FILE lines and every function over MAX_FN
lines (signature to closing brace, as rustfmt lays them out), and exits 1
when there is any. .ci/run runs it over every crate at 600/80.
Usage: .ci/cli_sizes.py [DIR|FILE] [MAX_FILE] [MAX_FN]
(defaults: crates/s2mmu-cli/src 600 100, the CLI's own rule)"""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "crates/s2mmu-cli/src"
max_file = int(sys.argv[2]) if len(sys.argv) > 2 else 600
max_fn = int(sys.argv[3]) if len(sys.argv) > 3 else 100
fn_re = re.compile(r"^(\s*)(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)")
bad = 0
# One file (a build script) or a directory tree.
walk = [(os.path.dirname(root), [], [os.path.basename(root)])] if os.path.isfile(root) else os.walk(root)
for d, _, files in walk:
    for f in sorted(files):
        if not f.endswith(".rs"):
            continue
        p = os.path.join(d, f)
        lines = open(p, encoding="utf-8").read().split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        if len(lines) > max_file:
            print(f"{p}: {len(lines)} lines (over {max_file})")
            bad += 1
        for i, l in enumerate(lines):
            m = fn_re.match(l)
            if not m:
                continue
            indent = m.group(1)
            for j in range(i, len(lines)):
                if lines[j].rstrip().endswith(";") and j == i:
                    break  # a declaration without a body
                if lines[j] == indent + "}":
                    n = j - i + 1
                    if n > max_fn:
                        print(f"{p}:{i + 1}: fn {m.group(7)}: {n} lines (over {max_fn})")
                        bad += 1
                    break
sys.exit(1 if bad else 0)
