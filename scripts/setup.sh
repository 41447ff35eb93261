#!/usr/bin/env bash
# Prepares a Debian machine (12 or 13) for everything s2mmu runs: the Linux
# guest (`s2mmu migrate`, `s2mmu linux`), the tests and the benchmarks.
#
#   scripts/setup.sh            as root, or as a user with sudo (it asks)
#
# It installs, with apt:
#   qemu-system-arm                  QEMU's arm64 model (qemu-system-aarch64)
#   binutils-aarch64-linux-gnu       assembles the EL2 stub (at build time)
#   gcc-aarch64-linux-gnu,
#   libc6-dev-arm64-cross            compile the guest's programs
#   device-tree-compiler             dtc: the device-tree check
#   iperf3, iproute2, nftables       the wire's reference, network namespaces
# and downloads (never installs) Debian's arm64 kernel, whatever
# `linux-image-arm64` depends on (Debian 12: 6.1, Debian 13: 6.12), and
# busybox-static into the cache: $S2MMU_LINUX_CACHE, else
# ~/.cache/s2mmu/linux of the user who ran it (under sudo: $SUDO_USER's).
# The kernel Image and the initramfs are unpacked and built from them on
# first use. Where rustup is there it adds, for that user, the
# aarch64-unknown-none target and nightly with miri and rust-src.
#
# QEMU versions known to work: 7.2 (Debian 12's 1:7.2+dfsg). Others may
# work; the tests say what failed.
#
# Safe to run again: it installs and downloads only what is missing, and
# says what it did.
set -euo pipefail

if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    echo "setup: not root; running again through sudo" >&2
    exec sudo --preserve-env=S2MMU_LINUX_CACHE "$0" "$@"
  fi
  echo "setup: needs root (apt-get) and there is no sudo: run it as root" >&2
  exit 1
fi
command -v apt-get >/dev/null 2>&1 || {
  echo "setup: needs apt-get (Debian 12 or 13; on Ubuntu the arm64 packages live elsewhere); install the tools listed in $0 by hand" >&2
  exit 1
}
export DEBIAN_FRONTEND=noninteractive

# The user the cache and rustup belong to: the one who called sudo.
user="${SUDO_USER:-root}"
home=$(getent passwd "$user" | cut -d: -f6)
home="${home:-$HOME}"
cache="${S2MMU_LINUX_CACHE:-$home/.cache/s2mmu/linux}"
as_user() { if [ "$user" = root ]; then "$@"; else runuser -u "$user" -- env HOME="$home" "$@"; fi; }

did=()
updated=0
apt_update() { if [ "$updated" = 0 ]; then apt-get update -qq; updated=1; fi; }

# package: the file or command that shows it is installed.
packages=(
  "qemu-system-arm:qemu-system-aarch64"
  "binutils-aarch64-linux-gnu:aarch64-linux-gnu-as"
  "gcc-aarch64-linux-gnu:aarch64-linux-gnu-gcc"
  "libc6-dev-arm64-cross:/usr/aarch64-linux-gnu/include/stdio.h"
  "device-tree-compiler:dtc"
  "iperf3:iperf3"
  "iproute2:ip"
  "nftables:nft"
  "dpkg:dpkg-deb"
)
need=()
for p in "${packages[@]}"; do
  pkg="${p%%:*}" probe="${p#*:}"
  case "$probe" in
    /*) [ -e "$probe" ] || need+=("$pkg") ;;
    *) command -v "$probe" >/dev/null 2>&1 || need+=("$pkg") ;;
  esac
done
if [ ${#need[@]} -gt 0 ]; then
  apt_update
  apt-get install -y -qq "${need[@]}" >/dev/null
  did+=("installed ${need[*]}")
fi

qemu=$(qemu-system-aarch64 --version | sed -n '1s/^QEMU emulator version \([0-9.]*\).*/\1/p')
case "$qemu" in
  7.2|7.2.*) ;;
  *) echo "setup: QEMU $qemu: the versions known to work are 7.2.x; the tests say what fails" >&2 ;;
esac

# Debian's arm64 packages are downloaded, not installed: apt needs the
# architecture to know them.
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  dpkg --add-architecture arm64
  updated=0
  apt_update
  did+=("added the arm64 architecture to dpkg (for downloads only)")
fi

# Made by the user where it can, so that ~/.cache stays theirs.
as_user mkdir -p "$cache" 2>/dev/null || mkdir -p "$cache"
have() { compgen -G "$cache/$1" >/dev/null; }
kernel_of() {
  # The plain flavour's package: linux-image-6.1.0-NN-arm64 (Debian 12),
  # linux-image-6.12.NN+debNN-arm64 (Debian 13).
  apt-cache depends linux-image-arm64:arm64 2>/dev/null \
    | sed -n 's/^ *Depends: \(linux-image-[0-9][0-9a-z.+~]*\(-[0-9]*\)\{0,1\}-arm64\)\(:arm64\)\{0,1\}$/\1/p' \
    | head -n1 || true
}
kernel=$(kernel_of)
if [ -z "$kernel" ]; then apt_update; kernel=$(kernel_of); fi
[ -n "$kernel" ] || { echo "setup: apt-cache depends linux-image-arm64:arm64 names no arm64 kernel" >&2; exit 1; }
get=()
have "${kernel}_*_arm64.deb" || get+=("$kernel:arm64")
have 'busybox-static_*_arm64.deb' || get+=(busybox-static:arm64)
if [ ${#get[@]} -gt 0 ]; then
  (cd "$cache" && apt-get download -qq "${get[@]}")
  did+=("downloaded ${get[*]} into $cache")
fi
# The user's cache, not root's: the crate unpacks and builds in it.
if [ "$user" != root ]; then chown "$user": "$cache" "$cache"/*.deb; fi

if as_user bash -lc 'command -v rustup' >/dev/null 2>&1; then
  # Neither is needed by the main job or the README's tests: a failure
  # (no network to rustup's server) is reported, not fatal.
  if ! as_user bash -lc 'rustup target list --installed' | grep -qx aarch64-unknown-none; then
    if as_user bash -lc 'rustup target add aarch64-unknown-none' >/dev/null; then
      did+=("added the aarch64-unknown-none target")
    else
      echo "setup: rustup target add aarch64-unknown-none failed (left out)" >&2
    fi
  fi
  if ! as_user bash -lc 'rustup run nightly cargo miri --version' >/dev/null 2>&1; then
    if as_user bash -lc 'rustup toolchain install nightly --profile minimal -c miri -c rust-src' >/dev/null; then
      did+=("installed nightly with miri and rust-src")
    else
      echo "setup: rustup could not install nightly with miri and rust-src (left out)" >&2
    fi
  fi
else
  echo "setup: no rustup for $user: the aarch64-unknown-none target and nightly (miri) are left out" >&2
fi

echo "setup: QEMU $qemu ($(command -v qemu-system-aarch64)); kernel package $kernel"
echo "setup: cache $cache:"
ls -1 "$cache"/*.deb | sed 's/^/  /'
if [ ${#did[@]} -eq 0 ]; then
  echo "setup: nothing to do, everything was there"
else
  printf 'setup: %s\n' "${did[@]}"
fi
echo "setup: next: cargo run --release -p s2mmu-cli -- migrate"
