//! `s2mmu memslot-perf`: its flags; the run and its report are
//! [`s2mmu_bench::memslot::report`]'s (the scenarios of KVM's
//! `memslot_perf_test` on the engine's two memslot policies).

use s2mmu_bench::memslot::MemslotPerfParams;

/// Options of `memslot-perf`.
#[derive(Clone, Debug, clap::Args)]
// "-1" is a value (refused naming its flag), not an unknown flag.
#[command(allow_negative_numbers = true)]
pub struct Args {
    /// Slot counts, one table each (the selftest's `-s`): each 1 to 32764, at most 16 counts.
    #[arg(
        long,
        short_alias = 's',
        value_delimiter = ',',
        default_values_t = [10u32, 30, 50, 100, 509, 32764],
        value_parser = clap::value_parser!(u32).range(1..=i64::from(s2mmu::memslot::KVM_USER_MEM_SLOTS))
    )]
    pub slots: Vec<u32>,
    /// How long each scenario runs (the selftest's `-l`), e.g. 500ms: more than 0, at most 1m.
    #[arg(long = "duration", short_alias = 'l', alias = "seconds", value_name = "DURATION", default_value = "500ms", value_parser = parse_seconds)]
    pub seconds: f64,
    /// Runs per scenario (the selftest's `-r`), 1 to 100; tables show the median.
    #[arg(short = 'r', long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub runs: u32,
    /// Single slot moves and deletes timed per slot count, 1 to 100000.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub single_ops: u32,
    /// Random gfn lookups timed per slot count, 1000 to 10000000.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u32).range(1000..=10_000_000))]
    pub lookups: u32,
    /// Add a column with the same slot setup, move and delete done on the host's real KVM
    /// (`KVM_SET_USER_MEMORY_REGION`); skipped with a message where `/dev/kvm` is unusable.
    #[arg(long)]
    pub kvm: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// No progress on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

/// `--duration`: a duration with its unit, more than 0 and at most 1m, in seconds.
fn parse_seconds(s: &str) -> Result<f64, String> {
    let x = s2mmu_cli::flags::parse_duration(s)?.as_secs_f64();
    if x <= 0.0 || x > 60.0 {
        return Err("more than 0 and at most 1m".into());
    }
    Ok(x)
}

impl Args {
    fn params(&self) -> MemslotPerfParams {
        MemslotPerfParams {
            slots: self.slots.clone(),
            run_seconds: self.seconds,
            runs: self.runs,
            single_ops: self.single_ops,
            lookups: self.lookups,
            ..MemslotPerfParams::default()
        }
    }
}

/// Runs `memslot-perf` and prints its report.
///
/// # Errors
/// As [`run_report`].
pub fn main(args: Args) -> Result<(), String> {
    let report = run_report(&args)?;
    crate::report::emit(&report, args.json);
    Ok(())
}

/// Runs every scenario at every slot count on both policies (and on real KVM with
/// `--kvm`), and builds the report with its target lines.
///
/// # Errors
/// As [`s2mmu_bench::memslot::report::run_report`].
pub fn run_report(args: &Args) -> Result<crate::report::Report, String> {
    let bars = crate::progress::bars(!args.quiet);
    s2mmu_bench::memslot::report::run_report(&args.params(), args.kvm, &bars)
}
