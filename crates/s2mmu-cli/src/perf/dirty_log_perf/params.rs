//! The flags of `dirty-log-perf` (the selftest's names where one exists)
//! and the value enums they take.

use crate::report::parse_size;
use s2mmu::mmu::MmuPolicy;
use s2mmu_cli::dirty_mode::{parse_dirty_modes, DirtyModes};
use s2mmu_vm::Backing;

use s2mmu_cli::vm_format::FormatArg;

/// Which fault-path policy to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PolicyArg {
    /// MmuPolicy::default(): the read-lock fast path (optimised).
    #[value(name = "default", alias = "fast")]
    Fast,
    /// Every fault under the write lock.
    Baseline,
    /// Both, as a table per vCPU count.
    Both,
}

/// What happens to huge pages split for logging when logging stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RecoverArg {
    /// Unmap the pages; faults map blocks again (x86 before 6.13).
    Zap,
    /// Collapse the pages back into blocks in place (x86 since 6.13).
    InPlace,
    /// Keep the pages (arm64 today).
    Off,
}

/// How fast-path faults take the MMU lock for reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReadLockArg {
    /// Per-vCPU reader slots while no writer is around (s2mmu).
    Slots,
    /// The rwlock's shared reader count (KVM's mmu_lock).
    Rwlock,
}

impl ReadLockArg {
    /// Reader slots of the engine policy for this choice (0: the shared count).
    pub(super) fn reader_slots(self) -> usize {
        match self {
            ReadLockArg::Slots => MmuPolicy::default().reader_slots,
            ReadLockArg::Rwlock => 0,
        }
    }
}

/// Options of `dirty-log-perf` (the selftest's names where one exists).
#[derive(Clone, Debug, clap::Args)]
pub struct Params {
    /// vCPUs: a number or a comma list (default 1; 1,2,4,8,16,32,64 with --policy both).
    #[arg(short = 'v', long = "vcpus", value_delimiter = ',')]
    pub vcpus: Vec<usize>,
    /// Memory dirtied per vCPU (default 1G; 64M with a vCPU list or --arm64).
    #[arg(long = "mem-per-vcpu", short_alias = 'b', value_parser = parse_size)]
    pub bytes_per_vcpu: Option<u64>,
    /// Dirty iterations.
    #[arg(short = 'i', long = "iterations", default_value_t = 2)]
    pub iterations: u32,
    /// Backing: anonymous, anonymous_thp, anonymous_hugetlb_2mb, anonymous_hugetlb_1gb.
    #[arg(long = "backing", short_alias = 's', default_value = "anonymous", value_parser = Backing::parse)]
    pub backing: Backing,
    /// Number of memslots the memory is divided into.
    #[arg(long = "slots", short_alias = 'x', default_value_t = 1)]
    pub slots: u32,
    /// Do not use manual protect: GET clears and re-protects; no CLEAR phase.
    #[arg(short = 'g', long)]
    pub no_manual_protect: bool,
    /// Eager split when logging is enabled (compared with split on fault on
    /// huge-page backing). Note: the selftest's -e is "evil" mode instead.
    #[arg(short = 'e', long)]
    pub eager_split: bool,
    /// Percent of accesses that write.
    #[arg(short = 'w', long, default_value_t = 100)]
    pub write_percent: u32,
    /// Random page order in the dirty iterations.
    #[arg(short = 'a', long)]
    pub random: bool,
    /// Fault-path policy.
    #[arg(long, value_enum, default_value = "default")]
    pub policy: PolicyArg,
    /// How vCPUs take the MMU lock for reading on the fast path: their own reader
    /// slots (s2mmu's default) or the rwlock's shared reader count (KVM's mmu_lock).
    #[arg(long, value_enum, default_value = "slots")]
    pub read_lock: ReadLockArg,
    /// Memslot implementation of the engine: tree (5.17) or array (baseline).
    #[arg(long, default_value = "tree", value_parser = ["tree", "array"])]
    pub memslots: String,
    /// Hidden alias of --dirty ring:N.
    #[arg(long, hide = true)]
    pub ring: Option<u32>,
    /// Dirty tracking, the engine's modes by name: write protection (wp),
    /// dirty rings (ring, ring:N; as --ring N), hardware dirty state (hw:
    /// arm64 DBM or EPT dirty flags; hw-blocks: huge mappings left whole,
    /// a write reports its whole block), or hardware dirty state with x86
    /// PML (pml); hw and pml log to bitmaps only, not with --ring. Several
    /// (`wp,hw,pml`, or `all`) run side by side in one process, with a pass
    /// with logging off, as one table.
    #[arg(long, default_value = "wp", value_parser = parse_dirty_modes)]
    pub dirty: DirtyModes,
    /// The stage-2 format the simulated VM's vCPUs walk: arm64 (4 KiB
    /// granule) or x86 EPT (4-level). Not with --kvm, --compare or --arm64.
    #[arg(long, value_enum, default_value = "arm64")]
    pub format: FormatArg,
    /// Huge pages when logging stops: zap (refault), in-place (collapse),
    /// off (stay split).
    #[arg(long, value_enum, default_value = "zap")]
    pub recover: RecoverArg,
    /// Run one more pass after logging stops and time it (how the huge
    /// pages came back shows there).
    #[arg(long)]
    pub after_pass: bool,
    /// Run on the host's real KVM instead of the engine.
    #[arg(long)]
    pub kvm: bool,
    /// Run the engine, real KVM and QEMU's arm64 model in one process and print the ratios
    /// per phase (a column that cannot run here is skipped with the reason).
    #[arg(long)]
    pub compare: bool,
    /// Run on QEMU's arm64 model: the engine as the stage-2 MMU of qemu-system-aarch64
    /// (s2mmu-arm64). Its timings are an emulator's, not hardware figures.
    #[arg(long, conflicts_with_all = ["kvm", "compare"])]
    pub arm64: bool,
    /// Check every pass's dirty log: with --kvm or --arm64, that it holds exactly the pages
    /// the guest wrote; on the engine, that no page whose content changed is missing from it
    /// (a lost write; pages hashed after each harvest). A mismatch fails the run.
    #[arg(long)]
    pub check: bool,
    /// Test-only fault injection for --check on the engine: drop this many dirty marks in
    /// the first logged pass (the check must then report lost writes).
    #[arg(long, default_value_t = 0, requires = "check")]
    pub inject_lost_marks: u64,
    /// Runs of each policy in the comparisons (-e, --policy both), alternating which goes
    /// first; the tables quote medians (default 5 with -e, 3 with --policy both). With
    /// --arm64: runs of the workload, each on a fresh QEMU (default 1).
    #[arg(short = 'r', long)]
    pub runs: Option<u32>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// No progress on stderr.
    #[arg(short = 'q', long)]
    pub quiet: bool,
}
