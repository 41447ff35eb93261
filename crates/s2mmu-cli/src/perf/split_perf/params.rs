//! The options of `split-perf`.

use crate::limits;
use crate::perf::dirty_log_perf::FormatArg;
use s2mmu::format::arm64::Granule;
/// The largest `--mem`: the slot sits at 1 TiB in a 48-bit IPA space.
use s2mmu_bench::split::MAX_SIZE;

/// Options of `split-perf`.
#[derive(Clone, Debug, clap::Args)]
// "-1" is a value (refused naming its flag), not an unknown flag.
#[command(allow_negative_numbers = true)]
pub struct Params {
    /// Slot size (e.g. 1G, 512M): a multiple of the granule's largest block, at most 255T
    /// (the IPA space above the slot's base) and what the host's free memory can hold
    /// split to pages (about 1/128 of the size with 4K pages), checked before allocating.
    #[arg(short = 'm', long = "mem", alias = "size", default_value = "1G", value_parser = limits::size_in(1..=MAX_SIZE))]
    pub size: u64,
    /// Repetitions per backing and policy, 1 to 1000.
    #[arg(long, default_value_t = 7, value_parser = limits::count_in(1..=1000))]
    pub runs: usize,
    /// Translation granule: 4k, 16k or 64k.
    #[arg(long, default_value = "4k", value_parser = parse_granule)]
    pub granule: Granule,
    /// The table's format: arm64 (the granule above) or x86 EPT (4-level,
    /// 4 KiB pages only).
    #[arg(long, value_enum, default_value = "arm64")]
    pub format: FormatArg,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// No progress on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

fn parse_granule(s: &str) -> Result<Granule, String> {
    let bytes = crate::report::parse_size(s)?;
    Granule::from_bytes(bytes).map_err(|e| e.to_string())
}
