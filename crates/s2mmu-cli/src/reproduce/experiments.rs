//! The experiments `reproduce` runs: for each seed its title, the figures
//! published for it, and the benchmark called through its parameter struct
//! (clap's defaults, then the few options the seed needs set as fields).

use crate::perf::dirty_log_perf::FormatArg;
use crate::report::Report;
use clap::Parser;
use s2mmu_cli::dirty_mode::{DirtyModes, ALL};

/// One experiment: what it reproduces, the published figures, the command
/// it is equivalent to (for the reader) and the call that runs it.
pub(super) struct Experiment {
    /// Its key in `--json` and in plot file names: the seed's number
    /// (`000`..`004`) or, for an experiment no seed describes, a name.
    pub id: &'static str,
    /// The seed it reproduces, if one does.
    pub seed: Option<&'static str>,
    /// What the report's section is titled by: "Seed 002", or what an
    /// experiment without a seed reproduces.
    pub heading: &'static str,
    pub title: &'static str,
    pub published: &'static str,
    pub command: String,
    pub run: Box<dyn Fn() -> Result<Report, String>>,
}

/// A subcommand's options as clap's defaults set them (no word parsed but
/// the program name), for the caller to change field by field.
fn defaults<T: clap::Args>() -> Result<T, String> {
    #[derive(Parser)]
    struct Wrap<U: clap::Args> {
        #[command(flatten)]
        inner: U,
    }
    Wrap::<T>::try_parse_from(["s2mmu"])
        .map(|w| w.inner)
        .map_err(|e| e.to_string())
}

const TITLE_000: &str = "Optimize S2 page splitting: the RFC's skip returns (v1) and the skip-level walker flag (v2) vs the full walk, on eager split and on CLEAR (split-perf)";
const PUBLISHED_000: &str = "v1, skip returns (RFC 2026-05-15, FVP model, 1 GiB VM, whole-slot split): already 4K -97.33 % runtime; THP -19.82 %; 1x1G hugetlb -20.65 %. \
                    v2, the skip-level walker flag KVM_PGTABLE_WALK_SKIP_LEVEL3 that replaced them, as posted 2026-06-10 (AmpereOne, 64 GB slot): \
                    enabling logging -35.47 % / -11.94 % / -14.46 % (already 4K / THP / 64x1G hugetlb); CLEAR_DIRTY_LOG with manual protect -26.36 % / -12.05 % / -13.87 %. \
                    A report of v2 on a 16 GB slot quotes: enabling logging -44 % / -24.7 % / -24.8 %, CLEAR_DIRTY_LOG -39 % / -25.5 %, and the author finding that skipping children \
                    'was marginally slower than just skipping levels' (the mail with these figures was not found here; the v2 posting of 2026-06-18 that was found carries no figures). \
                    All are against the full walk; the v1 and v2 figures come from different machines and slot sizes.";
const TITLE_001: &str = "Scalable memslots: tree sets against the copied array (memslot-perf)";
const PUBLISHED_001: &str = "Xeon 8167M, memslot_perf_test, TDP MMU off. 32k slots: slot setup 16.1 s -> 0.59 s (96 %), move active 0.00142 s -> 0.0000786 s (94 %), \
                    unmap 3.88 s -> 0.0351 s (99 %); 509 slots: setup 41 %, unmap 56 % less; 10 slots: setup 17 %, move 14-16 % less, map/unmap about equal.";
const TITLE_002: &str = "Read-lock fast path for permission relaxation vs write-lock faults (dirty-log-perf --policy both)";
const PUBLISHED_002: &str = "Ampere Altra, dirty_log_perf_test -b 2G -i 2 -s anonymous_hugetlb_2mb. Before (write lock): dirty memory time 926 / 1189 / 2503 / 5069 / 10340 ms \
                    for 1 / 2 / 4 / 8 / 16 vCPUs, contentions 0 / 4.7M / 11.5M / 24.9M / 50.3M. After (read lock): 803 / 843 / 942 / 1458 / 2853 ms (more than 60 % less from 4 vCPUs on).";
const TITLE_003: &str =
    "One whole-VMID flush instead of split range calls for large dirty-log clears (tlb-perf)";
const PUBLISHED_003: &str = "RFC 2026-02 (yezhenyu, Huawei), live migration: kvm_arch_flush_remote_tlbs_range 9.67 % of ram_find_and_save_block -> 0.03 %; \
                    kvm_clear_dirty_log_protect 26.74 % -> 1.75 %; migration bandwidth <10 GB/s -> ~50 GB/s. Unmerged; no reproducer was given.";
const TITLE_004: &str =
    "Eager page splitting when dirty logging is enabled vs split on fault (dirty-log-perf -e)";
const PUBLISHED_004: &str = "x86 TDP MMU, 96 vCPUs x 1 GiB, 1 GiB hugetlb: time for vCPUs to dirty their memory after enabling logging 2.94 s -> 0.14 s (-95 %); \
                    CPU time splitting ~270 CPU-s -> 1.55 CPU-s; enabling logging 0.001 s -> 1.55 s.";
const TITLE_KVM: &str = "The engine against the host's real KVM (dirty-log-perf --compare)";
const PUBLISHED_KVM: &str = "Reference: one write-protection fault on real KVM costs an exit, a shadow-MMU fault and a re-entry (a few microseconds on these machines).";

/// Every experiment, smaller with `quick`, the real-KVM runs left out with
/// `no_kvm`.
///
/// # Errors
/// A benchmark's defaults that clap refuses (a bug in its options).
pub(super) fn all(quick: bool, no_kvm: bool) -> Result<Vec<Experiment>, String> {
    let mut v = vec![
        seed_000(quick)?,
        seed_001(quick, no_kvm)?,
        seed_002(quick)?,
        seed_003(quick)?,
        seed_004(quick)?,
    ];
    for &format in FormatArg::all() {
        v.push(dirty_modes(quick, format)?);
    }
    if !no_kvm {
        v.push(seed_kvm(quick)?);
    }
    Ok(v)
}

fn seed_000(q: bool) -> Result<Experiment, String> {
    let mut p: crate::perf::split_perf::Params = defaults()?;
    p.runs = if q { 3 } else { 7 };
    p.quiet = true;
    Ok(Experiment {
        id: "000",
        seed: Some("000"),
        heading: "Seed 000",
        title: TITLE_000,
        published: PUBLISHED_000,
        command: format!("s2mmu split-perf --runs {}", p.runs),
        run: Box::new(move || crate::perf::split_perf::run(&p, false)),
    })
}

fn seed_001(q: bool, no_kvm: bool) -> Result<Experiment, String> {
    let mut a: crate::perf::memslot_perf::Args = defaults()?;
    if q {
        a.slots = vec![10, 509, 32764];
        a.runs = 1;
        a.seconds = 0.2;
        a.lookups = 200_000;
    } else {
        a.slots = vec![10, 30, 50, 100, 509, 32764];
        a.runs = 3;
        a.seconds = 0.5;
    }
    a.kvm = !no_kvm;
    a.quiet = true;
    let slots: Vec<String> = a.slots.iter().map(u32::to_string).collect();
    let command = format!(
        "s2mmu memslot-perf --slots {} -r {} --duration {}s --lookups {}{}",
        slots.join(","),
        a.runs,
        a.seconds,
        a.lookups,
        if a.kvm { " --kvm" } else { "" }
    );
    Ok(Experiment {
        id: "001",
        seed: Some("001"),
        heading: "Seed 001",
        title: TITLE_001,
        published: PUBLISHED_001,
        command,
        run: Box::new(move || crate::perf::memslot_perf::run_report(&a)),
    })
}

fn seed_002(q: bool) -> Result<Experiment, String> {
    use crate::perf::dirty_log_perf::{Params, PolicyArg};
    let mut d: Params = defaults()?;
    d.policy = PolicyArg::Both;
    d.vcpus = if q {
        vec![1, 2, 4, 8]
    } else {
        vec![1, 2, 4, 8, 16]
    };
    d.bytes_per_vcpu = Some(if q { 32 << 20 } else { 128 << 20 });
    d.backing = s2mmu_vm::Backing::parse("anonymous_thp")?;
    d.eager_split = true;
    let vcpus: Vec<String> = d.vcpus.iter().map(usize::to_string).collect();
    let command = format!(
        "s2mmu dirty-log-perf --policy both -v {} --mem-per-vcpu {}M --backing anonymous_thp -e",
        vcpus.join(","),
        d.bytes_per_vcpu.unwrap_or(0) >> 20
    );
    Ok(Experiment {
        id: "002",
        seed: Some("002"),
        heading: "Seed 002",
        title: TITLE_002,
        published: PUBLISHED_002,
        command,
        run: Box::new(move || crate::perf::dirty_log_perf::run(&d)),
    })
}

fn seed_003(q: bool) -> Result<Experiment, String> {
    // The seed's 64 GiB even with --quick: a smaller slot needs fewer than 8
    // range calls and so cannot show the target. Mapping it takes well under
    // a second.
    let mut t: crate::perf::tlb_perf::Params = defaults()?;
    t.runs = if q { 5 } else { 11 };
    t.quiet = true;
    Ok(Experiment {
        id: "003",
        seed: Some("003"),
        heading: "Seed 003",
        title: TITLE_003,
        published: PUBLISHED_003,
        command: format!("s2mmu tlb-perf --runs {}", t.runs),
        run: Box::new(move || crate::perf::tlb_perf::run(&t, false)),
    })
}

fn seed_004(q: bool) -> Result<Experiment, String> {
    let mut d: crate::perf::dirty_log_perf::Params = defaults()?;
    d.quiet = true;
    d.eager_split = true;
    d.backing = s2mmu_vm::Backing::parse("anonymous_thp")?;
    d.vcpus = vec![2];
    d.bytes_per_vcpu = Some(if q { 256 << 20 } else { 512 << 20 });
    let command = format!(
        "s2mmu dirty-log-perf -e --backing anonymous_thp -v 2 --mem-per-vcpu {}M",
        d.bytes_per_vcpu.unwrap_or(0) >> 20
    );
    Ok(Experiment {
        id: "004",
        seed: Some("004"),
        heading: "Seed 004",
        title: TITLE_004,
        published: PUBLISHED_004,
        command,
        run: Box::new(move || crate::perf::dirty_log_perf::run(&d)),
    })
}

const TITLE_MODES: &str =
    "Write protection against hardware dirty state and PML (dirty-log-perf --dirty all)";
const PUBLISHED_MODES: &str = "No published head-to-head on one workload. Keqian Zhu's arm64 DBM RFC measured a harvest of about 40 ms per 64 GiB. \
                    Targets: 1 vCPU, 256 MiB, hardware dirty mode with 0 write faults per pass and dirty memory time within 1.5x of a pass with logging off.";

/// The dirty tracking modes side by side on one format.
fn dirty_modes(q: bool, format: FormatArg) -> Result<Experiment, String> {
    let mut d: crate::perf::dirty_log_perf::Params = defaults()?;
    d.quiet = true;
    d.dirty = DirtyModes(ALL.to_vec());
    d.format = format;
    d.vcpus = vec![1];
    d.bytes_per_vcpu = Some(256 << 20);
    d.iterations = 4;
    d.runs = Some(if q { 1 } else { 3 });
    let command = format!(
        "s2mmu dirty-log-perf --dirty all --format {} -v 1 --mem-per-vcpu 256M -i 4 -r {}",
        format.name(),
        d.runs.unwrap_or(1)
    );
    Ok(Experiment {
        // The list is made once per run: its names live as long as it.
        id: String::leak(format!("dirty-modes-{}", format.name())),
        seed: None,
        heading: String::leak(format!("Dirty-tracking modes, {}", format.title())),
        title: TITLE_MODES,
        published: PUBLISHED_MODES,
        command,
        run: Box::new(move || crate::perf::dirty_log_perf::run(&d)),
    })
}

fn seed_kvm(q: bool) -> Result<Experiment, String> {
    let mut d: crate::perf::dirty_log_perf::Params = defaults()?;
    d.quiet = true;
    d.compare = true;
    d.bytes_per_vcpu = Some(if q { 64 << 20 } else { 256 << 20 });
    let command = format!(
        "s2mmu dirty-log-perf --compare --mem-per-vcpu {}M",
        d.bytes_per_vcpu.unwrap_or(0) >> 20
    );
    Ok(Experiment {
        id: "kvm",
        seed: None,
        heading: "The engine against real KVM",
        title: TITLE_KVM,
        published: PUBLISHED_KVM,
        command,
        run: Box::new(move || crate::perf::dirty_log_perf::run(&d)),
    })
}
