//! `s2mmu`: the benchmarks, `reproduce` and `migrate`.
//!
//! Each subcommand lives in its own module with its options (`Args`/`Params`)
//! and a `main` that runs it and prints its report.

use s2mmu_bench::arm64;
mod linux;
mod migrate_bench;
mod migrate_ctl;
mod perf;
mod reproduce;

use perf::{dirty_log_perf, dirty_views, harvest_perf, memslot_perf, split_perf, tlb_perf};

use s2mmu_cli::{limits, migrate, progress, report, snapshot, stats};

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
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
    /// Eager split of a slot with the skipping walker against a full walk.
    SplitPerf(split_perf::Params),
    /// Dirty-log clears of a large slot with split range TLB calls against one whole-VMID flush.
    TlbPerf(tlb_perf::Params),
    /// Harvest of hardware dirty state (arm64 DBM) on a large slot: the GET's word scan against a per-leaf walk.
    HarvestPerf(harvest_perf::Params),
    /// KVM's dirty_log_perf_test on the engine, on real KVM (--kvm), or both (--compare).
    DirtyLogPerf(dirty_log_perf::Params),
    /// Several dirty consumers (views) of one slot at their own harvest periods, against one alone: faults, protects, lost pages.
    DirtyViews(dirty_views::Params),
    /// memslot_perf_test scenarios on the tree memslots against the array baseline (and real KVM with --kvm).
    MemslotPerf(memslot_perf::Args),
    /// Runs every seed's experiment and writes a report next to the published figures.
    Reproduce(reproduce::Params),
    /// Incremental snapshots of a running guest from a dirty view of its own, and their restore (or --verify DIR).
    Snapshot(snapshot::Params),
    /// Pre-copy live migration of a running guest over TCP (in one process, or --listen/--to).
    Migrate(Box<migrate::Params>),
    /// Benchmarks of the Linux guest's migration: --vs-qemu runs QEMU 7.2's own migration of the same guest, interleaved with ours.
    MigrateBench(migrate_bench::Params),
    /// Talks to a running migration's --control socket: status, recover (post-copy recovery by hand), cancel.
    MigrateCtl(migrate_ctl::Params),
    /// Debian's arm64 Linux under the EL2 stub on QEMU, all guest RAM through the engine's fault path.
    Linux(Box<linux::Params>),
}

fn main() -> ExitCode {
    report::set_revision(option_env!("S2MMU_GIT_REV"));
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // The options given (not defaulted), for those refused by the guest.
    let given = matches
        .subcommand()
        .map_or_else(Vec::new, |(_, m)| s2mmu_cli::flags::given(m));
    let result = match cli.cmd {
        Cmd::SplitPerf(p) => split_perf::main(p),
        Cmd::TlbPerf(p) => tlb_perf::main(p),
        Cmd::DirtyLogPerf(p) => dirty_log_perf::main(p),
        Cmd::HarvestPerf(p) => harvest_perf::main(p),
        Cmd::DirtyViews(p) => dirty_views::main(p),
        Cmd::MemslotPerf(p) => memslot_perf::main(p),
        Cmd::Reproduce(p) => reproduce::main(p),
        Cmd::Migrate(p) => match migrate::linux::chosen(&p, &given) {
            Ok(true) => migrate::linux::main(&p),
            Ok(false) => migrate::main(*p),
            Err(e) => Err(e),
        },
        Cmd::MigrateBench(p) => migrate_bench::main(p),
        Cmd::MigrateCtl(p) => migrate_ctl::main(p),
        Cmd::Snapshot(p) => snapshot::main(p),
        Cmd::Linux(p) => linux::command::main(*p),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("s2mmu: {e}");
            ExitCode::from(2)
        }
    }
}
