//! `s2mmu snapshot`: its flags and its report. The snapshots (a dirty
//! view of their own, checked files, their restore) are
//! `s2mmu_migrate::session::snapshot`, the run `s2mmu_migrate::sim::snapshot_run`.
//!
//! The command runs the simulated guest as `migrate` does (vCPU threads
//! writing their regions at a paced rate), writes the base and then an
//! incremental snapshot every `--every`, pauses the guest after
//! `--duration`, takes the last snapshot, and restores the chain: the
//! rebuilt memory must equal the guest's at that stop point, page for
//! page. `--verify DIR` only restores a directory's chain and checks it.
//! `migrate --snapshot-every` takes the same snapshots while a migration
//! runs on its own view.

use s2mmu_migrate::session::snapshot::{format, restore};

use crate::migrate::parse_duration;
use crate::report::{human, human_bytes, parse_size, verdict, Report, Summary};
use format::SnapshotError;
use s2mmu_migrate::session::{Progress as SessionProgress, ProgressEvent};
use s2mmu_migrate::sim::snapshot_run::{self, SnapshotRunConfig};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Options of `s2mmu snapshot`.
#[derive(clap::Args, Clone, Debug)]
pub struct Params {
    /// Guest memory (a multiple of 2M per vCPU, at most 16G).
    #[arg(short = 'm', long, default_value = "256M", value_parser = parse_size)]
    pub mem: u64,
    /// vCPUs running the workload (1..=64).
    #[arg(short = 'v', long, default_value_t = 2)]
    pub vcpus: usize,
    /// Bytes per second the guest dirties, all vCPUs together (0: as fast as it can).
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    pub dirty_rate: u64,
    /// Time between snapshots (1ms..=1h).
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub every: Duration,
    /// How long the guest runs while snapshots are taken (at most 1h).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Directory of the snapshot files (created; must hold no snapshot; default: a fresh one in the temporary directory).
    #[arg(long, default_value_os_t = std::env::temp_dir().join(format!("s2mmu-snapshots-{}", std::process::id())))]
    pub dir: PathBuf,
    /// Only restore the chain in this directory and check every file.
    #[arg(long, value_name = "DIR", conflicts_with = "dir")]
    pub verify: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// No progress on stderr.
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

fn check(p: &Params) -> Result<(), String> {
    crate::limits::check_guest(p.vcpus, p.mem)?;
    let hour = Duration::from_secs(3600);
    if p.every < Duration::from_millis(1) || p.every > hour {
        return Err(format!("--every {:?}: must be 1ms..=1h", p.every));
    }
    if p.duration > hour {
        return Err(format!("--duration {:?}: at most 1h", p.duration));
    }
    Ok(())
}

/// Runs `s2mmu snapshot` from the command line.
///
/// # Errors
/// A message naming the flag, the file or the step that failed, or the
/// restored memory differing from the guest's.
pub fn main(p: Params) -> Result<(), String> {
    let r = match &p.verify {
        Some(dir) => verify(dir).map_err(|e| e.to_string())?,
        None => run(&p)?,
    };
    crate::report::emit(&r, p.json);
    match r.failure() {
        Some(why) => Err(why.to_string()),
        None => Ok(()),
    }
}

/// `--verify DIR`: the chain restored and every file checked.
fn verify(dir: &std::path::Path) -> Result<Report, SnapshotError> {
    let t = Instant::now();
    let r = restore::restore(dir, format::MAX_MEM)?;
    let took = t.elapsed();
    let mut rep = Report::new(
        "snapshot-verify",
        json!({ "dir": dir.display().to_string() }),
    );
    let digests: Vec<String> = r
        .memory
        .iter()
        .map(|m| format!("{:016x}", xxhash_rust::xxh3::xxh3_64(m)))
        .collect();
    rep.result(
        "restore",
        "chain",
        json!({ "snapshots": r.snapshots, "pages": r.pages, "time_ns": took.as_nanos() as u64,
                "slot_digests": digests }),
    );
    rep.set_text(format!(
        "snapshot --verify {}: {} files, {} pages, restored in {}; slot digests (XXH3-64) {}\n",
        dir.display(),
        r.snapshots,
        r.pages,
        human(took),
        digests.join(" ")
    ));
    Ok(rep)
}

/// Runs the guest, takes the snapshots, restores them, compares
/// ([`s2mmu_migrate::sim::snapshot_run`]), and reports.
///
/// # Errors
/// A message naming the flag, the file or the step that failed.
pub fn run(p: &Params) -> Result<Report, String> {
    check(p)?;
    // The run is --duration long and silent until its report: say what
    // runs on stderr first (a bar on a terminal).
    let bar = Arc::new(crate::progress::Progress::new("snapshot", 2, !p.quiet));
    let shown = bar.clone();
    let progress = SessionProgress::to(move |e| match e {
        ProgressEvent::Line(l) => shown.message(l),
        ProgressEvent::Step => shown.step(),
    });
    let cfg = SnapshotRunConfig {
        mem: p.mem,
        vcpus: p.vcpus,
        dirty_rate: p.dirty_rate,
        every: p.every,
        duration: p.duration,
        dir: p.dir.clone(),
    };
    let r = snapshot_run::run(&cfg, &progress)?;
    drop(progress);
    drop(bar);
    Ok(report(
        p,
        &r.taken,
        r.restore_time,
        r.differing,
        r.first_differing,
    ))
}

fn report(
    p: &Params,
    taken: &[s2mmu_migrate::sim::snapshot_taker::TakeStat],
    restore_time: Duration,
    differ: u64,
    first: Option<u64>,
) -> Report {
    let mut r = Report::new(
        "snapshot",
        json!({ "mem": p.mem, "vcpus": p.vcpus, "dirty_rate": p.dirty_rate,
                "every_ns": p.every.as_nanos() as u64, "duration_ns": p.duration.as_nanos() as u64,
                "dir": p.dir.display().to_string() }),
    );
    let incr = &taken[1.min(taken.len())..];
    let times: Vec<Duration> = incr.iter().map(|t| t.time).collect();
    let sum = (!times.is_empty()).then(|| Summary::of(&times));
    for t in taken {
        r.result(
            &format!("snapshot {}", t.seq),
            if t.seq == 0 { "base" } else { "incremental" },
            json!({ "pages": t.pages, "bytes": t.bytes, "time_ns": t.time.as_nanos() as u64 }),
        );
    }
    r.result(
        "restore",
        "chain",
        json!({ "snapshots": taken.len(), "time_ns": restore_time.as_nanos() as u64,
                "pages_differing": differ }),
    );
    if differ > 0 {
        r.fail(format!(
            "the restored memory differs from the guest's in {differ} pages, the first at gpa {:#x}",
            first.unwrap_or(0)
        ));
    }
    let base = taken.first().map_or(0, |t| t.bytes);
    let incr_bytes: u64 = incr.iter().map(|t| t.bytes).sum();
    r.set_text(format!(
        "snapshot: {} guest, {} vCPUs dirtying {}/s, a snapshot every {} for {}, into {}\n\
         base: {:.1} MiB in {}; {} incrementals: {:.1} MiB in all, median take {}\n\
         restore of the chain: {}; pages differing from the guest at the stop point: {differ} [{}]\n",
        human_bytes(p.mem),
        p.vcpus,
        human_bytes(p.dirty_rate),
        human(p.every),
        human(p.duration),
        p.dir.display(),
        base as f64 / (1u64 << 20) as f64,
        human(taken.first().map_or(Duration::ZERO, |t| t.time)),
        incr.len(),
        incr_bytes as f64 / (1u64 << 20) as f64,
        sum.map_or("-".to_string(), |s| human(s.median)),
        human(restore_time),
        verdict(differ == 0),
    ));
    r
}
