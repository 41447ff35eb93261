//! The two ways to run a migration: both sides in this process
//! ([`migrate_in_process`], what [`main`] runs by default), or one side per
//! process (`--to` runs a source here, `--listen` a destination). The
//! migration itself is the library's (`s2mmu_migrate::session`, the
//! simulated guest's parts in `s2mmu_migrate::sim`); this chooses, shows
//! and reports.

use super::params::{channels_name, set_channels, Params};
use super::report_text::{
    dest_json, digests_text, harvest_name, params_json, policy_label, rate_text, report, Run, MIB,
};
use crate::progress::Progress;
use crate::report::{human_bytes, Report};
use s2mmu_bench::wire::plain_probe::{plain_link_in_process, plain_link_to, PlainLink};
use s2mmu_migrate::session::dest::DestOutcome;
use s2mmu_migrate::session::postcopy::control::{Control, ControlSocket};
use s2mmu_migrate::session::source::SourceOutcome;
use s2mmu_migrate::session::{Progress as SessionProgress, ProgressEvent};
use s2mmu_migrate::sim::dest::serve_attempts;
use s2mmu_migrate::sim::in_process::migrate_in_process;
use s2mmu_migrate::sim::source::{migrate_source_to, SimRun};
use s2mmu_migrate::transport as net;
use s2mmu_migrate::transport::NetConfig;
use s2mmu_plot::migration as plot;

/// `s2mmu migrate`.
///
/// # Errors
/// Why the migration failed (the process then exits nonzero).
pub fn main(p: Params) -> Result<(), String> {
    match (&p.listen, p.wire_bench) {
        (Some(addr), _) => return listen(&p, addr),
        (None, Some(n)) => return super::wire_bench::run(&p, n),
        (None, None) => {}
    }
    let policies: Vec<(bool, &str)> = if p.compare_policies {
        vec![(false, "fast_path"), (true, "baseline")]
    } else {
        vec![(
            p.uses_baseline(),
            if p.uses_baseline() {
                "baseline"
            } else {
                "fast_path"
            },
        )]
    };
    let channel_list = p.channel_list();
    if channel_list.len() > 1 && p.to.is_some() {
        return Err(
            "--to runs one migration (the destination exits after it): give one --channels count"
                .into(),
        );
    }
    if channel_list.len() > 1 && p.compare_policies {
        return Err("--compare-policies takes one --channels count".into());
    }
    let net = p.net_config()?;
    let control = start_control(&p, "source")?;
    let mut runs: Vec<Run> = Vec::new();
    for (baseline, name) in &policies {
        for &channels in &channel_list {
            let mut cfg = p.source_config(*baseline)?;
            set_channels(&mut cfg.session, channels, p.uses_tls());
            if p.compare_policies {
                cfg.session.label = format!("[{}] ", policy_label(&cfg.guest.policy));
            } else if channel_list.len() > 1 {
                cfg.session.label = format!("[{} channel(s)] ", channels_name(channels));
            }
            let policy = cfg.guest.policy;
            // Progress goes to stderr in every mode (--json's stdout is
            // unchanged), so no migration is silent until its end: a start
            // line, then the link and a line or a bar step per round.
            let bar = Progress::new(
                &format!("{}migrate", cfg.session.label),
                u64::from(cfg.session.max_rounds).saturating_add(2),
                !p.quiet,
            );
            if bar.is_on() {
                bar.line(&start_line(&cfg, p.to.as_deref(), &net));
            }
            cfg.session.progress = progress_to(bar);
            cfg.session.recovery.control = control.as_ref().map(|c| c.0.clone());
            let (s, d, plain) = run_one(&p, &cfg, *baseline, &net)?;
            let name = if channel_list.len() > 1 {
                format!("{name}_channels_{}", channels_name(channels))
            } else {
                name.to_string()
            };
            runs.push((name, s, d, policy, plain));
        }
    }
    if let Some(file) = p.plot_file() {
        write_plot(&p, file, &runs)?;
    }
    let report = report(&p, &runs);
    crate::report::emit(&report, p.json);
    report.failure().map_or(Ok(()), |why| Err(why.to_string()))
}

/// One migration of `cfg`: to `--to`'s address, or to a destination in
/// this process; with `--link-probe`, after plain TCP's figure (to the
/// sink beside `--to`'s address, or over loopback).
///
/// # Errors
/// The migration failed.
fn run_one(
    p: &Params,
    cfg: &SimRun,
    baseline: bool,
    net: &NetConfig,
) -> Result<(SourceOutcome, Option<DestOutcome>, Option<PlainLink>), String> {
    match &p.to {
        // A `--listen` destination listens on the one port it was given;
        // `--link-probe` measures plain TCP only where a sink listens on
        // the next port, and says "not measured" otherwise.
        Some(addr) => {
            let plain = cfg.session.link_probe.then(|| {
                plain_link_to(cfg, addr, net)
                    .map_err(|e| eprintln!("{}{e}: not measured", cfg.session.label))
                    .ok()
            });
            let s = migrate_source_to(cfg, addr, net).map_err(|e| e.to_string())?;
            Ok((s, None, plain.flatten()))
        }
        None => {
            let mut dcfg = p.sim_dest_config(baseline);
            dcfg.dest.progress = false;
            // Plain TCP over loopback with the same socket settings and
            // connection count, back to back with the migration.
            let plain = cfg
                .session
                .link_probe
                .then(|| plain_link_in_process(cfg, net).ok());
            let (s, d) = migrate_in_process(cfg, &dcfg, net).map_err(|e| e.to_string())?;
            Ok((s, Some(d), plain.flatten()))
        }
    }
}

/// `--plot FILE`: the figure of `runs` as SVG there and PNG beside it.
///
/// # Errors
/// The figure cannot be drawn or a file written.
fn write_plot(p: &Params, file: &str, runs: &[Run]) -> Result<(), String> {
    let plot_runs: Vec<plot::PlotRun<'_>> = runs
        .iter()
        .map(|(_, s, _, pol, _)| plot::PlotRun {
            label: policy_label(pol),
            outcome: s,
        })
        .collect();
    let title = format!(
        "s2mmu migrate: {} guest ({}), {} vCPUs dirtying {}, {} harvest",
        human_bytes(p.mem),
        p.format.name(),
        p.vcpus,
        rate_text(p.dirty_rate),
        harvest_name(p.harvest)
    );
    // Both drawn before either is written: a figure that cannot be
    // drawn leaves no file.
    let svg = plot::svg(&title, &plot_runs)?;
    let png = plot::png(&title, &plot_runs)?;
    let png_path = std::path::Path::new(file).with_extension("png");
    std::fs::write(file, svg).map_err(|e| format!("writing the plot {file}: {e}"))?;
    std::fs::write(&png_path, png)
        .map_err(|e| format!("writing the plot {}: {e}", png_path.display()))?;
    Ok(())
}

/// `--control`'s socket, served until the returned guard is dropped.
pub(super) fn start_control(
    p: &Params,
    side: &'static str,
) -> Result<Option<ControlSocket>, String> {
    p.recovery()?;
    match &p.control {
        Some(path) => Ok(Some(ControlSocket(
            Control::start(path, side).map_err(|e| e.to_string())?,
        ))),
        None => Ok(None),
    }
}

/// What a run migrates, where to and how: its first progress line.
fn start_line(cfg: &SimRun, to: Option<&str>, net: &NetConfig) -> String {
    let g = &cfg.guest;
    format!(
        "{}migrating a {} guest ({} stage 2, {}, {} vCPUs dirtying {}) {} over {} channel(s), {}",
        cfg.session.label,
        human_bytes(g.mem_size),
        g.format.name(),
        g.backing.name(),
        g.vcpus,
        rate_text(g.dirty_rate),
        match to {
            Some(a) => format!("to {a}"),
            None => "over loopback TCP in this process".into(),
        },
        match cfg.session.auto_channels {
            Some(_) => "auto".to_string(),
            None => cfg.session.channels.to_string(),
        },
        net.security.describe()
    )
}

/// The session's progress callback drawing on `bar`: its lines as lines
/// (or the bar's message), one step per round.
fn progress_to(bar: Progress) -> SessionProgress {
    if !bar.is_on() {
        return SessionProgress::off();
    }
    SessionProgress::to(move |e| match e {
        ProgressEvent::Line(l) => bar.line(l),
        ProgressEvent::Step => bar.step(),
    })
}

fn listen(p: &Params, addr: &str) -> Result<(), String> {
    p.source_config(p.uses_baseline())?;
    let net = p.net_config()?;
    let mut cfg = p.sim_dest_config(p.uses_baseline());
    cfg.dest.recovery = p.recovery()?;
    let control = start_control(p, "destination")?;
    cfg.dest.recovery.control = control.as_ref().map(|c| c.0.clone());
    let listener = net::bind(addr).map_err(|e| e.to_string())?;
    eprintln!(
        "destination listening on {} ({}); accepts a guest on --format {} with at most {} of memory, {} vCPUs, {} slot(s), {} channel(s)",
        listener.local(),
        net.security.describe(),
        cfg.format.name(),
        human_bytes(cfg.dest.limits.max_mem),
        cfg.dest.limits.max_vcpus,
        cfg.dest.limits.max_slots,
        cfg.dest.limits.max_channels
    );
    let d = serve_attempts(&*listener, &cfg, &net, p.attempts, &mut |n, e| {
        eprintln!(
            "the migration failed ({n} of --attempts {}): {e}; the guest was not resumed, serving the next source",
            p.attempts
        )
    })
    .map_err(|(n, e)| format!("the migration failed ({n} of --attempts {}): {e}", p.attempts))?;
    let mut r = Report::new("migrate", params_json(p));
    r.result(
        "destination",
        policy_label(&p.policy(p.uses_baseline())),
        dest_json(&d),
    );
    r.set_text(format!(
        "destination ({} stage 2): received {} page records ({} zero pages, {:.1} MiB) over {} channel(s); guest resumed from {} memory and ran {} ms at {:.1} MiB/s\n{}{}",
        p.format.name(),
        d.page_records,
        d.zero_pages,
        d.bytes as f64 / MIB,
        d.channels,
        match &d.postcopy {
            Some(f) => format!(
                "incomplete (post-copy: {} pages missing, {} remote faults, wait median {:.3} ms, p99 {:.3} ms, reference {:.3} ms, last page after {:.1} ms)",
                f.missing_pages,
                f.remote_faults,
                f.fault_median_ns as f64 / 1e6,
                f.fault_p99_ns as f64 / 1e6,
                f.reference_ns as f64 / 1e6,
                f.time_to_last_page_ns as f64 / 1e6
            ),
            None => "complete".into(),
        },
        p.run_after.as_millis(),
        d.resumed_write_rate * 4096.0 / MIB,
        digests_text(&d.slot_digests),
        match d.verify_mismatches {
            Some(0) => "byte comparison: every page equal\n".to_string(),
            Some(n) => format!("byte comparison: {n} pages DIFFER\n"),
            None => String::new(),
        }
    ));
    crate::report::emit(&r, p.json);
    d.verified()
}
