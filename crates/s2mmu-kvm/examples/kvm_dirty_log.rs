//! The 1-vCPU, 256 MiB dirty-log pass on the host's real KVM, printed like
//! `dirty_log_perf_test`, with the exits of each pass, in three modes: manual protect
//! (get + clear), no manual protect (`-g`), and the dirty ring.
//!
//! `cargo run --release -p s2mmu-kvm --example kvm_dirty_log [-- MIB [ITERATIONS [VCPUS [BACKING]]]]`
//!
//! BACKING is a selftest name: anonymous (default), anonymous_thp, anonymous_hugetlb_2mb,
//! anonymous_hugetlb_1gb.

use s2mmu_kvm::dirty_log_perf::{self, DirtyLogParams};
use s2mmu_kvm::host::HostInfo;
use s2mmu_kvm::{Backing, Error};

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(256);
    let iterations: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let vcpus: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let backing_name = args.next().unwrap_or_else(|| "anonymous".into());
    let backing = match Backing::parse(&backing_name) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    println!("host: {}", HostInfo::detect().one_line());
    let modes = [
        (true, None, "manual protect (get + clear)"),
        (false, None, "no manual protect (-g)"),
        (false, Some(65536), "dirty ring, 65536 entries"),
    ];
    for (manual_protect, dirty_ring_entries, mode) in modes {
        let params = DirtyLogParams {
            vcpus,
            bytes_per_vcpu: mib << 20,
            iterations,
            manual_protect,
            backing,
            dirty_ring_entries,
            ..Default::default()
        };
        println!("== real KVM, {vcpus} vCPU x {mib} MiB, {backing}, {mode} ==");
        match dirty_log_perf::run(&params) {
            Ok(report) => {
                for line in report.selftest_lines() {
                    println!("{line}");
                }
            }
            Err(e @ Error::CapabilityMissing { .. }) => println!("skipped: {e}"),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
        println!();
    }
}
