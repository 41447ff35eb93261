#!/usr/bin/env bash
# The Linux migration's pages-per-second comparison: N interleaved pairs of the
# simulated guest and the Linux `fill` guest (round 0 of data pages), both
# migrated over the same link (loopback, mutual TLS 1.3, 1 channel, 1 GiB,
# 1 vCPU; both told --channels 1: the default is one per CPU, and the
# Linux guest takes --channels too), then a table of both pages/s, their
# ratio and the Linux round 0 against plain TCP between the same endpoints (the probe the simulated
# guest's run makes just before its migration).
#
#   scripts/linux_rate_pairs.sh [N]          (default 5 pairs)
#   S2MMU_BIN=path/to/s2mmu scripts/linux_rate_pairs.sh 5
#   SIM_ARGS="-s anonymous" scripts/linux_rate_pairs.sh 5
#   LINUX_ARGS="--linux-ram shm" scripts/linux_rate_pairs.sh 5
#
# SIM_ARGS: more options for the simulated guest's runs only; LINUX_ARGS:
# for the Linux guest's runs only. The simulated guest's memory is
# anonymous THP by default (2 MiB host pages); QEMU's guest RAM is a shared
# file on a private huge tmpfs (2 MiB pages) where the process may mount
# one (root), else in /dev/shm (4 KiB pages where shmem THP is off: see
# /sys/kernel/mm/transparent_hugepage/shmem_enabled). `-s anonymous` gives
# the simulated guest 4 KiB pages, `--linux-ram shm` the Linux guest
# /dev/shm's; the header says which the runs had. The table's last columns say what
# else differs: the share of zero pages in round 0 (the Linux `fill` guest
# leaves free memory zero; the simulated guest has none) and the Linux
# rate counted over every page, zero pages included (an upper bound: a
# zero page is read and checked but its 4 KiB are not sent).
#
# Needs the release binary (cargo build --release -p s2mmu-cli), QEMU's
# arm64 model and the Linux assets (scripts/setup.sh). The figures
# are the machine's: run it on a quiet one, and say how many pairs.
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=${1:-5}
case $pairs in
  '' | *[!0-9]*) echo "pairs must be a whole number, got '$pairs'" >&2; exit 2 ;;
esac
if [ "$pairs" -lt 1 ] || [ "$pairs" -gt 100 ]; then
  echo "pairs must be 1..=100, got $pairs" >&2
  exit 2
fi
bin=${S2MMU_BIN:-target/release/s2mmu}
[ -x "$bin" ] || { echo "no $bin: cargo build --release -p s2mmu-cli" >&2; exit 2; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--mem 1G -v 1 --channels 1 --io-timeout 60s --json -q)
for i in $(seq 1 "$pairs"); do
  # shellcheck disable=SC2086 # SIM_ARGS is split into options on purpose
  "$bin" migrate --guest sim "${common[@]}" --link-probe --plot "" ${SIM_ARGS:-} > "$dir/sim$i.json"
  # shellcheck disable=SC2086 # LINUX_ARGS is split into options on purpose
  "$bin" migrate --guest linux --linux-run fill "${common[@]}" ${LINUX_ARGS:-} > "$dir/linux$i.json"
  echo "pair $i of $pairs done" >&2
done
python3 - "$dir" "$pairs" "${SIM_ARGS:-}" <<'EOF'
import json, statistics, sys
d, n, sim_args = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rams = set()
RECORD = 4112  # bytes a data-page record takes on the stream
rows = []
for i in range(1, n + 1):
    sj = json.load(open(f"{d}/sim{i}.json"))
    s, sp = sj["results"][0], sj["params"]
    lrun = next(r for r in json.load(open(f"{d}/linux{i}.json"))["results"] if r["case"] == "run 1")
    l = lrun["details"]
    rams.add(f"A's {lrun['ram_a']}, B's {lrun['ram_b']}")
    if l["channels"] != 1 or s["channels"] != 1:
        sys.exit(f"pair {i}: {l['channels']} (Linux) and {s['channels']} (sim) channels, not 1")
    if sp["mem_bytes"] != l["round0_pages"] * 4096 or sp["no_tls"] or sp["psk"]:
        sys.exit(f"pair {i}: not the same memory size, or the sim ran without mutual TLS")
    if not l["security"].startswith("mutual TLS"):
        sys.exit(f"pair {i}: the Linux session ran with {l['security']}")
    sim = s["round0_bytes_per_s"] / RECORD
    plain = s["plain_tcp"]["plain_tcp_bytes_per_s"]
    ldata = l["round0_data_pages_per_s"]
    lzero = l["round0_zero_pages"] / l["round0_pages"]
    szero = s["zero_pages"] / s["pages"]
    rows.append((sim, l["round0_bytes_per_s"], ldata, plain, szero, lzero, ldata / (1 - lzero)))
print(f"sim guest: {sp['backing']} memory{', extra options ' + sim_args if sim_args else ''}; "
      f"Linux guest's RAM: {'; '.join(sorted(rams))}")
print(f"{'pair':>4} {'sim pages/s':>12} {'linux data pages/s':>19} {'ratio':>6} "
      f"{'plain TCP MiB/s':>16} {'linux round0 MiB/s':>19} {'% of plain':>10} "
      f"{'sim zero':>8} {'linux zero':>10} {'linux all pages/s':>18} {'ratio':>6}")
ratios, pcts, alls = [], [], []
for i, (sim, lbytes, ldata, plain, sz, lz, lall) in enumerate(rows, 1):
    r, p, a = ldata / sim, 100 * lbytes / plain, lall / sim
    ratios.append(r); pcts.append(p); alls.append(a)
    print(f"{i:>4} {sim:>12,.0f} {ldata:>19,.0f} {r:>5.2f}x "
          f"{plain / 2**20:>16,.0f} {lbytes / 2**20:>19,.0f} {p:>9.0f}% "
          f"{100 * sz:>7.1f}% {100 * lz:>9.1f}% {lall:>18,.0f} {a:>5.2f}x")
med = statistics.median
print(f"median {med(r[0] for r in rows):>10,.0f} {med(r[2] for r in rows):>19,.0f} "
      f"{med(ratios):>5.2f}x {med(r[3] for r in rows) / 2**20:>16,.0f} "
      f"{med(r[1] for r in rows) / 2**20:>19,.0f} {med(pcts):>9.0f}% "
      f"{100 * med(r[4] for r in rows):>7.1f}% {100 * med(r[5] for r in rows):>9.1f}% "
      f"{med(r[6] for r in rows):>18,.0f} {med(alls):>5.2f}x")
EOF
