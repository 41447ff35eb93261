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

use crate::dirty_log_perf::FormatArg;
use crate::report::Report;
use s2mmu::tlb::LargeRangePolicy;
use s2mmu::TlbPolicy;
use s2mmu_bench::tlb::{Config, Mode, PAGE, POLICIES};

mod arm64_report;
mod report;
mod vm_report;

/// Options of `tlb-perf`.
#[derive(Clone, Debug, clap::Args)]
// "-1" is a value (refused naming its flag), not an unknown flag.
#[command(allow_negative_numbers = true)]
pub struct Params {
    /// Size of the dirty-logged slot (mapped without touching memory): a multiple of 1G
    /// that fits a 48-bit IPA space; its 4K tables (1/512 of it) must fit the host's
    /// available memory (with --arm64: at most the model's guest RAM and table arena).
    #[arg(short = 'm', long = "mem", alias = "size", default_value = "64G", value_parser = crate::report::parse_size)]
    pub size: u64,
    /// Run on QEMU's arm64 model (s2mmu-arm64): every TLB call is a round trip to an EL2
    /// service CPU that executes the TLBI instructions; no vCPU workload runs. QEMU's
    /// timings are an emulator's: read the counts and the ratios.
    #[arg(long, conflicts_with_all = ["vcpus", "vcpu_mem", "idle_us", "settle_us"])]
    pub arm64: bool,
    /// The stage-2 format of the simulated VM and its big slot: arm64
    /// (4 KiB granule) or x86 EPT (4-level); not with --arm64.
    #[arg(long, value_enum, default_value = "arm64", conflicts_with = "arm64")]
    pub format: FormatArg,
    /// Clear chunk (QEMU's x-clear-bitmap-shift; its default 18 is 1 GiB): a multiple of
    /// 256K (one bitmap word of pages), at most --mem.
    #[arg(long, default_value = "1G", value_parser = crate::report::parse_size)]
    pub chunk: u64,
    /// Harvest cycles per mode and policy, 1 to 1000 (default 11; 5 with --arm64).
    #[arg(
        long,
        default_value_t = 11,
        default_value_if("arm64", "true", "5"),
        value_parser = crate::limits::count_in(1..=1000)
    )]
    pub runs: usize,
    /// vCPU threads running a random-write workload during the cycles, at most 64;
    /// 0: one per logical CPU but one (the clearing thread needs a core).
    #[arg(short = 'v', long, default_value_t = 0)]
    pub vcpus: usize,
    /// Real memory each vCPU writes (its own region of a small slot); all vCPUs' together
    /// must fit the host's available memory.
    #[arg(long, default_value = "2M", value_parser = crate::report::parse_size)]
    pub vcpu_mem: u64,
    /// One page in this many of the big slot is dirtied before each cycle, at least 1
    /// (default 64; 1, every page, with --arm64).
    #[arg(long, default_value_t = 64, default_value_if("arm64", "true", "1"))]
    pub dirty_every: u64,
    /// TLB range limit in pages (arm64's MAX_TLBI_RANGE_PAGES), 1 to 2^52 - 1 (the 64-bit
    /// address space in pages).
    #[arg(long, default_value_t = TlbPolicy::DEFAULT_LIMIT_PAGES)]
    pub limit_pages: u64,
    /// After every burst of 1024 guest writes a vCPU leaves guest mode and
    /// idles this long (a guest waiting for an interrupt), e.g. 50us;
    /// 0s keeps it in guest mode all the time; at most 1s. Idling keeps vCPUs from being
    /// preempted inside guest mode on a host with fewer free cores than
    /// threads, where every flush would wait out a scheduler time slice
    /// (a preempted KVM vCPU is outside guest mode and is not waited for).
    #[arg(long = "idle", alias = "idle-us", value_name = "DURATION", default_value = "0s", value_parser = micros_upto_1s)]
    pub idle_us: u64,
    /// How long to watch the vCPUs after each clear for TLB refills, at most 1s.
    #[arg(long = "settle", alias = "settle-us", value_name = "DURATION", default_value = "2ms", value_parser = micros_upto_1s)]
    pub settle_us: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// No progress on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

/// `--idle`, `--settle`: a duration with its unit, 0 to 1s, in microseconds.
fn micros_upto_1s(s: &str) -> Result<u64, String> {
    let d = s2mmu_cli::flags::parse_duration(s)?;
    if d > std::time::Duration::from_secs(1) {
        return Err(format!("'{s}': at most 1s"));
    }
    Ok(d.as_micros() as u64)
}

/// Runs `tlb-perf` from the command line.
///
/// # Errors
/// A message naming what failed.
pub fn main(p: Params) -> Result<(), String> {
    let r = run(&p, !p.quiet)?;
    crate::report::emit(&r, p.json);
    Ok(())
}

impl Params {
    /// The engine's settings.
    fn config(&self) -> Config {
        Config {
            size: self.size,
            chunk: self.chunk,
            runs: self.runs,
            vcpus: self.vcpus,
            vcpu_mem: self.vcpu_mem,
            dirty_every: self.dirty_every,
            limit_pages: self.limit_pages,
            idle_us: self.idle_us,
            settle_us: self.settle_us,
        }
    }
}

fn policy_name(p: LargeRangePolicy) -> &'static str {
    match p {
        LargeRangePolicy::SplitCalls => "split_calls",
        LargeRangePolicy::WholeVmid => "whole_vmid",
    }
}

fn check(p: &Params) -> Result<(), String> {
    s2mmu_bench::tlb::check(&p.config())
}

/// Runs the benchmark and returns its report.
///
/// # Errors
/// A message naming what failed (bad options, address space, engine).
pub fn run(p: &Params, progress: bool) -> Result<Report, String> {
    if p.arm64 {
        arm64_report::run(p, progress)
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
    fn call<F: s2mmu_vm::VmFormat>(self) -> Self::Output {
        vm_report::run::<F>(self.p, self.progress)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
