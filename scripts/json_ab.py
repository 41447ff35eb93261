#!/usr/bin/env python3
"""Before/after pair of two benchmark commands that print JSON.

    scripts/json_ab.py -n N --out DIR [--keys REGEX] --a 'CMD A ...' --b 'CMD B ...'

Runs A and B in turn, N times each, in the order A B B A A B ... so that a
drift of the machine's speed falls on both sides alike. Each run's JSON
(`--json` output of an `s2mmu` subcommand) is kept in DIR as a.K.json and
b.K.json. Then every numeric figure the two sides share is printed with its
median on each side, the median of B/A over the runs paired in order, and
the range of those ratios; `--keys` keeps the figures whose path matches
a regular expression; `--rename-a REGEX=REPLACEMENT` moves A's paths where
an older build nests its figures elsewhere. `--summary-only` re-reads DIR instead of running.

A list of objects is keyed by the object's `case` (and `policy`, `mode`,
`run` where present), so "results[iteration 1 dirty memory/fast_path]" names
the same figure in two builds that print their cases in another order.
"""

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys

NAME_FIELDS = ("case", "policy", "mode", "name", "engine")


def flatten(value, path, out):
    """Collects every number below value as path -> float."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        out[path] = float(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            flatten(item, f"{path}.{key}" if path else key, out)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            label = str(index)
            if isinstance(item, dict):
                names = [str(item[f]) for f in NAME_FIELDS if f in item]
                if names:
                    label = "/".join(names)
            flatten(item, f"{path}[{label}]", out)


def run_once(cmd, path, timeout):
    """Runs cmd, keeps its stdout in path, returns the parsed JSON or None."""
    try:
        proc = subprocess.run(
            shlex.split(cmd), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        print(f"timed out after {timeout} s: {cmd}", file=sys.stderr)
        return None
    with open(path, "w") as f:
        f.write(proc.stdout)
    if proc.returncode != 0:
        print(f"exit {proc.returncode}: {cmd}\n{proc.stderr[-2000:]}", file=sys.stderr)
        return None
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as err:
        print(f"not JSON ({err}): {cmd}", file=sys.stderr)
        return None


def load(out_dir, side):
    """Reads back every kept run of one side, in run order."""
    runs = []
    k = 0
    while os.path.exists(os.path.join(out_dir, f"{side}.{k}.json")):
        try:
            with open(os.path.join(out_dir, f"{side}.{k}.json")) as f:
                runs.append(json.load(f))
        except (OSError, json.JSONDecodeError):
            runs.append(None)
        k += 1
    return runs


def renamed(flat, renames):
    """Applies (regex, replacement) pairs to every path of one run."""
    out = {}
    for key, value in flat.items():
        for pattern, repl in renames:
            key = pattern.sub(repl, key)
        out[key] = value
    return out


def summarise(a_runs, b_runs, keys, renames=()):
    """Prints the shared figures: medians, paired ratios B/A."""
    pattern = re.compile(keys) if keys else None
    flat_a = []
    flat_b = []
    for a, b in zip(a_runs, b_runs):
        if a is None or b is None:
            continue
        fa, fb = {}, {}
        flatten(a, "", fa)
        flatten(b, "", fb)
        flat_a.append(renamed(fa, renames))
        flat_b.append(fb)
    print(f"pairs with both runs complete: {len(flat_a)}")
    if not flat_a:
        return
    shared = sorted(set.intersection(*(set(f) for f in flat_a + flat_b)))
    print(f"{'figure':<60} {'median A':>14} {'median B':>14} {'B/A':>7}  B/A range")
    for key in shared:
        if pattern and not pattern.search(key):
            continue
        va = [f[key] for f in flat_a]
        vb = [f[key] for f in flat_b]
        ratios = [b / a for a, b in zip(va, vb) if a != 0]
        ratio = f"{statistics.median(ratios):7.3f}" if ratios else "      -"
        spread = f"{min(ratios):.3f}-{max(ratios):.3f}" if ratios else "-"
        print(
            f"{key[:60]:<60} {statistics.median(va):14.6g} "
            f"{statistics.median(vb):14.6g} {ratio}  {spread}"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", help="command A (the before)")
    parser.add_argument("--b", help="command B (the after)")
    parser.add_argument("-n", type=int, default=3, help="runs of each (1..50)")
    parser.add_argument("--out", required=True, help="folder for each run's JSON")
    parser.add_argument("--keys", help="regular expression: figures to print")
    parser.add_argument("--timeout", type=int, default=900, help="seconds a run")
    parser.add_argument("--summary-only", action="store_true")
    parser.add_argument(
        "--rename-a",
        action="append",
        default=[],
        metavar="REGEX=REPLACEMENT",
        help="rename A's figure paths (an older build that nests them elsewhere)",
    )
    args = parser.parse_args()
    if not 1 <= args.n <= 50:
        parser.error("-n is 1 to 50")
    if not args.summary_only:
        if not args.a or not args.b:
            parser.error("--a and --b are needed unless --summary-only")
        os.makedirs(args.out, exist_ok=True)
        for k in range(args.n):
            order = ("a", "b") if k % 2 == 0 else ("b", "a")
            for side in order:
                cmd = args.a if side == "a" else args.b
                print(f"run {k + 1}/{args.n} {side.upper()}", file=sys.stderr)
                run_once(cmd, os.path.join(args.out, f"{side}.{k}.json"), args.timeout)
    renames = []
    for rule in args.rename_a:
        if "=" not in rule:
            parser.error(f"--rename-a needs REGEX=REPLACEMENT, got {rule!r}")
        regex, repl = rule.split("=", 1)
        renames.append((re.compile(regex), repl))
    summarise(load(args.out, "a"), load(args.out, "b"), args.keys, renames)


if __name__ == "__main__":
    main()
