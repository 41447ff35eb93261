//! `s2mmu migrate --wire-bench N`: the migration measured against the
//! wire. N rounds; in each, for every channel count
//! (`--channels`, default 1, 2 and 4), with TLS (the default) and without,
//! back to back: iperf3 over loopback with as many connections and bytes
//! (where iperf3 is installed; otherwise the table says so), then the
//! migration, which first measures plain TCP between its own endpoints
//! (no TLS, no framing, no checksum: what iperf3 measures) and the stack's
//! own link. Each run also moves the guest's size (at most [`FLOOR_CAP`])
//! from one memory region into another over as many loopback connections
//! with the kernel's copies alone (and, for TLS, ring's AES-128-GCM records
//! alone): the memory floor, what round 0 could reach at best
//! (`s2mmu_bench::wire::memory_floor`). Rounds interleave the
//! cells, so the machine's other load
//! falls on all of them alike. Medians of every figure, round 0 as a share
//! of plain TCP and of iperf3, TLS against no TLS per channel count, and
//! each run's figures in `--json`.

use super::params::{channels_name, set_channels, Params, AUTO_CHANNELS};
use super::report_text::MIB;
use crate::report::Report;
use s2mmu_bench::wire::iperf;
use s2mmu_bench::wire::{WireCase, WireCell as Cell, WireRun as Run};
use serde_json::json;

pub use s2mmu_bench::wire::FLOOR_CAP;

/// The most runs per cell.
pub const MAX_WIRE_RUNS: u32 = 50;

/// Runs the benchmark and prints its table (or JSON).
///
/// # Errors
/// A bad option, or a migration or iperf3 run that failed (named with its
/// cell).
pub fn run(p: &Params, runs: u32) -> Result<(), String> {
    if runs == 0 || runs > MAX_WIRE_RUNS {
        return Err(format!("--wire-bench {runs}: 1 to {MAX_WIRE_RUNS} runs"));
    }
    let channels = match &p.channels {
        Some(_) => p.channel_list(),
        None => vec![1, 2, 4],
    };
    let iperf3 = iperf::version();
    let mut cells: Vec<Cell> = channels
        .iter()
        .flat_map(|&ch| {
            [true, false].map(|tls| Cell {
                tls,
                channels: ch,
                runs: Vec::new(),
            })
        })
        .collect();
    for i in 0..runs {
        for c in &mut cells {
            let r = measure(p, c.tls, c.channels, i, iperf3.is_some())?;
            c.runs.push(r);
        }
    }
    let mut params = super::report_text::params_json(p);
    params["iperf3"] = json!(iperf3);
    let mut report = Report::new("migrate_wire", params);
    for c in &cells {
        report.result(
            &format!(
                "{}_channels_{}",
                if c.tls { "tls" } else { "plain" },
                channels_name(c.channels)
            ),
            if c.tls { "tls" } else { "plain" },
            cell_json(c),
        );
    }
    report.set_text(text(&cells, runs, iperf3.as_deref()));
    crate::report::emit(&report, p.json);
    Ok(())
}

/// One run of one cell (the engine's [`s2mmu_bench::wire::measure`]), and
/// its line on stderr.
fn measure(p: &Params, tls: bool, ch: u16, i: u32, with_iperf3: bool) -> Result<Run, String> {
    let what = format!("TLS {tls}, {} channel(s), run {}", channels_name(ch), i + 1);
    let case = WireCase {
        what: &what,
        mem: p.mem,
        io_timeout: p.io_timeout,
        tls,
        // `auto` may choose up to 4: the wire at its widest.
        conns: if ch == AUTO_CHANNELS { 4 } else { ch },
        iperf3: with_iperf3,
    };
    let r = s2mmu_bench::wire::measure(&case, || {
        let mut cfg = p.source_config(false)?;
        set_channels(&mut cfg.session, ch, tls);
        let mut dcfg = p.sim_dest_config(false);
        dcfg.dest.progress = false;
        Ok((cfg, dcfg))
    })?;
    if !p.quiet {
        eprintln!(
            "{what}: iperf3 {}, plain TCP {:.0} MiB/s, memory floor {:.0} MiB/s, round 0 {:.0} MiB/s = {:.0}% of plain, {:.0}% of the floor (memory moved {:.0} MiB/s, {} pages compressed), downtime {:.1} ms",
            r.iperf3
                .map_or("not run".into(), |v| format!("{:.0} MiB/s", v / MIB)),
            r.plain / MIB,
            r.floor / MIB,
            r.round0 / MIB,
            100.0 * r.round0 / r.plain.max(1.0),
            100.0 * r.round0 / r.floor.max(1.0),
            r.round0_memory / MIB,
            r.compressed_pages,
            r.downtime_ms
        );
    }
    Ok(r)
}

fn cell_json(c: &Cell) -> serde_json::Value {
    let each = |f: fn(&Run) -> f64| figures(c.runs.iter().map(f).collect());
    json!({
        "channels": if c.channels == AUTO_CHANNELS { json!("auto") } else { json!(c.channels) },
        "chosen_channels": c.runs.iter().map(|r| r.chosen).collect::<Vec<_>>(),
        "tls": c.tls,
        "runs": c.runs.len(),
        "iperf3_bytes_per_s": c.runs.iter().map(|r| r.iperf3).collect::<Option<Vec<_>>>().map(figures),
        "plain_tcp_bytes_per_s": each(|r| r.plain),
        "memory_floor_bytes_per_s": each(|r| r.floor),
        "memory_floor_pct_of_plain_tcp": figures(c.floor_pct_plain()),
        "memory_floor_source_cpu_ns_per_page": each(|r| r.floor_send_ns),
        "memory_floor_destination_cpu_ns_per_page": each(|r| r.floor_recv_ns),
        "round0_pct_of_memory_floor": figures(c.pct_floor()),
        "stack_link_bytes_per_s": each(|r| r.link),
        "round0_bytes_per_s": each(|r| r.round0),
        "round0_memory_bytes_per_s": each(|r| r.round0_memory),
        "round0_memory_pct_of_memory_floor": each(|r| 100.0 * r.round0_memory / r.floor.max(1.0)),
        "compressed_pages": c.runs.iter().map(|r| r.compressed_pages).collect::<Vec<_>>(),
        "round0_pct_of_plain_tcp": figures(c.pct_plain()),
        "round0_pct_of_iperf3": c.pct_iperf3().map(figures),
        "plain_tcp_pct_of_iperf3": c.runs.iter().map(|r| r.iperf3.map(|i| 100.0 * r.plain / i.max(1.0))).collect::<Option<Vec<_>>>().map(figures),
        "downtime_ms": each(|r| r.downtime_ms),
        "source_cpu_ns_per_page": each(|r| r.send_cpu_ns),
        "destination_cpu_ns_per_page": each(|r| r.recv_cpu_ns),
        "stream_cores_busy_round0": each(Run::cores),
    })
}

/// The table of medians, then round 0 with and without TLS per channel
/// count.
fn text(cells: &[Cell], runs: u32, iperf3: Option<&str>) -> String {
    let floor_gib = FLOOR_CAP >> 30;
    let mut t = format!(
        "migrate against the wire, {runs} run(s) per cell, cells interleaved, medians; iperf3: {}\n  plain TCP = the migration's own probe of its endpoints just before it, over as many connections as channels (no TLS, no framing, no checksum)\n  floor = the memory floor: the guest's size (at most {floor_gib} GiB) moved from one memory region into another, prefaulted, over as many loopback connections, by the kernel's copies alone (TLS rows: and ring's AES-128-GCM in 16 KiB records); round 0 can at best reach it\n  cores = both ends' stream threads' CPU a page x round 0's pages a second (CPU-bound where it nears the machine's cores)\n  {:>4} {:>8} {:>12} {:>10} {:>10} {:>11} {:>10} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>5}\n",
        iperf3.map_or("not found on PATH (the plain probe only)".into(), |v| format!("{v}, a process pair per connection, -n guest memory")),
        "TLS", "channels", "iperf3 MiB/s", "plain MiB/s", "floor MiB/s", "stack MiB/s", "round 0", "% plain", "% floor", "% iperf3", "downtime", "src ns/pg", "dst ns/pg", "cores"
    );
    let opt = |v: Option<f64>, k: f64| v.map_or("-".to_string(), |x| format!("{:.0}", x / k));
    for c in cells {
        t.push_str(&format!(
            "  {:>4} {:>8} {:>12} {:>10.0} {:>10.0} {:>11.0} {:>10.0} {:>8.0}% {:>8.0}% {:>8}% {:>7.1}ms {:>10.0} {:>10.0} {:>5.2}\n",
            if c.tls { "yes" } else { "no" },
            channels_name(c.channels),
            opt(c.iperf3(), MIB),
            c.med(|r| r.plain) / MIB,
            c.med(|r| r.floor) / MIB,
            c.med(|r| r.link) / MIB,
            c.med(|r| r.round0) / MIB,
            median_or_zero(c.pct_plain()),
            median_or_zero(c.pct_floor()),
            opt(c.pct_iperf3().map(median_or_zero), 1.0),
            c.med(|r| r.downtime_ms),
            c.med(|r| r.send_cpu_ns),
            c.med(|r| r.recv_cpu_ns),
            c.med(Run::cores),
        ));
    }
    for c in cells.iter().filter(|c| c.channels == AUTO_CHANNELS) {
        let chosen: Vec<String> = c.runs.iter().map(|r| r.chosen.to_string()).collect();
        t.push_str(&format!(
            "  auto ({}) chose, run by run: {} (plain TCP and iperf3 over 4 connections, the most it may choose)\n",
            if c.tls { "TLS" } else { "no TLS" },
            chosen.join(", ")
        ));
    }
    t.push_str("\nthe memory floor as % of plain TCP, and its CPU a page (source / destination), medians\n");
    for c in cells {
        t.push_str(&format!(
            "  {} channel(s), {}: floor {:.0}% of plain TCP, {:.0} / {:.0} ns a page (round 0: {:.0} / {:.0})\n",
            channels_name(c.channels),
            if c.tls { "TLS (AES-128-GCM floor)" } else { "no TLS" },
            median_or_zero(c.floor_pct_plain()),
            c.med(|r| r.floor_send_ns),
            c.med(|r| r.floor_recv_ns),
            c.med(|r| r.send_cpu_ns),
            c.med(|r| r.recv_cpu_ns),
        ));
    }
    t.push_str(
        "\nround 0 as % of plain TCP (of iperf3), medians; targets: TLS 60 %, no TLS 85 %\n",
    );
    for pair in cells.chunks(2) {
        if let [tls, plain] = pair {
            let pi = |c: &Cell| opt(c.pct_iperf3().map(median_or_zero), 1.0);
            t.push_str(&format!(
                "  {} channel(s): TLS {:.0}% ({}%), no TLS {:.0}% ({}%); TLS round 0 = {:.0}% of no-TLS round 0\n",
                channels_name(tls.channels),
                median_or_zero(tls.pct_plain()),
                pi(tls),
                median_or_zero(plain.pct_plain()),
                pi(plain),
                100.0 * tls.med(|r| r.round0) / plain.med(|r| r.round0).max(1.0)
            ));
        }
    }
    t
}

/// Each run's value and their median.
fn figures(v: Vec<f64>) -> serde_json::Value {
    json!({ "median": median_or_zero(v.clone()), "each_run": v })
}

/// The median (0 for no runs, which no cell has).
fn median_or_zero(v: Vec<f64>) -> f64 {
    crate::stats::median(&v).unwrap_or(0.0)
}
