//! `s2mmu migrate --guest linux` in two processes: `--listen ADDR` starts
//! its own QEMU machine from the HEADER; `--to ADDR` boots the guest and
//! sends it, secured as the simulated guest's two processes are. The run
//! is the arm64 migration crate's ([`s2mmu_arm64_migrate::session_run`]); this module
//! prints what each side saw.

use s2mmu_arm64::linux::migrate::LinuxVm;
use s2mmu_arm64::linux::vm::LinuxConfig;
use s2mmu_arm64_migrate::session_run::{
    self, GuestProgram, LinuxRun, ListenEvent, RunSettings, WentOn,
};

/// `--to ADDR`: migrates the guest `a` (booted here) to `addr`.
///
/// # Errors
/// A failed migration, the source's guest printing after the switch.
pub fn source_to(s: &RunSettings, addr: &str, a: LinuxVm) -> Result<LinuxRun, String> {
    session_run::source_to(s, addr, a, &mut |o, last, cut| {
        let guest = match s.program {
            GuestProgram::Counter | GuestProgram::Fill => format!(
                "; counter step {last} was the last the source's guest began; its console \
                 ended with {cut:?} unfinished"
            ),
            GuestProgram::Dirtier | GuestProgram::User => String::new(),
        };
        eprintln!(
            "source: migrated to {addr} ({}); downtime {:.1} ms{guest}",
            s.net.security.describe(),
            o.downtime.as_secs_f64() * 1e3
        )
    })
    .map_err(String::from)
}

/// `--listen ADDR`: serves one migration (up to `--attempts` sources) and
/// prints what the destination received and how its guest went on (in
/// the JSON envelope with `json`).
///
/// # Errors
/// Binding, every attempt failing, the guest not going on.
pub fn listen(
    s: &RunSettings,
    cfg: &LinuxConfig,
    addr: &str,
    guest: &super::linux_guest::LinuxGuestArgs,
    json: bool,
) -> Result<(), String> {
    let l = session_run::listen(s, cfg, addr, &mut |ev| match ev {
        ListenEvent::Listening { addr, dest } => eprintln!(
            "destination listening on {addr} ({}); accepts a Linux guest with at most {} MiB \
             of memory, {} vCPUs",
            s.net.security.describe(),
            dest.limits.max_mem >> 20,
            dest.limits.max_vcpus
        ),
        ListenEvent::AttemptFailed { failures, error } => eprintln!(
            "the migration failed ({failures} of --attempts {}): {error}; the guest was not \
             resumed, serving the next source",
            s.attempts
        ),
    })?;
    let digests: Vec<String> = l
        .outcome
        .slot_digests
        .iter()
        .map(|(id, v)| format!("slot {id}: {v:#018x}"))
        .collect();
    let mut text = String::new();
    if let Some(f) = &l.outcome.postcopy {
        text += &format!(
            "destination: post-copy: {} pages missing at the resume, {} requests (stage-2 \
             faults), {} pages answered and {} streamed, the last {:.1} ms after the resume, \
             {} recoveries\n",
            f.missing_pages,
            f.requests,
            f.answered_pages,
            f.background_pages,
            f.time_to_last_page_ns as f64 / 1e6,
            f.recoveries
        );
    }
    let went_on = match &l.went_on {
        WentOn::CounterStep(n) => format!(
            "counter step {n} was the first the destination's guest began, then {} more in \
             order; its console began with the line {:?}",
            l.more_steps, l.first_line
        ),
        WentOn::DirtierOk(ok) | WentOn::Printed(ok) => {
            format!("the destination's guest printed \"{ok}\"")
        }
    };
    text += &format!(
        "destination: received {} page records over {} channel(s), resumed the Linux guest \
         (memory digests {}); {went_on}\n",
        l.outcome.page_records,
        l.outcome.channels,
        digests.join(", "),
    );
    let params = serde_json::json!({"guest": "linux", "listen": addr, "vcpus": s.vcpus,
        "mem_bytes": s.mem});
    let mut rep = crate::report::Report::new("migrate", params);
    let mut row = super::outcome_json::dest_json(&l.outcome);
    if let Some(m) = row.as_object_mut() {
        m.insert("went_on".into(), went_on.into());
        // Its guest's first instruction on the host's one real-time clock:
        // the source's `pause_unix_ns` subtracted gives the downtime.
        let first = l.outcome.resumed_at.map(session_run::unix_ns);
        m.insert("first_instruction_unix_ns".into(), first.into());
    }
    rep.result("destination", "s2mmu", row);
    rep.set_text(text);
    crate::report::emit(&rep, json);
    guest.show(None, Some(&l.console))
}
