#!/usr/bin/env bash
# Prepares the Linux guest's assets (crates/s2mmu-arm64/src/linux/assets.rs)
# on a Debian/Ubuntu machine: the cross compiler for the guest programs,
# then Debian's arm64 kernel and busybox-static packages downloaded (never
# installed) into the cache, $S2MMU_LINUX_CACHE or ~/.cache/s2mmu/linux.
# The kernel Image and the initramfs are then unpacked and built by the
# crate on first use (the linux_guest test, or the example below).
# Needs root for apt. Safe to run again: it downloads only what is missing.
set -euo pipefail
cache="${S2MMU_LINUX_CACHE:-$HOME/.cache/s2mmu/linux}"
mkdir -p "$cache"

need=()
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need+=(gcc-aarch64-linux-gnu)
[ -e /usr/aarch64-linux-gnu/include/stdio.h ] || need+=(libc6-dev-arm64-cross)
command -v dpkg-deb >/dev/null 2>&1 || need+=(dpkg)
updated=0
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && updated=1
  apt-get install -y -qq "${need[@]}" >/dev/null
fi

if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  dpkg --add-architecture arm64
  apt-get update -qq && updated=1
fi

have() { compgen -G "$cache/$1" >/dev/null; }
if ! have 'linux-image-6.1.0-*-arm64_*_arm64.deb' || ! have 'busybox-static_*_arm64.deb'; then
  kernel=$(apt-cache depends linux-image-arm64:arm64 2>/dev/null \
    | sed -n 's/^ *Depends: \(linux-image-6\.1\.0-[0-9]*-arm64\)\(:arm64\)\{0,1\}$/\1/p' | head -n1 || true)
  if [ -z "$kernel" ] && [ "$updated" = 0 ]; then
    apt-get update -qq
    kernel=$(apt-cache depends linux-image-arm64:arm64 \
      | sed -n 's/^ *Depends: \(linux-image-6\.1\.0-[0-9]*-arm64\)\(:arm64\)\{0,1\}$/\1/p' | head -n1)
  fi
  [ -n "$kernel" ] || { echo "apt-cache depends linux-image-arm64:arm64 names no 6.1 kernel" >&2; exit 1; }
  (cd "$cache" && apt-get download -qq "$kernel:arm64" busybox-static:arm64)
fi
ls -1 "$cache"/*.deb
