//! Memslot ioctl costs on the host's real KVM, with the area split like
//! `memslot_perf_test`.
//!
//! `cargo run --release -p s2mmu-kvm --example kvm_memslot [-- NSLOTS [MIB]]`
//! (defaults: the maximum KVM allows minus the reserved slot 0, and 512 MiB + 4 KiB).

use s2mmu_kvm::dirty_log_perf::fmt_secs;
use s2mmu_kvm::memslot_perf::kvm_memslot_ops;

fn main() {
    let mut args = std::env::args().skip(1);
    let max = s2mmu_kvm::open_kvm().map_or(32764, |k| k.get_nr_memslots() as u32);
    let nslots: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(max - 1);
    let bytes: u64 = args
        .next()
        .and_then(|a| a.parse::<u64>().ok())
        .map_or((512 << 20) + 4096, |mib| mib << 20);
    match kvm_memslot_ops(nslots, bytes) {
        Ok(t) => {
            println!(
                "Memslots: {} of {} pages (+{} in the last), KVM_CAP_NR_MEMSLOTS {}",
                t.nslots,
                t.pages_per_slot,
                t.last_slot_pages - t.pages_per_slot,
                t.max_memslots
            );
            println!("Slot setup time: {}", fmt_secs(t.setup));
            println!(
                "Move one slot: median {} over {} moves",
                fmt_secs(t.move_median),
                t.repetitions
            );
            println!(
                "Delete one slot: median {} over {} deletes",
                fmt_secs(t.delete_median),
                t.repetitions
            );
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
