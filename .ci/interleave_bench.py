#!/usr/bin/env python3
"""Runs each benchmark command with two binaries alternately (A B B A ...),
N runs each, and reports per result row the median over runs of each
binary and the ratio B/A (a row with no time: each of its counts); then the
geometric mean of the ratios per command. Timings only: nothing is asserted.
Its before/after tables are in docs/measurements/benchmarks.md (two release binaries of
s2mmu, same sitting).
Usage: .ci/interleave_bench.py A B N OUT.json"""
import json, subprocess, sys, statistics, math
A, B, N, OUT = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
CMDS = [
    "memslot-perf -s 10 -l 0.5 -r 1 -q",
    "dirty-log-perf -b 64M -i 2",
    "split-perf --size 1G --runs 3",
    "tlb-perf --size 4G --runs 3",
    "harvest-perf --size 4G --runs 3",
    "dirty-views --mem 64M --ticks 10",
]
def rows(binary, cmd):
    out = subprocess.run([binary] + cmd.split() + ["--json"], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"{binary} {cmd}: exit {out.returncode}: {out.stderr[-500:]}")
    d = json.loads(out.stdout)
    got = {}
    for r in d.get("results", []):
        v = r.get("value_ns", r.get("median_ns"))
        if isinstance(v, (int, float)) and v > 0:
            got[(r.get("case"), r.get("policy"), "ns")] = v
        elif v is None:
            # A benchmark that reports counts only (dirty-views): its counts.
            for f, c in r.items():
                if isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0:
                    got[(r.get("case"), r.get("policy"), f)] = c
    return got
samples = {cmd: {A: [], B: []} for cmd in CMDS}
for i in range(N):
    order = (A, B) if i % 2 == 0 else (B, A)
    for cmd in CMDS:
        for b in order:
            samples[cmd][b].append(rows(b, cmd))
    print(f"round {i + 1} of {N} done", file=sys.stderr, flush=True)
report = {}
for cmd in CMDS:
    keys = set.intersection(*(set(r) for b in (A, B) for r in samples[cmd][b]))
    table = []
    for k in sorted(keys, key=str):
        ma = statistics.median(r[k] for r in samples[cmd][A])
        mb = statistics.median(r[k] for r in samples[cmd][B])
        table.append({"case": k[0], "policy": k[1], "field": k[2], "a_median": ma, "b_median": mb, "ratio": mb / ma})
    geo = math.exp(statistics.mean(math.log(t["ratio"]) for t in table)) if table else None
    report[cmd] = {"rows": table, "geomean_ratio": geo}
    print(f"{cmd}: {len(table)} rows, geomean B/A {geo:.3f}", flush=True)
json.dump({"samples": {c: {b: [{"|".join(map(str, k)): v for k, v in r.items()} for r in samples[c][b]] for b in (A, B)} for c in CMDS}, "a": A, "b": B, "runs_each": N, "commands": report}, open(OUT, "w"), indent=1)
