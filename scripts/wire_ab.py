#!/usr/bin/env python3
"""An A/B of two binaries on the wire: alternates
`BIN migrate --guest sim --wire-bench 3 --channels 1 --plot "" --json`
between binary A and binary B, N sittings each (A first, then B, N times),
keeps each sitting's JSON under OUTDIR, and prints per binary and policy
(TLS, no TLS): the median over sittings of each sitting's median round 0
as % of plain TCP, the pooled median round 0 (all runs), the median CPU
a page on the source and the destination, the median downtime, and the
load average at each sitting's start (and the pooled median of guest
memory round 0 moved a second, which differs from the stream's rate when
pages went compressed); then, per policy, p-values of B
against A (a permutation test of the difference of medians, over the
runs) for the source's and destination's CPU a page and round 0's rate.

Usage: scripts/wire_ab.py BIN_A BIN_B N OUTDIR [--summary-only]
(--summary-only reads OUTDIR's JSON again without running anything)."""
import json
import os
import random
import statistics as st
import subprocess
import sys


def sitting(binary, out):
    load = os.getloadavg()[0]
    cmd = [binary, "migrate", "--guest", "sim", "--wire-bench", "3",
           "--channels", "1", "--plot", "", "--json"]
    with open(out, "w") as f:
        subprocess.run(cmd, stdout=f, stderr=subprocess.DEVNULL, check=True)
    with open(out + ".load", "w") as f:
        f.write(f"{load}\n")


def summary(outdir):
    rows = {}
    for name in sorted(os.listdir(outdir)):
        if not name.endswith(".json"):
            continue
        who = name.split("-")[0]
        d = json.load(open(os.path.join(outdir, name)))
        load = float(open(os.path.join(outdir, name + ".load")).read())
        for r in d["results"]:
            k = (who, "TLS" if r["tls"] else "no TLS")
            e = rows.setdefault(k, {"pct": [], "rate": [], "mem": [], "src": [],
                                    "dst": [], "down": [], "load": []})
            e["pct"].append(r["round0_pct_of_plain_tcp"]["median"])
            e["rate"] += r["round0_bytes_per_s"]["each_run"]
            # Guest memory moved a second (the stream's bytes, less what
            # compression saved); builds before it: the stream's rate.
            e["mem"] += r.get("round0_memory_bytes_per_s",
                              r["round0_bytes_per_s"])["each_run"]
            e["src"] += r["source_cpu_ns_per_page"]["each_run"]
            e["dst"] += r["destination_cpu_ns_per_page"]["each_run"]
            e["down"] += r["downtime_ms"]["each_run"]
            e["load"].append(load)
    print("| binary | policy | sittings | % of plain TCP (median of sittings) "
          "| pooled round 0 GB/s | pooled round 0 memory GB/s | source CPU ns/page "
          "| destination CPU ns/page | downtime ms | load (min-max) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (who, pol), e in sorted(rows.items(), key=lambda x: (x[0][1], x[0][0])):
        print(f"| {who} | {pol} | {len(e['pct'])} | {st.median(e['pct']):.1f} "
              f"| {st.median(e['rate']) / 1e9:.3f} | {st.median(e['mem']) / 1e9:.3f} "
              f"| {st.median(e['src']):.0f} "
              f"| {st.median(e['dst']):.0f} | {st.median(e['down']):.1f} "
              f"| {min(e['load']):.1f}-{max(e['load']):.1f} |")
    for pol in ("TLS", "no TLS"):
        a, b = rows.get(("a", pol)), rows.get(("b", pol))
        if a and b:
            ps = ", ".join(f"{k} p={perm_p(a[k], b[k]):.3f}"
                           for k in ("src", "dst", "rate", "mem"))
            print(f"{pol}: B against A over {len(a['src'])}/{len(b['src'])} runs: {ps}")


def perm_p(a, b, n=20000):
    """Two-sided permutation p of the difference of the medians."""
    obs = abs(st.median(a) - st.median(b))
    both, hits = a + b, 0
    rng = random.Random(1)
    for _ in range(n):
        rng.shuffle(both)
        hits += abs(st.median(both[:len(a)]) - st.median(both[len(a):])) >= obs
    return hits / n


def main():
    a, b, n, outdir = sys.argv[1:5]
    if "--summary-only" not in sys.argv:
        os.makedirs(outdir, exist_ok=True)
        for i in range(int(n)):
            for who, binary in (("a", a), ("b", b)):
                sitting(binary, os.path.join(outdir, f"{who}-{i:02}.json"))
                print(f"sitting {i} {who} done", file=sys.stderr, flush=True)
    summary(outdir)


if __name__ == "__main__":
    main()
