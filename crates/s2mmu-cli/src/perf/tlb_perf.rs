//! `s2mmu tlb-perf`: the seed-003 experiment ("call kvm_call_hyp once during
//! kvm_tlb_flush_vmid_range").
//!
//! A large slot (64 GiB by default) is mapped with 4 KiB pages over reserved,
//! never-touched host address space, and dirty-logged. Each harvest cycle
//! dirties a share of its pages as guest writes would, then gets the bitmap
//! and clears it, over the whole slot in one call and in `--chunk` pieces
//! (QEMU's clear-bitmap chunk). Every clear write-protects what it cleared
//! and flushes the whole slot's TLB entries (KVM's
//! `kvm_flush_remote_tlbs_memslot`): with the mainline policy that is one
//! range call per 2^21 pages, with the seed's policy one whole-VMID flush.
//!
//! Invalidations are real: they go to the simulated vCPUs' software TLBs
//! through the VM's shootdown, and vCPU threads run a random-write workload
//! on a small slot of real memory meanwhile, so each call must reach every
//! running vCPU. The price of the whole-VMID flush is measured on those
//! vCPUs: entries it removes (range flushes of the big slot leave the small
//! slot's entries alone) and the TLB misses they take to refill.

use crate::report::Report;

mod params;

pub use params::Params;

/// Runs `tlb-perf` from the command line.
///
/// # Errors
/// A message naming what failed.
pub fn main(p: Params) -> Result<(), String> {
    let r = run(&p, !p.quiet)?;
    crate::report::emit(&r, p.json);
    Ok(())
}

/// Runs the benchmark and returns its report.
///
/// # Errors
/// A message naming what failed (bad options, address space, engine).
pub fn run(p: &Params, progress: bool) -> Result<Report, String> {
    if p.arm64 {
        s2mmu_bench::tlb::arm64_report::run(&p.config(), &crate::progress::bars(progress))
    } else {
        p.format.with(OnVm { p, progress })
    }
}

/// The simulated VM's run, on the format `--format` names.
struct OnVm<'a> {
    p: &'a Params,
    progress: bool,
}

impl s2mmu_cli::vm_format::WithFormat for OnVm<'_> {
    type Output = Result<Report, String>;
    fn call<F: s2mmu_vm::KnownFormat>(self) -> Self::Output {
        let bars = crate::progress::bars(self.progress);
        s2mmu_bench::tlb::vm_report::run::<F>(&self.p.config(), &bars)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::dirty_log_perf::FormatArg;
    use s2mmu_bench::tlb::PAGE;

    fn check(p: &Params) -> Result<(), String> {
        s2mmu_bench::tlb::check(&p.config())
    }

    fn params(size: &str, chunk: &str) -> Params {
        Params {
            size: crate::report::parse_size(size).unwrap(),
            chunk: crate::report::parse_size(chunk).unwrap(),
            runs: 1,
            vcpus: 1,
            vcpu_mem: 64 << 10,
            dirty_every: 64,
            limit_pages: 1 << 16,
            settle_us: 100,
            idle_us: 50,
            arm64: false,
            format: FormatArg::Arm64,
            json: true,
            quiet: true,
        }
    }

    fn parsed(words: &[&str]) -> Params {
        #[derive(clap::Parser)]
        struct Wrap {
            #[command(flatten)]
            p: Params,
        }
        let argv = std::iter::once("tlb-perf").chain(words.iter().copied());
        <Wrap as clap::Parser>::try_parse_from(argv).unwrap().p
    }

    #[test]
    fn the_arm64_defaults_apply_only_with_arm64() {
        // `--arm64` is a flag whose value is always set (false by default):
        // its defaults were once taken by every run.
        let x86 = parsed(&[]);
        assert_eq!((x86.runs, x86.dirty_every), (11, 64));
        let arm = parsed(&["--arm64"]);
        assert_eq!((arm.runs, arm.dirty_every), (5, 1));
        assert_eq!(parsed(&["--arm64", "--runs", "3"]).runs, 3);
    }

    #[test]
    fn bad_options_are_refused() {
        let mut huge = params("1G", "1G");
        huge.vcpu_mem = 1 << 62;
        huge.vcpus = 8;
        assert!(run(&huge, false).is_err(), "typed error, no overflow");
        assert!(run(&params("256T", "1G"), false).is_err(), "beyond 48 bits");
        assert!(check(&params("0", "1G")).is_err());
        assert!(check(&params("1G", "4K")).is_err());
        assert!(check(&params("1G", "2G")).is_err());
        assert!(check(&params("1G", "256M")).is_ok());
    }

    #[test]
    fn limit_pages_beyond_the_address_space_is_refused() {
        // Accepted before, and the report's `limit_pages * PAGE` then
        // overflowed after the whole run.
        let mut p = params("1G", "256M");
        p.limit_pages = u64::MAX;
        assert!(run(&p, false).is_err());
        p.limit_pages = u64::MAX / PAGE;
        assert!(check(&p).is_ok());
    }

    #[test]
    fn small_run_counts_calls_per_policy() {
        // 1 GiB slot, limit 2^16 pages (256 MiB): 4 split calls or 1 VMID
        // flush per clear; 256 MiB chunks: 4 clears. The same on both
        // formats: the invalidation policy is the engine's, not the table's.
        for &format in FormatArg::all() {
            let p = Params {
                format,
                ..params("1G", "256M")
            };
            let r = run(&p, false).unwrap();
            let j = r.to_json();
            assert_eq!(j["params"]["format"], format.name());
            let rows = j["results"].as_array().unwrap();
            let get = |case: &str, pol: &str| {
                rows.iter()
                    .find(|r| r["case"] == case && r["policy"] == pol)
                    .unwrap()
                    .clone()
            };
            assert_eq!(get("whole_slot", "split_calls")["tlb_calls"], 4);
            assert_eq!(get("whole_slot", "whole_vmid")["tlb_calls"], 1);
            assert_eq!(get("whole_slot", "whole_vmid")["tlb_vmid_flushes"], 1);
            assert_eq!(get("chunk_256mib", "split_calls")["tlb_calls"], 16);
            assert_eq!(get("chunk_256mib", "whole_vmid")["tlb_calls"], 4);
            assert_eq!(get("whole_slot", "split_calls")["pages"], (1u64 << 18) / 64);
        }
    }
}
