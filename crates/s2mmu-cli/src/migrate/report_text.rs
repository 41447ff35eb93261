//! What a migration run reports: the JSON rows and the summary text.

pub(super) use super::outcome_json::dest_json;
use super::outcome_json::{per_page, source_json};
use super::params::{ConvergeArg, Params};
use crate::report::{human_bytes, verdict, Report};
use s2mmu::mmu::{DirtyMode, FaultPath, MmuPolicy};
use s2mmu_bench::wire::plain_probe::PlainLink;
use s2mmu_migrate::session::dest::DestOutcome;
use s2mmu_migrate::session::extras::ExtrasOutcome;
use s2mmu_migrate::session::source::{ChannelChoice, SourceOutcome};
use s2mmu_migrate::wire::PAGE_SIZE as PAGE;
use serde_json::json;
use std::time::Duration;

pub(super) const MIB: f64 = (1u64 << 20) as f64;

/// One run: its name, the source's and the destination's outcomes, the
/// policy it ran with, plain TCP's figure before it (with `--link-probe`).
pub(super) type Run = (
    String,
    SourceOutcome,
    Option<DestOutcome>,
    MmuPolicy,
    Option<PlainLink>,
);

pub(super) fn digests_text(d: &[(u16, u64)]) -> String {
    d.iter()
        .map(|(id, h)| format!("  slot {id} digest {h:#018x}\n"))
        .collect()
}

pub(super) fn params_json(p: &Params) -> serde_json::Value {
    json!({
        "mem_bytes": p.mem,
        "vcpus": p.vcpus,
        "backing": p.backing,
        "slots": p.slots,
        "dirty_rate_bytes_per_s": p.dirty_rate,
        "pattern": format!("{:?}", p.pattern).to_lowercase(),
        "harvest": p.harvest.name(),
        "ring_entries": p.harvest.ring_entries(),
        "clear_chunk_bytes": p.clear_chunk,
        "baseline": p.uses_baseline(),
        "split": p.split.map(|s| format!("{s:?}").to_lowercase()),
        "max_downtime_ns": p.max_downtime.as_nanos() as u64,
        "max_rounds": p.max_rounds,
        "bandwidth_bytes_per_s": p.bandwidth,
        "converge": format!("{:?}", p.converge).to_lowercase(),
        "verify_full": p.verify_full,
        "warmup_ns": p.warmup.as_nanos() as u64,
        "run_after_ns": p.run_after.as_nanos() as u64,
        "plot": p.plot,
        "listen": p.listen,
        "to": p.to,
        "compare_policies": p.compare_policies,
        "channels": p.channel_list(),
        "io_timeout_ns": p.io_timeout.as_nanos() as u64,
        "tls": p.tls_cert.is_some(),
        "psk": p.psk.is_some(),
        "no_tls": p.no_tls,
        "no_prefault": p.no_prefault,
        "postcopy": p.postcopy.map(|w| format!("{w:?}").to_lowercase()),
        "format": p.format.name(),
    })
}

/// `--channels auto`'s line of the summary (nothing without it).
fn choice_text(s: &SourceOutcome) -> String {
    s.channel_choice.as_ref().map_or(String::new(), |c| {
        format!(
            "  channels auto        {} chosen by a probe of round 0's pipeline on this host: {}\n",
            c.chosen,
            choice_probes(c).join(", ")
        )
    })
}

/// `--channels auto`'s probes in words.
fn choice_probes(c: &ChannelChoice) -> Vec<String> {
    c.probes
        .iter()
        .map(|p| {
            format!(
                "{} channel(s) {:.0} MiB/s",
                p.channels,
                p.pages_per_s() * PAGE as f64 / MIB
            )
        })
        .collect()
}

/// Round 0 per channel count against plain TCP over the same loopback.
fn channel_table(runs: &[Run], text: &mut String) {
    text.push_str(&format!(
        "\nRound 0 by channel count (measured on this machine, {} CPUs, this run; % of plain TCP over the same loopback)\n  {:>8} {:>15} {:>16} {:>14} {:>10} {:>10} {:>8}\n",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        "channels", "plain TCP MiB/s", "stack link MiB/s", "round 0 MiB/s", "% of plain", "downtime", "memory"
    ));
    for (_, s, _, _, plain) in runs {
        let r0 = s.rounds.first().map_or(0.0, |r| r.bandwidth);
        let plain = plain.map_or(0.0, |l| l.bytes_per_s());
        text.push_str(&format!(
            "  {:>8} {:>15.0} {:>16.0} {:>14.0} {:>9.0}% {:>8.1}ms {:>8}\n",
            s.channels,
            plain / MIB,
            s.link / MIB,
            r0 / MIB,
            100.0 * r0 / plain.max(1.0),
            s.downtime.as_secs_f64() * 1e3,
            "equal"
        ));
    }
}

pub(super) fn report(p: &Params, runs: &[Run]) -> Report {
    let mut r = Report::new("migrate", params_json(p));
    let mut text = String::new();
    for (name, s, d, pol, plain) in runs {
        let mut row = source_json(s, *plain);
        if let (Some(d), serde_json::Value::Object(m)) = (d, &mut row) {
            m.insert("destination".into(), dest_json(d));
        }
        r.result("migrate", name, row);
        text.push_str(&summary(p, s, d.as_ref(), pol, *plain));
        extras_report(&s.extras, &mut r, &mut text);
    }
    if p.compare_policies && runs.len() == 2 {
        let (a, b) = (&runs[0].1, &runs[1].1);
        let ns = |d: std::time::Duration| d.as_nanos() as f64;
        for (metric, base, ours) in [
            (
                "guest_ns_per_write_logging",
                b.during.ns_per_write,
                a.during.ns_per_write,
            ),
            ("downtime_ns", ns(b.downtime), ns(a.downtime)),
            ("total_ns", ns(b.total), ns(a.total)),
        ] {
            r.compare("migrate", metric, base, ours);
        }
        text.push_str(&format!(
            "\nGuest slowdown while logging, side by side\n  {:<46} {:>12} {:>12} {:>10} {:>10} {:>7}\n",
            "policy", "ns/write pre", "ns/write log", "slowdown", "downtime", "rounds"
        ));
        for (_, s, _, pol, _) in runs {
            text.push_str(&format!(
                "  {:<46} {:>12.0} {:>12.0} {:>9.0}% {:>8.1}ms {:>7}\n",
                policy_label(pol),
                s.before.ns_per_write,
                s.during.ns_per_write,
                s.slowdown_pct(),
                s.downtime.as_secs_f64() * 1e3,
                s.rounds.len()
            ));
        }
        let (fa, fb) = (a.during.ns_per_write, b.during.ns_per_write);
        text.push_str(&format!(
            "  fast path + eager split: {} guest time per write while logging than the baseline ({:.2}x)\n",
            if fa < fb { "less" } else { "NOT less" },
            fb / fa.max(1e-9)
        ));
    }
    if p.channel_list().len() > 1 && runs.len() > 1 {
        channel_table(runs, &mut text);
    }
    if let Some(file) = p.plot_file() {
        text.push_str(&format!(
            "plot: {file} and {}\n",
            std::path::Path::new(file).with_extension("png").display()
        ));
    }
    r.set_text(text);
    r
}

pub(super) fn summary(
    p: &Params,
    s: &SourceOutcome,
    d: Option<&DestOutcome>,
    pol: &MmuPolicy,
    plain: Option<PlainLink>,
) -> String {
    let precopy = s.rounds.iter().filter(|r| !r.final_round).count();
    let mut t = format!(
        "\nMigrated a {} guest ({} stage 2, {}, {} slot(s)), {} vCPUs dirtying {} ({}), {} harvest, {}\n",
        human_bytes(p.mem),
        p.format.name(),
        p.backing,
        p.slots,
        p.vcpus,
        rate_text(p.dirty_rate),
        format!("{:?}", p.pattern).to_lowercase(),
        harvest_name(p.harvest),
        policy_label(pol)
    );
    if let Some(pc) = &s.postcopy {
        t.push_str(&super::postcopy_report::text(pc, s, p.max_downtime));
    } else {
        t.push_str(&format!(
        "  converged after {precopy} pre-copy round(s) + stop-and-copy\n  total time           {:.3} s (logging on to resumed on the destination)\n  downtime             {:.1} ms (budget {} ms): {}\n",
        s.total.as_secs_f64(),
        s.downtime.as_secs_f64() * 1e3,
        p.max_downtime.as_millis(),
        if s.downtime <= p.max_downtime { "within budget" } else { "OVER BUDGET" }
    ));
        t.push_str(&downtime_lines(s, d));
    }
    let per_round: Vec<String> = s
        .rounds
        .iter()
        .map(|r| {
            if r.final_round {
                format!("{} (paused)", r.pages)
            } else {
                r.pages.to_string()
            }
        })
        .collect();
    t.push_str(&format!(
        "  pages sent per round {}\n  sent in total        {} pages ({} zero pages sent as a flag), {:.1} MiB\n",
        per_round.join(", "),
        s.page_records,
        s.zero_pages,
        s.bytes as f64 / MIB
    ));
    let c = &s.compressed;
    t.push_str(&format!(
        "  compression          {}: {} pages sent compressed, {:.1} MiB of them as {:.1} MiB ({:.1} MiB saved)\n",
        s.compression,
        c.pages,
        c.raw_bytes as f64 / MIB,
        c.wire_bytes as f64 / MIB,
        c.saved() as f64 / MIB
    ));
    t.push_str(&link_text(s));
    t.push_str(&choice_text(s));
    t.push_str(&plain_and_stages(s, d, plain));
    t.push_str(&guest_and_checks(p, s, d));
    t
}

/// The summary's lines on the stack's own link (measured only with
/// `--link-probe`) and round 0 against it.
fn link_text(s: &SourceOutcome) -> String {
    let of_link = |bw: f64| match s.link_bytes {
        0 => String::new(),
        _ => format!(" ({:.0}%)", 100.0 * bw / s.link.max(1.0)),
    };
    let rates: Vec<String> = s
        .rounds
        .iter()
        .map(|r| format!("{:.0} MiB/s{}", r.bandwidth / MIB, of_link(r.bandwidth)))
        .collect();
    if s.link_bytes == 0 {
        return format!(
            "  link                 not measured (--link-probe sends as many bytes as guest memory before the migration to measure it)\n  throughput per round {}\n",
            rates.join(", ")
        );
    }
    let mut t = format!(
        "  link                 {:.1} MiB/s: {:.1} MiB over the same {} connection(s) with no guest and no checksum, just before the migration\n  throughput per round {} (% of link)\n",
        s.link / MIB,
        s.link_bytes as f64 / MIB,
        s.channels,
        rates.join(", ")
    );
    if let Some(r0) = s.rounds.first() {
        t.push_str(&format!(
            "  round 0              {:.1} MiB/s = {:.0}% of the stack's own link\n",
            r0.bandwidth / MIB,
            100.0 * r0.bandwidth / s.link.max(1.0)
        ));
    }
    t
}

/// The summary's lines on plain TCP (the honest link) and on where the
/// time went, stage by stage, on each side.
fn plain_and_stages(
    s: &SourceOutcome,
    d: Option<&DestOutcome>,
    plain: Option<PlainLink>,
) -> String {
    let mut t = String::new();
    match (plain, s.rounds.first()) {
        (Some(l), Some(r0)) => t.push_str(&format!(
            "  plain TCP            {:.1} MiB/s over {} connection(s), same endpoints, nothing else in the path (what iperf3 measures): round 0 = {:.0}% of it, the stack's own link = {:.0}%\n",
            l.bytes_per_s() / MIB,
            l.channels,
            100.0 * r0.bandwidth / l.bytes_per_s().max(1.0),
            100.0 * s.link / l.bytes_per_s().max(1.0)
        )),
        _ if s.link_bytes == 0 => t.push_str("  plain TCP            not measured (--link-probe measures it)\n"),
        _ => t.push_str("  plain TCP            not measured (no plain-TCP sink answered: a Unix socket, or none beside the destination; see stderr)\n"),
    }
    let x = &s.send_stages;
    t.push_str(&format!(
        "  source, ns per page  read+zero check {:.0}, hash {:.0}, encrypt {:.0}, socket {:.0}; CPU {:.0} ({} pages, all rounds)\n",
        per_page(x.read_ns, x.pages),
        per_page(x.hash_ns, x.pages),
        per_page(x.encrypt_ns(), x.pages),
        per_page(x.socket_ns, x.pages),
        per_page(x.cpu_ns, x.pages),
        x.pages
    ));
    if let Some(d) = d {
        let r = &d.recv_stages;
        t.push_str(&format!(
            "  destination, ns/page socket {:.0}, decrypt+copy into guest memory {:.0}, checks {:.0}; CPU {:.0} ({} pages up to END)\n",
            per_page(r.socket_ns, r.pages),
            per_page(r.decrypt_copy_ns(), r.pages),
            per_page(r.check_ns, r.pages),
            per_page(r.cpu_ns, r.pages),
            r.pages
        ));
    }
    t
}

/// The summary's lines on the guest (its dirty rate and slowdown, the
/// convergence help it got), the verification and the destination.
fn guest_and_checks(p: &Params, s: &SourceOutcome, d: Option<&DestOutcome>) -> String {
    let mut t = String::new();
    t.push_str(&format!(
        "  guest dirty rate     {:.1} MiB/s before logging, {:.1} MiB/s while logging\n  guest time per write {:.0} ns before logging, {:.0} ns while logging: slowdown {:+.0}%\n",
        s.before.write_rate * 4096.0 / MIB,
        s.during.write_rate * 4096.0 / MIB,
        s.before.ns_per_write,
        s.during.ns_per_write,
        s.slowdown_pct()
    ));
    if s.max_throttle_pct > 0 {
        t.push_str(&format!(
            "  auto-converge        throttled the vCPUs up to {}%\n",
            s.max_throttle_pct
        ));
    }
    if p.converge == ConvergeArg::DirtyLimit && s.final_pace * 4096 * p.vcpus as u64 != p.dirty_rate
    {
        t.push_str(&format!(
            "  dirty-limit          vCPUs capped at {:.1} MiB/s in all\n",
            (s.final_pace * 4096 * p.vcpus as u64) as f64 / MIB
        ));
    }
    t.push_str(&format!(
        "  verification         destination memory equals the source's{}: per-slot digests equal ({} slot(s)){}\n",
        if s.postcopy.is_some() {
            " at the stop plus every write the destination guest made since (replayed from its vCPU states)"
        } else {
            ""
        },
        s.slot_digests.len(),
        if s.verified_full {
            ", and every page equal byte for byte"
        } else {
            ""
        }
    ));
    if let Some(d) = d {
        t.push_str(&format!(
            "  destination          guest resumed from {} memory, ran {}{} ms at {:.1} MiB/s{}\n",
            if s.postcopy.is_some() {
                "incomplete (post-copy)"
            } else {
                "complete"
            },
            if s.postcopy.is_some() {
                "at least "
            } else {
                ""
            },
            p.run_after.as_millis(),
            d.resumed_write_rate * 4096.0 / MIB,
            if d.prefault > Duration::ZERO {
                format!(
                    "; its memory was backed with RAM in {:.0} ms before the stream started",
                    d.prefault.as_secs_f64() * 1e3
                )
            } else {
                String::new()
            }
        ));
    }
    t
}

/// Adds its rows and lines to a migration's report; snapshots that
/// failed or restore to other memory fail the run.
fn extras_report(e: &ExtrasOutcome, r: &mut Report, text: &mut String) {
    if let Some(c) = &e.check {
        r.result(
            "lost-write check",
            "migrate",
            json!({ "rounds": c.rounds, "pages_changed": c.changed, "pages_lost": c.lost }),
        );
        text.push_str(&format!(
            "Lost-write check: {} rounds, {} page changes, {} not in any log [{}]\n",
            c.rounds,
            c.changed,
            c.lost,
            verdict(c.lost == 0)
        ));
    }
    match &e.snapshots {
        Some(Ok(s)) => {
            r.result(
                "snapshots",
                "migrate",
                json!({ "snapshots": s.taken, "pages": s.pages, "bytes": s.bytes,
                        "restore_ns": s.restore_time.as_nanos() as u64,
                        "pages_differing": s.differing_pages }),
            );
            text.push_str(&format!(
                "Snapshots beside the migration (a dirty view of their own): {} files, {} pages, {:.1} MiB; \
                 the chain restored in {:.1} ms, {} pages differ from the source at the stop point [{}]\n",
                s.taken,
                s.pages,
                s.bytes as f64 / (1u64 << 20) as f64,
                s.restore_time.as_secs_f64() * 1e3,
                s.differing_pages,
                verdict(s.differing_pages == 0)
            ));
            if s.differing_pages > 0 {
                r.fail(format!(
                    "the snapshots restore to memory that differs from the source's in {} pages",
                    s.differing_pages
                ));
            }
        }
        Some(Err(e)) => {
            text.push_str(&format!("Snapshots: FAILED: {e}\n"));
            r.fail(format!("snapshots: {e}"));
        }
        None => {}
    }
}

/// The downtime's parts in milliseconds, in order (the simulated and the
/// Linux guest's reports).
pub(super) fn parts_text(d: &s2mmu_migrate::session::source::DowntimeParts) -> String {
    let ms = |x: std::time::Duration| x.as_secs_f64() * 1e3;
    format!(
        "pause {:.1}, harvest {:.1}, last pages {:.1}, state saved {:.1}, sent {:.1}, until resumed {:.1} ms",
        ms(d.pause), ms(d.harvest), ms(d.last_pages), ms(d.state_save), ms(d.state_send), ms(d.until_resumed)
    )
}

/// The downtime's parts and the destination's part, a line each.
fn downtime_lines(s: &SourceOutcome, d: Option<&DestOutcome>) -> String {
    let mut t = format!("  downtime's parts     {}\n", parts_text(&s.downtime_parts));
    if let Some(d) = d {
        let parts = resume_parts_text(&d.resume_parts);
        t.push_str(&format!("  destination's part   {parts}\n"));
    }
    t
}

/// The destination's part of the downtime in milliseconds, on its own
/// clock (the simulated and the Linux guest's reports).
pub(super) fn resume_parts_text(d: &s2mmu_migrate::session::dest::ResumeParts) -> String {
    let ms = |x: std::time::Duration| x.as_secs_f64() * 1e3;
    format!(
        "from STATE: drain {:.1}, decode {:.1}, page fetch {:.1}, start {:.1}, digests after \
         it {:.1}, reply {:.1} ms",
        ms(d.drain),
        ms(d.decode),
        ms(d.page_fetch),
        ms(d.start),
        ms(d.digests),
        ms(d.reply)
    )
}

pub(super) fn rate_text(r: u64) -> String {
    if r == 0 {
        "as fast as they can".into()
    } else {
        format!("{:.1} MiB/s", r as f64 / MIB)
    }
}

pub(super) fn harvest_name(h: DirtyMode) -> &'static str {
    // The engine's words, shorter for the hardware modes; a mode added
    // later is named by the engine with no change here.
    match h {
        DirtyMode::Hardware { .. } => "hardware dirty state",
        DirtyMode::Pml { .. } => "PML",
        mode => mode.title(),
    }
}

/// A policy in words.
pub fn policy_label(p: &MmuPolicy) -> &'static str {
    match (p.fault_path, p.eager_split_chunk.is_some()) {
        (FaultPath::ReadLockFastPath, true) => "read-lock fast path + eager split",
        (FaultPath::ReadLockFastPath, false) => "read-lock fast path, split on fault",
        (FaultPath::WriteLock, true) => "write-lock faults, eager split",
        (FaultPath::WriteLock, false) => "write-lock faults, split on fault (baseline)",
    }
}
