//! `s2mmu`: the benchmarks, `reproduce` and `migrate`.

mod report;
mod split_perf;

use clap::{Parser, Subcommand};
use report::parse_size;
use s2mmu::format::arm64::Granule;
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
    SplitPerf {
        /// Slot size (e.g. 1G, 512M).
        #[arg(long, default_value = "1G", value_parser = parse_size)]
        size: u64,
        /// Repetitions per backing and policy.
        #[arg(long, default_value_t = 7)]
        runs: usize,
        /// Translation granule: 4k, 16k or 64k.
        #[arg(long, default_value = "4k", value_parser = parse_granule)]
        granule: Granule,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn parse_granule(s: &str) -> Result<Granule, String> {
    let bytes = parse_size(s)?;
    Granule::from_bytes(bytes).map_err(|e| e.to_string())
}

fn emit(report: report::Report, json: bool) -> ExitCode {
    use std::io::Write;
    let out = if json {
        let mut s = serde_json::to_string_pretty(&report.to_json()).expect("serialisable");
        s.push('\n');
        s
    } else {
        report.text().to_string()
    };
    // A closed pipe (`| head`) is not an error worth a panic.
    let _ = std::io::stdout().lock().write_all(out.as_bytes());
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::SplitPerf {
            size,
            runs,
            granule,
            json,
        } => split_perf::run(
            &split_perf::Params {
                size,
                runs,
                granule,
            },
            !json,
        )
        .map(|r| emit(r, json)),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("s2mmu: {e}");
            ExitCode::from(2)
        }
    }
}
