//! `s2mmu migrate --guest linux`: Debian's arm64 Linux, booted on one
//! QEMU machine under the engine's stage 2, migrated in this process to a
//! second QEMU machine through the migration library's session (pre-copy
//! over the engine's dirty log, stop-and-copy, the vCPU and device state,
//! the memories' digests compared, resume; loopback TLS unless
//! `--no-tls`; two processes with `--listen`/`--to`, see [`super::linux_net`])
//! with `--postcopy on|auto` ending in the session's post-copy (the
//! destination's stage-2 fault on a missing page is its request),
//! `--runs` times. The guest runs `counter` (one
//! small step a second: the destination must print the next step) or
//! `dirtier` (`--linux-run dirtier`: writes as fast as it can and
//! re-checks every page: the destination must print its `ok`). The run
//! itself is the arm64 migration crate's ([`s2mmu_arm64_migrate::session_run`]);
//! this module holds the flags' checks, the guest's choice and the report.

use super::linux_net;
use super::params::PostcopyArg;
use super::report_text::{parts_text, resume_parts_text};
use super::Params;
use crate::flags::flag;
use crate::report::{emit, Report};
use s2mmu_arm64::linux::assets::{self, AssetOptions};
use s2mmu_arm64::linux::dirty_limit::DirtyLimitCounters;
use s2mmu_arm64::linux::migrate::RestoreClock;
use s2mmu_arm64::machine::RamPages;
use s2mmu_arm64_migrate::console_gap::ConsoleGap;
use s2mmu_arm64_migrate::session_run::{
    self, GuestProgram, LinuxRun, PostcopyMode, RunDetails, RunSettings, WentOn,
};
use s2mmu_migrate::session::dest::DestOutcome;
use s2mmu_migrate::session::postcopy::PostcopyOutcome;
use s2mmu_migrate::session::source::{DowntimeParts, SourceOutcome};
use std::time::Duration;

/// Most `--runs`.
pub const MAX_RUNS: u32 = 20;

/// The run's settings from the flags (the simulated guest's session,
/// destination and connections).
///
/// # Errors
/// A flag out of range, by name.
pub fn settings(p: &Params) -> Result<RunSettings, String> {
    Ok(RunSettings {
        vcpus: p.vcpus,
        mem: p.mem,
        program: match p.linux_run.as_str() {
            "dirtier" => GuestProgram::Dirtier,
            "fill" => GuestProgram::Fill,
            _ => GuestProgram::Counter,
        },
        postcopy: p.postcopy.map(|a| match a {
            PostcopyArg::On => PostcopyMode::On,
            PostcopyArg::Start => PostcopyMode::Start,
            PostcopyArg::Auto => PostcopyMode::Auto,
        }),
        session: p.source_config(p.uses_baseline())?.session,
        net: p.net_config()?,
        dest: p.dest_config(),
        attempts: p.attempts,
        ram_pages: RamPages::parse(&p.linux_ram)?,
        engine: p.engine,
        hardware_dirty: linux_dirty(p.harvest)?,
    })
}

/// Whether `--dirty` asks the Linux guest's source for hardware dirty
/// state (`hw`) or write protection (`wp`), the two logs its session
/// drives by GET and CLEAR.
///
/// # Errors
/// Any other mode.
fn linux_dirty(m: s2mmu::mmu::DirtyMode) -> Result<bool, String> {
    use s2mmu::mmu::DirtyMode;
    match m {
        DirtyMode::HW => Ok(true),
        DirtyMode::WP => Ok(false),
        other => Err(format!(
            "--dirty {other:?}: the Linux guest's migration logs with wp or hw"
        )),
    }
}

/// A run's `details` in the JSON report and its summary line.
fn described(s: &RunSettings, r: &LinuxRun) -> (serde_json::Value, String) {
    let (extra, mut line) = match &r.details {
        RunDetails::Session {
            outcome,
            limit,
            dest,
        } => (
            {
                let mut v = serde_json::json!({"security": s.net.security.describe(),
                    "channels": outcome.channels, "link_bytes_per_s": (outcome.link_bytes > 0).then_some(outcome.link),
                    "page_records": outcome.page_records, "zero_pages": outcome.zero_pages});
                let m = v.as_object_mut().expect("an object");
                m.extend(session_json(outcome, limit));
                if let Some(d) = dest {
                    m.insert("destination".into(), dest_json(&d.0, &d.1));
                }
                v
            },
            format!(
                "through the session, {} over {} channel(s); the destination's digests \
                 equal the source's{}; downtime: {}{}",
                s.net.security.describe(),
                outcome.channels,
                braked(outcome, limit),
                parts_text(&outcome.downtime_parts),
                dest.as_ref()
                    .map_or(String::new(), |d| dest_text(&d.0, &d.1))
            ),
        ),
        RunDetails::Postcopy {
            figures: pc,
            parts,
            dest,
        } => {
            let f = &pc.figures;
            (
                postcopy_json(s, pc, parts, dest.as_deref()),
                format!(
                    "through the session, {}; post-copy {}: {} pages missing at \
                         the resume, {} requests (stage-2 faults; a faulting vCPU waited {:.2} \
                         ms median, {:.2} ms p99), {} pages answered and {} streamed in {:.1} \
                         ms; {} recoveries; the pages B's guest did not write equal the \
                         source's; downtime: {}{}",
                    s.net.security.describe(),
                    if s.postcopy == Some(PostcopyMode::Start) {
                        "from the start".to_string()
                    } else {
                        format!("after round {}", pc.after_round)
                    },
                    f.missing_pages,
                    f.requests,
                    f.fault_median_ns as f64 / 1e6,
                    f.fault_p99_ns as f64 / 1e6,
                    f.answered_pages,
                    f.background_pages,
                    f.time_to_last_page_ns as f64 / 1e6,
                    pc.recoveries,
                    parts_text(parts),
                    dest.as_ref()
                        .map_or(String::new(), |d| dest_text(&d.0, &d.1))
                ),
            )
        }
    };
    match &r.went_on {
        Some(WentOn::DirtierOk(ok)) => line += &format!("; B: {ok}"),
        Some(WentOn::CounterStep(n)) => line += &format!("; B went on at counter step {n}"),
        Some(WentOn::Printed(l)) => line += &format!("; B's guest printed {l:?}"),
        None => {}
    }
    (extra, line)
}

/// A post-copy run's `details`: the switch's downtime parts, the
/// destination's outcome (when it ran in this process) and post-copy's
/// figures.
fn postcopy_json(
    s: &RunSettings,
    pc: &PostcopyOutcome,
    parts: &DowntimeParts,
    dest: Option<&(DestOutcome, RestoreClock)>,
) -> serde_json::Value {
    let f = &pc.figures;
    serde_json::json!({"security": s.net.security.describe(),
                "downtime_parts_ns": super::outcome_json::downtime_parts_json(parts),
                "destination": dest.map(|d| dest_json(&d.0, &d.1)),
                "after_round": pc.after_round, "missing": f.missing_pages,
                "requests": f.requests, "remote_faults": f.remote_faults,
                "answered_pages": f.answered_pages, "background_pages": f.background_pages,
                "dropped_duplicates": f.dropped_duplicates, "recoveries": pc.recoveries,
                "postcopy_bytes": pc.bytes,
                "postcopy_ms": f.time_to_last_page_ns as f64 / 1e6,
                "fault_wait_ms": {"median": f.fault_median_ns as f64 / 1e6,
                    "p99": f.fault_p99_ns as f64 / 1e6},
                "answered_fault_wait_ms": {"faults": f.answered_faults,
                    "median": f.answered_median_ns as f64 / 1e6,
                    "p99": f.answered_p99_ns as f64 / 1e6},
                "request_reference_ms": f.reference_ns as f64 / 1e6})
}

/// Round 0's pages, zero pages and data pages per second, the sender's
/// stage costs, and what the guest's throttle and pace did (the figures
/// the simulated guest's report gives).
fn session_json(
    o: &SourceOutcome,
    l: &DirtyLimitCounters,
) -> serde_json::Map<String, serde_json::Value> {
    let r0 = o.rounds.first();
    let secs = r0.map_or(0.0, |r| r.end_s - r.start_s);
    let data = r0.map_or(0, |r| r.pages - r.zero_pages);
    let v = serde_json::json!({
        "round0_pages": r0.map(|r| r.pages),
        "round0_zero_pages": r0.map(|r| r.zero_pages),
        "round0_data_pages_per_s": (secs > 0.0).then(|| data as f64 / secs),
        "round0_bytes_per_s": r0.map(|r| r.bandwidth),
        "downtime_parts_ns": super::outcome_json::downtime_parts_json(&o.downtime_parts),
        "stages": super::outcome_json::send_stages_json(&o.send_stages),
        "max_throttle_pct": o.max_throttle_pct,
        "final_pace_pages_per_s_per_vcpu": o.final_pace,
        "guest_write_faults": l.write_faults,
        "throttled_ns": l.throttled_ns,
        "paced_faults": l.paced_faults,
        "paced_ns": l.paced_ns,
        "el2_paced_exits": l.el2_paced_exits,
    });
    match v {
        serde_json::Value::Object(m) => m,
        _ => serde_json::Map::new(),
    }
}

/// The destination's part of the downtime and its restore's, in words.
fn dest_text(d: &DestOutcome, r: &RestoreClock) -> String {
    format!(
        "; the destination's part {}; its start: counter {:.1}, threads {:.1}, first \
         instruction {:.1} ms (seen by the host at {:.1} ms; the counter's anchor within \
         {:.2} ms)",
        resume_parts_text(&d.resume_parts),
        ms(r.counter),
        ms(r.threads),
        ms(r.first_instruction),
        ms(r.first_seen),
        ms(r.anchor_round_trip)
    )
}

/// The destination's outcome (what it received, its stages, its part of
/// the downtime) and its machine's restore clock.
fn dest_json(d: &DestOutcome, r: &RestoreClock) -> serde_json::Value {
    let mut v = super::outcome_json::dest_json(d);
    if let Some(m) = v.as_object_mut() {
        m.insert(
            "restore_ns".into(),
            serde_json::json!({
                "counter": r.counter.as_nanos() as u64,
                "threads": r.threads.as_nanos() as u64,
                "first_instruction": r.first_instruction.as_nanos() as u64,
                "first_seen": r.first_seen.as_nanos() as u64,
                "anchor_round_trip": r.anchor_round_trip.as_nanos() as u64,
            }),
        );
    }
    v
}

/// The throttle's and the pace's part in a run, if they acted.
fn braked(o: &SourceOutcome, l: &DirtyLimitCounters) -> String {
    if l.throttled_ns == 0 && l.paced_faults == 0 {
        return String::new();
    }
    format!(
        "; throttle up to {}% ({:.1} ms slept), pace {} pages/s per vCPU at the end ({} \
         faults paced, {:.1} ms slept)",
        o.max_throttle_pct,
        l.throttled_ns as f64 / 1e6,
        o.final_pace,
        l.paced_faults,
        l.paced_ns as f64 / 1e6
    )
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The largest gap between the guest programs' console lines, where it
/// falls, and how many lines there were.
fn gap_json(g: &ConsoleGap) -> serde_json::Value {
    let largest = g.largest();
    serde_json::json!({
        "lines": g.lines.len(),
        "largest_ms": largest.map(|(l, _)| l.gap_ms),
        "largest_ends_at_s": largest.map(|(l, _)| l.at_s),
        "largest_where": largest.map(|(_, at)| at.describe()),
    })
}

/// Median, least and most (all 0 for no runs).
fn summary(v: Vec<f64>) -> (f64, f64, f64) {
    let v = crate::stats::sorted(&v);
    match (crate::stats::median(&v), v.first(), v.last()) {
        (Some(mid), Some(&lo), Some(&hi)) => (mid, lo, hi),
        _ => (0.0, 0.0, 0.0),
    }
}

/// Round 0's pages per second.
fn round0_rate(r: &LinuxRun) -> f64 {
    match (r.round_pages.first(), r.round_ms.first()) {
        (Some(&n), Some(&t)) if t > 0.0 => n as f64 / (t / 1e3),
        _ => 0.0,
    }
}

/// Options only the simulated guest takes (its workload, tables, checks
/// and benchmarks): refused with `--guest linux`; with `--guest auto` they
/// choose the simulated guest.
pub const SIM_ONLY: &[&str] = &[
    "backing",
    "slots",
    "dirty_rate",
    "pattern",
    "split",
    "policy",
    "baseline",
    "compare_policies",
    "format",
    "check",
    "inject_lost_marks",
    "snapshot_every",
    "snapshot_dir",
    "wire_bench",
];

/// Options only the Linux guest takes: refused with `--guest sim`; with
/// `--guest auto` they choose the Linux guest. Every other option (the
/// transport, its security, the session's) applies to both and never
/// changes the choice.
pub const LINUX_ONLY: &[&str] = &[
    "runs",
    "linux_run",
    "linux_ram",
    "engine",
    "kernel",
    "initrd",
    "cmdline",
    "console_dir",
    "linux_args",
    "console_stdout",
];

/// The guest `--guest` and the options `given` (their ids) ask for:
/// `Some(true)` the Linux guest, `Some(false)` the simulated one, `None`
/// (`--guest auto` with neither kind of option) whichever can run.
///
/// # Errors
/// An option the chosen guest does not take, by name.
pub fn route(guest: &str, given: &[String]) -> Result<Option<bool>, String> {
    let first = |set: &[&str]| {
        given
            .iter()
            .find(|g| set.contains(&g.as_str()))
            .map(|g| flag(g))
    };
    let (sim, linux) = (first(SIM_ONLY), first(LINUX_ONLY));
    match (guest, sim, linux) {
        ("linux", Some(f), _) => Err(format!(
            "{f} is an option of the simulated guest, not of --guest linux"
        )),
        ("sim", _, Some(f)) => Err(format!(
            "{f} is an option of the Linux guest, not of --guest sim"
        )),
        ("linux", None, _) => Ok(Some(true)),
        ("sim", _, None) => Ok(Some(false)),
        (_, Some(s), Some(l)) => Err(format!(
            "{s} (the simulated guest's) and {l} (the Linux guest's) together: give --guest"
        )),
        (_, Some(_), None) => Ok(Some(false)),
        (_, None, Some(_)) => Ok(Some(true)),
        (_, None, None) => Ok(None),
    }
}

/// Whether `migrate` runs the Linux guest ([`route`]): for `--guest auto`
/// with no option of either guest, when its prerequisites (QEMU, the EL2
/// image, the kernel and initramfs) are there; when they are not, says so
/// and how to get them.
///
/// # Errors
/// As [`route`].
pub fn chosen(p: &Params, given: &[String]) -> Result<bool, String> {
    if let Some(linux) = route(&p.guest, given)? {
        return Ok(linux);
    }
    let why = match s2mmu_arm64::available() {
        Err(e) => e,
        Ok(()) => match assets::ensure(&AssetOptions::from_env()) {
            Err(e) => e.to_string(),
            Ok(_) => {
                if !p.quiet {
                    eprintln!(
                        "migrate: the Linux guest (Debian arm64 on two QEMU machines in this \
                         process); --guest sim for the simulated VM"
                    );
                }
                return Ok(true);
            }
        },
    };
    eprintln!(
        "migrate: the simulated guest, because the Linux guest cannot run here: {why}\n\
         migrate: for the Linux guest run {} and this command again",
        assets::setup_hint()
    );
    Ok(false)
}

/// `s2mmu migrate --guest linux`.
///
/// # Errors
/// A bad option, missing assets or QEMU, a failed migration.
pub fn main(p: &Params) -> Result<(), String> {
    if !(1..=MAX_RUNS).contains(&p.runs) {
        return Err(format!("--runs {}: 1 to {MAX_RUNS}", p.runs));
    }
    if p.runs != 1 && (p.listen.is_some() || p.to.is_some()) {
        return Err(format!(
            "--runs {} with --listen or --to: two processes run one migration",
            p.runs
        ));
    }
    // Every flag the session takes is checked before anything starts.
    let mut s = settings(p)?;
    p.linux_guest.settle(&mut s)?;
    s2mmu_arm64::available().map_err(|e| format!("--guest linux needs the arm64 model: {e}"))?;
    let a = assets::ensure(&AssetOptions::from_env())
        .map_err(|e| format!("--guest linux needs Debian's arm64 kernel: {e}"))?;
    let mut cfg = session_run::linux_config(&s, &a);
    p.linux_guest.apply(&mut s, &mut cfg)?;
    // `--control PATH` (with --listen or --to): this side's socket for the
    // operator's `s2mmu migrate-ctl` (status, recover [ADDR], cancel), as
    // the simulated guest's; served until this returns.
    let side = if p.listen.is_some() {
        "destination"
    } else {
        "source"
    };
    let control = super::drivers::start_control(p, side)?;
    s.session.recovery.control = control.as_ref().map(|c| c.0.clone());
    s.dest.recovery.control = s.session.recovery.control.clone();
    if let Some(addr) = &p.listen {
        return linux_net::listen(&s, &cfg, addr, &p.linux_guest, p.json);
    }
    let mut runs = Vec::new();
    for i in 0..p.runs {
        let r = match &p.to {
            Some(addr) => linux_net::source_to(&s, addr, session_run::boot_source(&s, &cfg)?)?,
            None => session_run::migrate_once(&s, &cfg)?,
        };
        if !p.quiet {
            eprintln!(
                "run {}: downtime {:.1} ms to RESUMED back at the source{}, round 0 {:.0} \
                 pages/s, {} rounds, {} pages at the switch, {} state bytes; {}",
                i + 1,
                ms(r.downtime),
                r.to_first_instruction.map_or(String::new(), |d| format!(
                    ", {:.1} ms to the destination's first guest instruction",
                    ms(d)
                )),
                round0_rate(&r),
                r.round_pages.len(),
                r.final_pages,
                r.state_bytes,
                described(&s, &r).1
            );
        }
        p.linux_guest
            .show(Some(&r.consoles.0), r.consoles.1.as_deref())?;
        runs.push(r);
    }
    report(p, &s, &runs);
    match p.plot_file() {
        Some(file) => super::linux_plot::write(file, &runs),
        None => Ok(()),
    }
}

fn report(p: &Params, s: &RunSettings, runs: &[LinuxRun]) {
    let down = summary(runs.iter().map(|r| ms(r.downtime)).collect());
    let rate = summary(runs.iter().map(round0_rate).collect());
    let mode = match p.postcopy {
        None => "pre-copy",
        Some(PostcopyArg::On) => "post-copy after round 0",
        Some(PostcopyArg::Start) => "post-copy from the start",
        Some(PostcopyArg::Auto) => "pre-copy, post-copy if it does not converge",
    };
    let params = serde_json::json!({
        "guest": "linux", "program": p.linux_run, "mode": mode, "vcpus": p.vcpus,
        "ram_pages": p.linux_ram, "mem_bytes": p.mem, "runs": p.runs,
        "engine": format!("{:?}", p.engine).to_lowercase(),
        "dirty": if p.harvest.hardware() { "hw" } else { "wp" },
    });
    let mut rep = Report::new("migrate", params);
    for (i, r) in runs.iter().enumerate() {
        rep.result(
            &format!("run {}", i + 1),
            "s2mmu",
            serde_json::json!({
                "downtime_ms": ms(r.downtime), "rounds": r.round_pages.len(),
                "downtime_first_instruction_ms": r.to_first_instruction.map(ms),
                "pause_unix_ns": r.pause_unix_ns,
                "total_ms": ms(r.total), "precopy_ms": ms(r.precopy),
                "setup_ms": ms(r.setup.total()),
                "setup_parts_ms": {"channel_probe": ms(r.setup.channel_probe),
                    "connect": ms(r.setup.connect), "link_probe": ms(r.setup.link_probe)},
                "to_last_byte_sent_ms": ms(r.to_last_byte_sent),
                "stream_bytes": r.stream_bytes,
                "compression": {"setting": r.compression.name(), "pages": r.compressed.pages,
                    "raw_bytes": r.compressed.raw_bytes, "wire_bytes": r.compressed.wire_bytes,
                    "bytes_saved": r.compressed.saved()},
                "round_pages": r.round_pages, "round_ms": r.round_ms,
                "final_pages": r.final_pages, "state_bytes": r.state_bytes,
                "ram_a": r.ram_a.describe(), "ram_b": r.ram_b.as_ref().map(|b| b.describe()),
                "details": described(s, r).0, "console_gap": gap_json(&r.console_gap),
            }),
        );
    }
    rep.result(
        "all runs",
        "s2mmu",
        serde_json::json!({
            "downtime_ms": {"median": down.0, "min": down.1, "max": down.2},
            "round0_pages_per_s": {"median": rate.0, "min": rate.1, "max": rate.2},
        }),
    );
    let mut text = format!(
        "Linux guest ({}, {mode}), {} vCPU(s), {} MiB, {} run(s): downtime median {:.1} ms \
         (min {:.1}, max {:.1}); round 0 median {:.0} pages/s\n",
        p.linux_run,
        p.vcpus,
        p.mem >> 20,
        p.runs,
        down.0,
        down.1,
        down.2,
        rate.0
    );
    if let Some(r) = runs.first() {
        text += &format!("QEMU's RAM: A's {}\n", r.ram_a.describe());
        if let Some(b) = &r.ram_b {
            text += &format!("QEMU's RAM: B's {}\n", b.describe());
        }
    }
    let gaps: Vec<String> = (runs.iter().enumerate())
        .filter_map(|(i, r)| r.console_gap.largest().map(|g| (i, g)))
        .map(|(i, (l, at))| format!("run {} {:.1} ms {}", i + 1, l.gap_ms, at.describe()))
        .collect();
    if !gaps.is_empty() {
        text += &format!("largest console gap (host clock): {}\n", gaps.join("; "));
    }
    text += "note: QEMU timings are an emulator's (TCG), on this machine: read them as ratios\n";
    rep.set_text(text);
    emit(&rep, p.json);
}
