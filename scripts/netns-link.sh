#!/usr/bin/env bash
# Two hosts on one machine: two network namespaces joined by a veth pair,
# the link between them shaped, cut and restored. Root only (it says so).
#
#   scripts/netns-link.sh up [NAME]            make NAME-s (source) and NAME-d (destination)
#   scripts/netns-link.sh shape [NAME] [--rate RATE] [--loss PCT] [--rtt MS]
#   scripts/netns-link.sh cut [NAME]           drop every packet both ways
#   scripts/netns-link.sh restore [NAME]       undo cut
#   scripts/netns-link.sh status [NAME]        addresses, qdiscs, nft rules
#   scripts/netns-link.sh down [NAME]          remove both namespaces (and the pair)
#
# NAME defaults to s2mmu. The source namespace holds SRC_IP, the
# destination DEST_IP (10.213.x.0/24, x from NAME): the addresses exist only
# on the veth inside these namespaces, and nothing is routed anywhere else.
#
# Shaping, on each end of the veth (each direction):
#   --rate RATE   bandwidth with tbf (e.g. 1gbit, 10gbit, 100mbit);
#   --loss PCT    random drops by nft (numgen random mod 10000 < PCT*100)
#                 on input inside each namespace;
#   --rtt MS      latency with netem (delay MS/2 a direction) where the
#                 kernel has it. Where it does not, `shape` says so and
#                 exits 3: the caller then puts scripts/netns_delay_relay.py
#                 between the namespaces instead (it holds each direction's
#                 bytes for half the RTT), and its figures say which one.
# `shape` without options removes the shaping. It prints the latency
# mechanism it used on its last line: "latency: netem", "latency: none".
set -euo pipefail

die() { echo "netns-link: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (it makes network namespaces and shapes their link)"
command -v ip >/dev/null || die "ip (iproute2) not found"

cmd=${1:-}; shift || true
name=s2mmu
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then name=$1; shift; fi
case "$name" in
  *[!A-Za-z0-9-]*|'') die "NAME: letters, digits and '-' only";;
esac
[ ${#name} -le 10 ] || die "NAME: at most 10 characters (interface names are short)"
src="$name-s"; dst="$name-d"
vs="$name-vs"; vd="$name-vd"
# A subnet of 10.213.0.0/16 per NAME (its checksum), inside these namespaces only.
net=$(( $(printf '%s' "$name" | cksum | cut -d' ' -f1) % 250 + 1 ))
SRC_IP="10.213.$net.2"; DEST_IP="10.213.$net.1"

in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

up() {
  ip netns add "$src"
  ip netns add "$dst"
  ip link add "$vs" netns "$src" type veth peer name "$vd" netns "$dst"
  ip -n "$src" addr add "$SRC_IP/24" dev "$vs"
  ip -n "$dst" addr add "$DEST_IP/24" dev "$vd"
  for pair in "$src:$vs" "$dst:$vd"; do
    ip -n "${pair%%:*}" link set lo up
    ip -n "${pair%%:*}" link set "${pair#*:}" up
  done
  echo "up: $src ($SRC_IP) <-> $dst ($DEST_IP)"
}

down() {
  # Deleting a namespace deletes its end of the veth pair, and the pair.
  ip netns del "$src" 2>/dev/null || true
  ip netns del "$dst" 2>/dev/null || true
  echo "down: $src, $dst"
}

# The nft table of a namespace: drops by chance (loss) and all (cut).
nft_reset() {
  local ns=$1
  in_ns "$ns" nft delete table inet s2mmu_link 2>/dev/null || true
}

nft_rule() {
  local ns=$1 rule=$2
  command -v nft >/dev/null || die "nft (nftables) not found"
  in_ns "$ns" nft add table inet s2mmu_link 2>/dev/null || true
  in_ns "$ns" nft add chain inet s2mmu_link input '{ type filter hook input priority 0; policy accept; }' 2>/dev/null || true
  in_ns "$ns" nft add rule inet s2mmu_link input $rule
}

shape() {
  local rate="" loss="" rtt=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --rate) rate=$2; shift 2;;
      --loss) loss=$2; shift 2;;
      --rtt) rtt=$2; shift 2;;
      *) die "shape: unknown option $1";;
    esac
  done
  local latency=none
  for pair in "$src:$vs" "$dst:$vd"; do
    local ns=${pair%%:*} dev=${pair#*:}
    tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null || true
    nft_reset "$ns"
    if [ -n "$rtt" ] && [ "$rtt" != 0 ]; then
      local half
      half=$(awk -v r="$rtt" 'BEGIN { printf "%.3fms", r / 2 }')
      if tc -n "$ns" qdisc add dev "$dev" root handle 1: netem delay "$half" limit 100000 2>/dev/null; then
        latency=netem
        [ -z "$rate" ] || tc -n "$ns" qdisc add dev "$dev" parent 1: handle 2: tbf rate "$rate" burst 1mbit latency 50ms
      else
        echo "shape: this kernel has no netem: put scripts/netns_delay_relay.py between the namespaces for --rtt $rtt" >&2
        latency=relay-needed
      fi
    fi
    if [ "$latency" != netem ] && [ -n "$rate" ]; then
      tc -n "$ns" qdisc replace dev "$dev" root handle 1: tbf rate "$rate" burst 1mbit latency 50ms
    fi
    if [ -n "$loss" ] && [ "$loss" != 0 ]; then
      local per10k
      per10k=$(awk -v l="$loss" 'BEGIN { printf "%d", l * 100 }')
      nft_rule "$ns" "iifname \"$dev\" numgen random mod 10000 < $per10k counter drop"
    fi
  done
  echo "shape: rate ${rate:-unlimited}, loss ${loss:-0} %, rtt ${rtt:-0} ms"
  echo "latency: $latency"
  [ "$latency" != relay-needed ] || exit 3
}

cut_link() {
  for pair in "$src:$vs" "$dst:$vd"; do
    nft_rule "${pair%%:*}" "iifname \"${pair#*:}\" drop comment \"cut\""
  done
  echo "cut: $src <-/-> $dst"
}

restore_link() {
  for pair in "$src:$vs" "$dst:$vd"; do
    local ns=${pair%%:*}
    local handles
    handles=$(in_ns "$ns" nft -a list chain inet s2mmu_link input 2>/dev/null \
      | awk '/comment "cut"/ { print $NF }')
    for h in $handles; do in_ns "$ns" nft delete rule inet s2mmu_link input handle "$h"; done
  done
  echo "restored: $src <-> $dst"
}

status() {
  for pair in "$src:$vs" "$dst:$vd"; do
    local ns=${pair%%:*} dev=${pair#*:}
    echo "== $ns"
    ip -n "$ns" -brief addr show dev "$dev"
    tc -n "$ns" qdisc show dev "$dev"
    in_ns "$ns" nft list table inet s2mmu_link 2>/dev/null || true
  done
}

case "$cmd" in
  up) up;;
  down) down;;
  shape) shape "$@";;
  cut) cut_link;;
  restore) restore_link;;
  status) status;;
  addr) echo "$SRC_IP $DEST_IP";;
  *) die "usage: $0 up|shape|cut|restore|status|addr|down [NAME] [--rate R] [--loss PCT] [--rtt MS]";;
esac
