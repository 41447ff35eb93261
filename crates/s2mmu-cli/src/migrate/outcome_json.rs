//! A migration's outcomes as JSON: the source's, the destination's,
//! post-copy's figures and where the time went per stage, with the keys
//! `s2mmu migrate --json` reports. One place for every report of the
//! command (the simulated guest's report and the Linux guest's both take
//! the stages and post-copy from here).

use s2mmu_bench::wire::plain_probe::PlainLink;
use s2mmu_migrate::session::dest::{DestOutcome, ResumeParts};
use s2mmu_migrate::session::postcopy::{PostcopyFigures, PostcopyOutcome};
use s2mmu_migrate::session::source::{DowntimeParts, SourceOutcome};
use s2mmu_migrate::stages::{RecvStages, SendStages};
use s2mmu_migrate::wire::PAGE_SIZE;
use serde_json::{json, Value};

/// Nanoseconds per page, 0 without pages.
pub fn per_page(ns: u64, pages: u64) -> f64 {
    ns as f64 / pages.max(1) as f64
}

/// Per-slot digests as a list of `{slot, digest}` (digest in hex).
fn digests_json(d: &[(u16, u64)]) -> Value {
    d.iter()
        .map(|(i, h)| json!({"slot": i, "digest": format!("{h:#018x}")}))
        .collect()
}

/// The destination's stages: totals and per page.
pub fn recv_stages_json(r: &RecvStages) -> Value {
    json!({
        "pages": r.pages,
        "read_ns": r.read_ns,
        "socket_ns": r.socket_ns,
        "decrypt_and_copy_ns": r.decrypt_copy_ns(),
        "check_ns": r.check_ns,
        "cpu_ns": r.cpu_ns,
        "ns_per_page": {
            "socket": per_page(r.socket_ns, r.pages),
            "decrypt_and_copy": per_page(r.decrypt_copy_ns(), r.pages),
            "checks": per_page(r.check_ns, r.pages),
            "cpu": per_page(r.cpu_ns, r.pages),
        },
    })
}

/// The source's stages: totals and per page.
pub fn send_stages_json(s: &SendStages) -> Value {
    json!({
        "pages": s.pages,
        "read_and_zero_check_ns": s.read_ns,
        "hash_ns": s.hash_ns,
        "write_ns": s.write_ns,
        "encrypt_ns": s.encrypt_ns(),
        "socket_ns": s.socket_ns,
        "cpu_ns": s.cpu_ns,
        "ns_per_page": {
            "read_and_zero_check": per_page(s.read_ns, s.pages),
            "hash": per_page(s.hash_ns, s.pages),
            "encrypt": per_page(s.encrypt_ns(), s.pages),
            "socket": per_page(s.socket_ns, s.pages),
            "cpu": per_page(s.cpu_ns, s.pages),
        },
    })
}

/// Post-copy's figures as the destination measured them.
pub fn postcopy_figures_json(f: &PostcopyFigures) -> Value {
    json!({
        "missing_pages_at_resume": f.missing_pages,
        "remote_faults": f.remote_faults,
        "requests": f.requests,
        "remote_fault_median_ns": f.fault_median_ns,
        "remote_fault_p99_ns": f.fault_p99_ns,
        "answered_faults": f.answered_faults,
        "answered_fault_median_ns": f.answered_median_ns,
        "answered_fault_p99_ns": f.answered_p99_ns,
        "time_to_last_page_ns": f.time_to_last_page_ns,
        "reference_request_median_ns": f.reference_ns,
        "reference_requests": f.reference_samples,
        "background_pages_landed": f.background_pages,
        "answered_pages_landed": f.answered_pages,
        "dropped_duplicates": f.dropped_duplicates,
        "recoveries": f.recoveries,
    })
}

/// Where the downtime went, each part in nanoseconds.
pub fn downtime_parts_json(p: &DowntimeParts) -> Value {
    let ns = |d: std::time::Duration| d.as_nanos() as u64;
    json!({
        "pause": ns(p.pause),
        "harvest": ns(p.harvest),
        "last_pages": ns(p.last_pages),
        "state_save": ns(p.state_save),
        "state_send": ns(p.state_send),
        "until_resumed": ns(p.until_resumed),
    })
}

/// Post-copy as the source saw it, with the destination's figures.
pub fn postcopy_json(pc: &PostcopyOutcome, s: &SourceOutcome) -> Value {
    json!({
        "after_round": pc.after_round,
        "downtime_ns": s.downtime.as_nanos() as u64,
        "background_pages_sent": pc.background_pages,
        "answered_pages_sent": pc.answered_pages,
        "bytes": pc.bytes,
        "background_end_s": pc.background_end_s,
        "destination": postcopy_figures_json(&pc.figures),
    })
}

/// What the destination received and how its guest resumed.
pub fn dest_json(d: &DestOutcome) -> Value {
    json!({
        "pages": d.page_records,
        "zero_pages": d.zero_pages,
        "bytes": d.bytes,
        "channels": d.channels,
        "probe_bytes": d.probe_bytes,
        "prefault_ns": d.prefault.as_nanos() as u64,
        "resumed": d.resumed_at.is_some(),
        "resumed_write_rate_pages_per_s": d.resumed_write_rate,
        "slot_digests": digests_json(&d.slot_digests),
        "byte_compare_mismatched_pages": d.verify_mismatches,
        "postcopy": d.postcopy.as_ref().map(postcopy_figures_json),
        "stages": recv_stages_json(&d.recv_stages),
        "resume_parts_ns": resume_parts_json(&d.resume_parts),
    })
}

/// Where the destination's part of the downtime went, each part in
/// nanoseconds.
pub fn resume_parts_json(p: &ResumeParts) -> Value {
    let ns = |d: std::time::Duration| d.as_nanos() as u64;
    json!({
        "drain": ns(p.drain),
        "decode": ns(p.decode),
        "page_fetch": ns(p.page_fetch),
        "start": ns(p.start),
        "digests": ns(p.digests),
        "reply": ns(p.reply),
    })
}

/// Round 0, the stack's own link and plain TCP, each as a percentage of
/// plain TCP (None where plain TCP was not measured).
fn plain_json(s: &SourceOutcome, link: Option<PlainLink>) -> Value {
    let plain = link.map(|l| l.bytes_per_s());
    let pct = |x: f64| plain.map(|p| 100.0 * x / p.max(1.0));
    json!({
        "plain_tcp_bytes_per_s": plain,
        "plain_tcp_bytes": link.map(|l| l.bytes),
        "round0_pct_of_plain_tcp": s.rounds.first().and_then(|r| pct(r.bandwidth)),
        "link_pct_of_plain_tcp": (s.link_bytes > 0).then(|| pct(s.link)).flatten(),
    })
}

/// `--channels auto`'s choice and probes (null without it).
fn choice_json(s: &SourceOutcome) -> Value {
    s.channel_choice.as_ref().map_or(Value::Null, |c| {
        json!({
            "chosen": c.chosen,
            "probes": c.probes.iter().map(|p| json!({
                "channels": p.channels,
                "pages": p.pages,
                "elapsed_ns": p.elapsed.as_nanos() as u64,
                "bytes_per_s": p.pages_per_s() * PAGE_SIZE as f64,
            })).collect::<Vec<_>>(),
        })
    })
}

/// The compression setting and what it did.
fn compression_json(s: &SourceOutcome) -> Value {
    let c = &s.compressed;
    json!({"setting": s.compression.name(), "pages": c.pages, "tried_raw": c.tried_raw,
        "raw_bytes": c.raw_bytes, "wire_bytes": c.wire_bytes, "bytes_saved": c.saved(),
        "ns": c.ns})
}

/// The source's whole outcome: rounds, link, guest, checks, post-copy,
/// plain TCP (`plain`, measured beside the migration), stages, the
/// channel choice.
pub fn source_json(s: &SourceOutcome, plain: Option<PlainLink>) -> Value {
    // Without the link probe there is no link figure to compare with.
    let measured = s.link_bytes > 0;
    let of_link = |bw: f64| measured.then(|| 100.0 * bw / s.link.max(1.0));
    json!({
        "converged": s.postcopy.is_none(),
        "switched_to_postcopy": s.postcopy.is_some(),
        "rounds": s.rounds.len(),
        "total_ns": s.total.as_nanos() as u64,
        "setup_parts_ns": {"channel_probe": s.setup.channel_probe.as_nanos() as u64,
            "connect": s.setup.connect.as_nanos() as u64,
            "link_probe": s.setup.link_probe.as_nanos() as u64},
        "to_last_byte_sent_ns": s.to_last_byte_sent().as_nanos() as u64,
        "downtime_ns": s.downtime.as_nanos() as u64,
        "downtime_parts_ns": downtime_parts_json(&s.downtime_parts),
        "pages": s.page_records,
        "zero_pages": s.zero_pages,
        "bytes": s.bytes,
        "channels": s.channels,
        "link_bytes": s.link_bytes,
        "link_bytes_per_s": measured.then_some(s.link),
        "round0_bytes_per_s": s.rounds.first().map(|r| r.bandwidth),
        "round0_pct_of_link": s.rounds.first().and_then(|r| of_link(r.bandwidth)),
        "pct_of_link_per_round": measured.then(|| s.rounds.iter().filter_map(|r| of_link(r.bandwidth)).collect::<Vec<_>>()),
        "pages_per_round": s.rounds.iter().map(|r| r.pages).collect::<Vec<_>>(),
        "dirty_rate_bytes_per_s_per_round": s.rounds.iter().filter(|r| !r.final_round).map(|r| r.dirty_rate).collect::<Vec<_>>(),
        "bandwidth_bytes_per_s_per_round": s.rounds.iter().map(|r| r.bandwidth).collect::<Vec<_>>(),
        "guest_write_rate_before_pages_per_s": s.before.write_rate,
        "guest_write_rate_logging_pages_per_s": s.during.write_rate,
        "guest_ns_per_write_before": s.before.ns_per_write,
        "guest_ns_per_write_logging": s.during.ns_per_write,
        "guest_slowdown_pct": s.slowdown_pct(),
        "max_throttle_pct": s.max_throttle_pct,
        "final_pace_pages_per_s_per_vcpu": s.final_pace,
        "memory_equal": true,
        "verified_full": s.verified_full,
        "slot_digests": digests_json(&s.slot_digests),
        "postcopy": s.postcopy.as_ref().map(|pc| postcopy_json(pc, s)),
        "plain_tcp": plain_json(s, plain),
        "stages": send_stages_json(&s.send_stages),
        "channel_choice": choice_json(s),
        "compression": compression_json(s),
    })
}
