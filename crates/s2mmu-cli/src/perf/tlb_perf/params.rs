//! The options of `tlb-perf`, their checks, and the engine's settings they
//! make.

use crate::perf::dirty_log_perf::FormatArg;
use s2mmu::TlbPolicy;
use s2mmu_bench::tlb::Config;

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

impl Params {
    /// The engine's settings.
    pub(super) fn config(&self) -> Config {
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
