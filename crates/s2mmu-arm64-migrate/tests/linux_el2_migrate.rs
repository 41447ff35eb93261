//! The Linux guest moves with the engine at EL2 (`Engine::El2`) on both
//! machines, through the migration library's session: A -> B -> A, each
//! round's dirty pages the EL2 engine's own log (its write-protection
//! faults answered at EL2, GET and CLEAR through EL2's checked commands);
//! then a snapshot restored into a fresh EL2 machine; a post-copy whose
//! destination's EL2 engine maps each page only once the host has it; a
//! pair with the host placement on one side and EL2 on the other (the
//! stream does not name a placement); and the dirtier moved between two
//! EL2 machines, its own check of every page it wrote passing; and a
//! dirtier faster than a capped link, which pre-copy cannot move without
//! help, moved by auto-converge's throttle applied at EL2. Memories
//! agree by digest at every switch (0 pages lost), and the counter's
//! sequence, each step's hash recomputed, runs on across every machine.

mod common;

use common::counter::{check_lives, config, wait_lines, KIB};
use common::pure_postcopy::{check_b_goes_on, PurePostcopy};
use s2mmu_arm64::linux::migrate::LinuxVm;
use s2mmu_arm64::linux::vm::{Engine, LinuxConfig, RAM_SLOT};
use s2mmu_arm64_migrate::session_dest::LinuxDest;
use s2mmu_arm64_migrate::session_run::{self, GuestProgram, RunDetails, RunSettings, WentOn};
use s2mmu_arm64_migrate::session_source::{LinuxSessionVm, LinuxSource};
use s2mmu_migrate::session::guest::SourceGuest;
use s2mmu_migrate::session::snapshot::guest::{restore_guest, save_paused};
use s2mmu_migrate::session::source::{Converge, SourceConfig, SourceOutcome};
use s2mmu_migrate::vm::GuestRun;
use std::sync::Arc;

/// The most guest memory a restore here accepts.
const MAX_MEM: u64 = 1 << 30;

fn el2_config(a: &s2mmu_arm64::linux::assets::LinuxAssets, vcpus: usize) -> LinuxConfig {
    LinuxConfig {
        engine: Engine::El2,
        ..config(a, vcpus)
    }
}

fn dest(cfg: &LinuxConfig, engine: Engine) -> Arc<LinuxDest> {
    let mut d = LinuxDest::new(cfg.echo, cfg.timeout);
    d.engine = engine;
    Arc::new(d)
}

/// Migrates `src` (pre-copy, `scfg`) into a machine `dest` builds; checks
/// the digests at the switch, that B runs the placement asked for and
/// goes on, and that A stays silent. B's machine and A's console.
fn hop<G: SourceGuest<Vm = LinuxSessionVm>>(
    src: &G,
    dest: &Arc<LinuxDest>,
    scfg: &SourceConfig,
    what: &str,
) -> (Arc<LinuxSessionVm>, String, SourceOutcome) {
    let net = common::tls();
    let ends = common::migrate_here(src, dest, scfg, &net);
    let (s, d) = (ends.source.expect(what), ends.dest.expect(what));
    eprintln!(
        "{what}: downtime {:?}, {} rounds, pages per round {:?}",
        s.downtime,
        s.rounds.len(),
        s.rounds.iter().map(|r| r.pages).collect::<Vec<_>>()
    );
    assert_eq!(s.slot_digests.len(), 1, "{what}: one RAM slot");
    assert_eq!(
        s.slot_digests, d.slot_digests,
        "{what}: memories at the switch"
    );
    let mark = common::at_switch(src.vm());
    let to = dest.built().expect("the destination's machine");
    assert_eq!(to.lock().engine(), dest.engine, "{what}: B's placement");
    to.lock().resume_vcpus().expect("it runs on");
    wait_lines(&to.lock(), 0, 4, what);
    common::check_silent(src.vm(), &mark, what);
    (to, mark.0, s)
}

s2mmu_arm64::linux_test! {
    /// A -> B -> A with the engine at EL2 on every machine, then a snapshot
    /// of the guest restored into a fresh EL2 machine D.
    fn el2_guest_goes_there_and_back_and_restores_from_a_snapshot(a) {
        let cfg = el2_config(&a, 2);
        let vm_a = LinuxVm::boot(&cfg).expect("A boots at EL2");
        assert_eq!(vm_a.engine(), Engine::El2);
        wait_lines(&vm_a, 0, 3, "A");
        let d = dest(&cfg, Engine::El2);
        let scfg = SourceConfig::default();
        let src_a = LinuxSource::new(vm_a);
        let (b, a_text, s) = hop(&src_a, &d, &scfg, "A -> B at EL2");
        assert!(
            s.rounds.len() >= 2,
            "the log at EL2 ran a round after round 0: {:?}",
            s.rounds
        );
        let src_b = LinuxSource::from_session_vm(b);
        let (a2, b_text, _) = hop(&src_b, &d, &scfg, "B -> A at EL2");
        drop((src_a, src_b));

        let dir = std::env::temp_dir().join(format!("s2mmu-el2-snap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let src = LinuxSource::from_session_vm(a2);
        src.pause();
        let saved = save_paused(&src, &dir).expect("the snapshot");
        let a2_text = src.vm().lock().console().contents();
        src.vm().lock().shut_down().expect("A's threads end");
        drop(src);
        let dd = dest(&cfg, Engine::El2);
        let r = restore_guest(&*dd, &dir, MAX_MEM).expect("restore into D at EL2");
        assert_eq!(
            r.slot_digests, saved.slot_digests,
            "D's memory is the snapshot's"
        );
        let d_vm = dd.built().expect("D");
        assert_eq!(d_vm.lock().engine(), Engine::El2);
        let d_text = wait_lines(&d_vm.lock(), 0, 4, "D");
        check_lives(&[&a_text, &b_text, &a2_text, &d_text]);
        d_vm.lock().shut_down().expect("D's threads end");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

s2mmu_arm64::linux_test! {
    /// A host-placement source into an EL2 destination, and that guest on
    /// into a host-placement machine again.
    fn host_and_el2_placements_migrate_into_each_other(a) {
        let cfg = LinuxConfig {
            engine: Engine::Host,
            ..config(&a, 1)
        };
        let vm_a = LinuxVm::boot(&cfg).expect("A boots");
        assert_eq!(vm_a.engine(), Engine::Host);
        wait_lines(&vm_a, 0, 3, "A");
        let scfg = SourceConfig::default();
        let src_a = LinuxSource::new(vm_a);
        let (b, a_text, _) = hop(&src_a, &dest(&cfg, Engine::El2), &scfg, "host -> EL2");
        let src_b = LinuxSource::from_session_vm(b);
        let (c, b_text, _) = hop(&src_b, &dest(&cfg, Engine::Host), &scfg, "EL2 -> host");
        let c_text = c.lock().console().contents();
        check_lives(&[&a_text, &b_text, &c_text]);
        c.lock().shut_down().expect("C's threads end");
    }
}

s2mmu_arm64::linux_test! {
    /// Post-copy into an EL2 destination, every page missing at the resume:
    /// each first touch of a page exits to the host, which fetches it and
    /// has EL2 map it (`PAGE_READY`); B's guest goes on and the source's
    /// check of FINAL passes.
    fn el2_destination_maps_each_postcopy_page_as_it_comes(a) {
        let mut cfg = el2_config(&a, 2);
        cfg.cmdline = format!("quiet s2mmu.run=counter s2mmu.args=kib={},ms=1", 4 * KIB);
        let vm_a = LinuxVm::boot(&cfg).expect("A boots at EL2");
        wait_lines(&vm_a, 0, 3, "A");
        let src = PurePostcopy::new(LinuxSource::new(vm_a));
        let d = dest(&cfg, Engine::El2);
        let net = common::tls();
        let scfg = common::postcopy_on();
        let ends = common::migrate_here(&src, &d, &scfg, &net);
        let s = ends.source.expect("the source's side");
        let pc = s.postcopy.clone().expect("post-copy ran");
        let f = &pc.figures;
        eprintln!(
            "A -> B (EL2) by post-copy: downtime {:?}, {f:?}",
            s.downtime
        );
        assert_eq!(f.missing_pages, cfg.mem / 4096, "every page was missing");
        assert_eq!(f.background_pages + f.answered_pages, f.missing_pages);
        assert!(f.requests > 0, "no page came by request: {f:?}");
        assert_eq!(s.slot_digests.len(), 1);
        assert_eq!(s.slot_digests[0].0, RAM_SLOT);
        let b = d.built().expect("B was built");
        assert_eq!(b.lock().engine(), Engine::El2);
        check_b_goes_on(src.src.vm(), &b);
    }
}

s2mmu_arm64::linux_test! {
    /// The dirtier (64 MiB written flat out, every page re-checked) moves
    /// between two EL2 machines; its `ok` on B is its own check passing.
    fn dirtier_moves_between_el2_machines_and_checks_its_pages(a) {
        let s = RunSettings {
            engine: Engine::El2,
            ..common::run_settings(2, 256 << 20, GuestProgram::Dirtier)
        };
        let cfg = session_run::linux_config(&s, &a);
        assert_eq!(cfg.engine, Engine::El2);
        let r = session_run::migrate_once(&s, &cfg).expect("the migration and the dirtier's check");
        let RunDetails::Session { outcome, .. } = &r.details else {
            panic!("pre-copy ran: {r:?}");
        };
        eprintln!(
            "dirtier at EL2: downtime {:?}, rounds {:?}",
            r.downtime, r.round_pages
        );
        assert!(!outcome.slot_digests.is_empty());
        match &r.went_on {
            Some(WentOn::DirtierOk(ok)) => assert!(ok.contains("s2mmu-dirtier: ok"), "{ok}"),
            other => panic!("B's dirtier: {other:?}"),
        }
    }
}

s2mmu_arm64::linux_test! {
    /// Auto-converge with the engine at EL2: the dirtier writes faster than
    /// the link drains, EL2 throttles its write faults (its paced exits
    /// counted), pre-copy converges, and the dirtier's check passes on B.
    fn auto_converge_throttles_the_dirtier_at_el2_over_a_capped_link(a) {
        let s = common::capped(Converge::Auto, 30, false);
        let cfg = session_run::linux_config(&s, &a);
        let r = session_run::migrate_once(&s, &cfg).expect("auto-converge moves the dirtier");
        let RunDetails::Session { outcome, limit, .. } = &r.details else {
            panic!("pre-copy ran: {r:?}");
        };
        eprintln!(
            "auto-converge at EL2: downtime {:?}, rounds {:?}, throttle up to {}%, {limit:?}",
            r.downtime, r.round_pages, outcome.max_throttle_pct
        );
        assert!(outcome.max_throttle_pct > 0, "no throttle was needed");
        assert!(
            limit.el2_paced_exits > 0,
            "EL2 throttled nothing: {limit:?}"
        );
        assert!(limit.throttled_ns > 0, "no vCPU slept: {limit:?}");
        assert_eq!(limit.el2_refused, 0);
        match &r.went_on {
            Some(WentOn::DirtierOk(ok)) => assert!(ok.contains("s2mmu-dirtier: ok"), "{ok}"),
            other => panic!("B's dirtier: {other:?}"),
        }
    }
}

s2mmu_arm64::linux_test! {
    /// The same dirtier and link with no convergence help: pre-copy gives up
    /// at the round limit, so the run above converged by its throttle.
    fn without_help_the_dirtier_at_el2_does_not_converge_over_the_capped_link(a) {
        let s = common::capped(Converge::None, 6, false);
        let cfg = session_run::linux_config(&s, &a);
        let e = session_run::migrate_once(&s, &cfg).expect_err("no help: no convergence");
        let text = e.to_string();
        assert!(text.contains("did not converge"), "{text}");
    }
}
