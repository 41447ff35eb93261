//! `s2mmu migrate --wire-bench N`: the migration measured against the
//! wire (issue 28). For each channel count (`--channels`, default 1, 2
//! and 4), with TLS (the default) and without, N times: plain TCP between
//! the same loopback endpoints (no TLS, no framing, no checksum: what
//! iperf3 measures), then at once the migration; the medians of both, of
//! round 0's share of plain TCP and of the downtime, and each run's
//! figures in `--json`.

use super::migrate_in_process;
use super::net::{ephemeral_tls, NetConfig, Security};
use super::params::Params;
use super::report_text::MIB;
use crate::report::Report;
use serde_json::json;

/// The most runs per cell.
pub const MAX_WIRE_RUNS: u32 = 50;

/// One run's figures: plain TCP, the stack's link, round 0 (bytes per
/// second), downtime (ms), and the CPU ns per page on each side.
#[derive(Clone, Copy)]
struct Run {
    plain: f64,
    link: f64,
    round0: f64,
    downtime_ms: f64,
    send_cpu_ns: f64,
    recv_cpu_ns: f64,
}

/// Runs the benchmark and prints its table (or JSON).
///
/// # Errors
/// A bad option, or a migration that failed (named with its cell).
pub fn run(p: &Params, runs: u32) -> Result<(), String> {
    if runs == 0 || runs > MAX_WIRE_RUNS {
        return Err(format!("--wire-bench {runs}: 1 to {MAX_WIRE_RUNS} runs"));
    }
    let channels = match &p.channels {
        Some(_) => p.channel_list(),
        None => vec![1, 2, 4],
    };
    let mut report = Report::new("migrate_wire", super::report_text::params_json(p));
    let mut text = format!(
        "migrate against the wire: plain TCP (same loopback endpoints, same connection count, nothing else in the path) then the migration, back to back, {runs} run(s) per cell, medians\n  {:>4} {:>8} {:>15} {:>16} {:>14} {:>11} {:>12} {:>16} {:>16}\n",
        "TLS", "channels", "plain TCP MiB/s", "stack link MiB/s", "round 0 MiB/s", "% of plain", "downtime ms", "src CPU ns/page", "dst CPU ns/page"
    );
    for tls in [true, false] {
        for &ch in &channels {
            let cell = measure_cell(p, tls, ch, runs)?;
            let med = |f: fn(&Run) -> f64| median(cell.iter().map(f).collect());
            let pct: Vec<f64> = cell
                .iter()
                .map(|r| 100.0 * r.round0 / r.plain.max(1.0))
                .collect();
            text.push_str(&format!(
                "  {:>4} {:>8} {:>15.0} {:>16.0} {:>14.0} {:>10.0}% {:>12.1} {:>16.0} {:>16.0}\n",
                if tls { "yes" } else { "no" },
                ch,
                med(|r| r.plain) / MIB,
                med(|r| r.link) / MIB,
                med(|r| r.round0) / MIB,
                median(pct.clone()),
                med(|r| r.downtime_ms),
                med(|r| r.send_cpu_ns),
                med(|r| r.recv_cpu_ns),
            ));
            let name = format!("{}_channels_{ch}", if tls { "tls" } else { "plain" });
            report.result(
                &name,
                if tls { "tls" } else { "plain" },
                json!({
                    "channels": ch,
                    "tls": tls,
                    "runs": runs,
                    "plain_tcp_bytes_per_s": figures(cell.iter().map(|r| r.plain).collect()),
                    "stack_link_bytes_per_s": figures(cell.iter().map(|r| r.link).collect()),
                    "round0_bytes_per_s": figures(cell.iter().map(|r| r.round0).collect()),
                    "round0_pct_of_plain_tcp": figures(pct),
                    "downtime_ms": figures(cell.iter().map(|r| r.downtime_ms).collect()),
                    "source_cpu_ns_per_page": figures(cell.iter().map(|r| r.send_cpu_ns).collect()),
                    "destination_cpu_ns_per_page": figures(cell.iter().map(|r| r.recv_cpu_ns).collect()),
                }),
            );
        }
    }
    report.set_text(text);
    crate::report::emit(&report, p.json);
    Ok(())
}

/// `runs` migrations of one cell, each after its plain-TCP probe.
fn measure_cell(p: &Params, tls: bool, ch: u16, runs: u32) -> Result<Vec<Run>, String> {
    let mut out = Vec::new();
    for i in 0..runs {
        let net = NetConfig {
            io_timeout: p.io_timeout,
            security: if tls {
                ephemeral_tls().map_err(|e| e.to_string())?
            } else {
                Security::Plain
            },
        };
        let mut cfg = p.source_config(false)?;
        cfg.session.channels = ch;
        let mut dcfg = p.dest_config(false);
        dcfg.progress = false;
        let what = format!("TLS {tls}, {ch} channel(s), run {}", i + 1);
        let (s, d) = migrate_in_process(&cfg, &dcfg, &net).map_err(|e| format!("{what}: {e}"))?;
        let plain = s
            .plain_link
            .ok_or_else(|| format!("{what}: plain TCP was not measured"))?;
        let per = |ns: u64, pages: u64| ns as f64 / pages.max(1) as f64;
        out.push(Run {
            plain: plain.bytes_per_s(),
            link: s.link,
            round0: s.rounds.first().map_or(0.0, |r| r.bandwidth),
            downtime_ms: s.downtime.as_secs_f64() * 1e3,
            send_cpu_ns: per(s.send_stages.cpu_ns, s.send_stages.pages),
            recv_cpu_ns: per(d.recv_stages.cpu_ns, d.recv_stages.pages),
        });
        if !p.quiet {
            let r = out[out.len() - 1];
            eprintln!(
                "{what}: plain TCP {:.0} MiB/s, round 0 {:.0} MiB/s = {:.0}%, downtime {:.1} ms",
                r.plain / MIB,
                r.round0 / MIB,
                100.0 * r.round0 / r.plain.max(1.0),
                r.downtime_ms
            );
        }
    }
    Ok(out)
}

/// Each run's value and their median.
fn figures(v: Vec<f64>) -> serde_json::Value {
    json!({ "median": median(v.clone()), "each_run": v })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}
