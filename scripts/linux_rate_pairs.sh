#!/usr/bin/env bash
# Issue 24's pages-per-second comparison: N interleaved pairs of the
# simulated guest and the Linux `fill` guest (round 0 of data pages), both
# migrated over the same link (loopback, mutual TLS 1.3, 1 channel, 1 GiB,
# 1 vCPU; both told --channels 1: the default is one per CPU, and the
# Linux guest takes --channels too), then a table of both pages/s, their
# ratio and the Linux round 0 against plain TCP between the same endpoints (the probe the simulated
# guest's run makes just before its migration).
#
#   scripts/linux_rate_pairs.sh [N]          (default 5 pairs)
#   S2MMU_BIN=path/to/s2mmu scripts/linux_rate_pairs.sh 5
#
# Needs the release binary (cargo build --release -p s2mmu-cli), QEMU's
# arm64 model and the Linux assets (scripts/linux-assets.sh). The figures
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
  "$bin" migrate --guest sim "${common[@]}" --plot "" > "$dir/sim$i.json"
  "$bin" migrate --guest linux --linux-run fill "${common[@]}" > "$dir/linux$i.json"
  echo "pair $i of $pairs done" >&2
done
python3 - "$dir" "$pairs" <<'EOF'
import json, statistics, sys
d, n = sys.argv[1], int(sys.argv[2])
RECORD = 4112  # bytes a data-page record takes on the stream
rows = []
for i in range(1, n + 1):
    s = json.load(open(f"{d}/sim{i}.json"))["results"][0]
    l = json.load(open(f"{d}/linux{i}.json"))["per_run"][0]["details"]
    if l["channels"] != 1:
        sys.exit(f"pair {i}: the Linux session used {l['channels']} channels, not 1")
    sim = s["round0_bytes_per_s"] / RECORD
    plain = s["plain_tcp"]["plain_tcp_bytes_per_s"]
    rows.append((sim, l["round0_bytes_per_s"], l["round0_data_pages_per_s"], plain))
print(f"{'pair':>4} {'sim pages/s':>12} {'linux data pages/s':>19} {'ratio':>6} "
      f"{'plain TCP MiB/s':>16} {'linux round0 MiB/s':>19} {'% of plain':>10}")
ratios, pcts = [], []
for i, (sim, lbytes, ldata, plain) in enumerate(rows, 1):
    r, p = ldata / sim, 100 * lbytes / plain
    ratios.append(r); pcts.append(p)
    print(f"{i:>4} {sim:>12,.0f} {ldata:>19,.0f} {r:>5.2f}x "
          f"{plain / 2**20:>16,.0f} {lbytes / 2**20:>19,.0f} {p:>9.0f}%")
med = statistics.median
print(f"median {med(r[0] for r in rows):>10,.0f} {med(r[2] for r in rows):>19,.0f} "
      f"{med(ratios):>5.2f}x {med(r[3] for r in rows) / 2**20:>16,.0f} "
      f"{med(r[1] for r in rows) / 2**20:>19,.0f} {med(pcts):>9.0f}%")
EOF
