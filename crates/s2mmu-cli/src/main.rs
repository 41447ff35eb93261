//! `s2mmu`: the benchmarks, `reproduce` and `migrate`.
//!
//! Each subcommand lives in its own module with its options (`Args`/`Params`)
//! and a `main` that runs it and prints its report.

mod report;
mod split_perf;
mod tlb_perf;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "s2mmu",
    version,
    about = "A second-stage MMU for hypervisors: benchmarks, comparison with real KVM, live migration"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Seed 000: eager split of a slot with the skipping walker against a full walk.
    SplitPerf(split_perf::Params),
    /// Seed 003: dirty-log clears of a large slot with split range TLB calls against one whole-VMID flush.
    TlbPerf(tlb_perf::Params),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::SplitPerf(p) => split_perf::main(p),
        Cmd::TlbPerf(p) => tlb_perf::main(p),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("s2mmu: {e}");
            ExitCode::from(2)
        }
    }
}
