#!/usr/bin/env bash
# Run by hand (not by .ci/run): the fault path's instruction count in the
# product build, to show what the break-before-make monitor's trace points
# cost with the `bbm-trace` feature off. Builds a small program against the
# engine as a path dependency with default features (outside the workspace,
# so no dev-dependency turns the monitor on), runs it under callgrind with
# collection on inside Mmu::handle_fault only, and prints the count.
# Usage: [FEATURES=a,b] .ci/fault_path_ir.sh [ENGINE_DIR]  (default: this
# checkout's crates/s2mmu; FEATURES adds engine features to the defaults,
# e.g. FEATURES=test-hooks to count what the test hooks would cost).
# Compare two revisions by extracting the other one (git archive) and
# passing its crates/s2mmu. Needs valgrind.
set -euo pipefail
engine="$(cd "${1:-$(dirname "$0")/../crates/s2mmu}" && pwd)"
features=""
if [ -n "${FEATURES:-}" ]; then features="\"${FEATURES//,/\",\"}\""; fi
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/src"
cat > "$dir/Cargo.toml" <<TOML
[package]
name = "fault-path-ir"
version = "0.0.0"
edition = "2021"
[dependencies]
s2mmu = { path = "$engine", features = [$features] }
[profile.release]
debug = 1
[workspace]
TOML
cat > "$dir/src/main.rs" <<'RS'
// 16384 first-touch write faults (4K leaves), then logging on and a write
// fault on each page again (relaxing the write protection, marking the
// bitmap), then one GET.
use s2mmu::format::arm64::{Arm64Stage2, Granule};
use s2mmu::memslot::{SlotFlags, TreeMemslots, UserMemoryRegion};
use s2mmu::mmu::{Mmu, MmuPolicy};
use s2mmu::{Gpa, HostMmOps, Hva, NoTlb};
use std::sync::Arc;
fn main() {
    let pages: u64 = 16384;
    let guest = vec![0u8; (pages as usize + 1) * 4096];
    let hva = (guest.as_ptr() as u64 + 4095) & !4095;
    let fmt = Arm64Stage2::new(Granule::K4, 40).unwrap();
    let mm = HostMmOps::new(4096).unwrap();
    let policy = MmuPolicy::default();
    let mmu = Mmu::new(fmt, mm, Arc::new(NoTlb), TreeMemslots::new(), policy).unwrap();
    let base = 1u64 << 30;
    let slot = UserMemoryRegion::new(0, SlotFlags::NONE, Gpa::new(base), pages * 4096, Hva::new(hva));
    mmu.set_memory_region(&slot, 4096).unwrap();
    let mut vcpu = mmu.new_vcpu().unwrap();
    for p in 0..pages {
        mmu.handle_fault(&mut vcpu, Gpa::new(base + p * 4096), true).unwrap();
    }
    mmu.enable_dirty_logging(0).unwrap();
    for p in 0..pages {
        mmu.handle_fault(&mut vcpu, Gpa::new(base + p * 4096), true).unwrap();
    }
    let mut bm = vec![0u64; (pages / 64) as usize];
    assert_eq!(mmu.get_dirty_log(0, &mut bm).unwrap(), pages);
    println!("faults {}", 2 * pages);
}
RS
(cd "$dir" && cargo build --release -q)
valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" \
  --toggle-collect='*handle_fault*' "$dir/target/release/fault-path-ir" 2>&1 |
  grep -E 'faults|Collected'
