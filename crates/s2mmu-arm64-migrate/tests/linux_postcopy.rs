//! Post-copy of a running Linux guest through the migration LIBRARY's
//! session (`run_source` on machine A, `serve_with` building machine B
//! from the HEADER) over loopback mutual TLS: A pauses after round 0, B
//! resumes with pages missing, and a vCPU's stage-2 translation fault on
//! one is that page's REQUEST (the session's `Fetcher` is B's page-fetch
//! hook) while the source streams the rest. On this machine A's guest
//! dirties few pages during round 0 (its vCPUs share two cores with the
//! sending threads) and the background stream brings those in a few
//! milliseconds, before B's guest touches them: so A's VM here reports
//! every page dirty at the switch (`common::pure_postcopy`), making it pure
//! post-copy, as the arm64 crate's own post-copy test did before. The
//! guest program `counter` must go on on B from its next step (every
//! step once, in order, its own check of its buffer passing); A must
//! never print or run again; at least one page came by request; and the
//! source's check of FINAL (the pages B's guest did not write hash to
//! the same digest as A's frozen memory) passes.
//! A destination whose pages cannot be had stops with an error naming the
//! page instead of running on zeros.

mod common;

use common::counter::{config, wait_lines};
use common::pure_postcopy::{check_b_goes_on, PurePostcopy};
use s2mmu_arm64::linux::assets::LinuxAssets;
use s2mmu_arm64::linux::migrate::LinuxVm;
use s2mmu_arm64::linux::page_fetch::PageFetch;
use s2mmu_arm64::linux::vm::{Engine, LinuxConfig};
use s2mmu_arm64::linux::vm::{StopReason, RAM_SLOT};
use s2mmu_arm64_migrate::session_dest::LinuxDest;
use s2mmu_arm64_migrate::session_run::{
    self, GuestProgram, PostcopyMode, RunDetails, RunSettings, WentOn,
};
use s2mmu_arm64_migrate::session_source::LinuxSource;
use s2mmu_migrate::session::dest::DestOutcome;
use s2mmu_migrate::session::guest::SourceGuest;
use s2mmu_migrate::session::source::{SourceConfig, SourceOutcome};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Migrates `src` into a guest `dest` builds, post-copy after round 0,
/// both ends in this process over loopback mutual TLS.
fn migrate_by_postcopy(src: &PurePostcopy, dest: &Arc<LinuxDest>) -> (SourceOutcome, DestOutcome) {
    let net = common::tls();
    let scfg = common::postcopy_on();
    let ends = common::migrate_here(src, dest, &scfg, &net);
    (
        ends.source.expect("the source's side"),
        ends.dest.expect("B's side"),
    )
}

/// The counter's buffer here (KiB).
const BUFFER_KIB: u64 = 1024;

s2mmu_arm64::linux_test! {
    fn linux_guest_goes_on_by_postcopy_through_the_session(a) {
        let mut cfg = config(&a, 2);
        // A 1 MiB buffer rewritten flat out (a step every millisecond at
        // most): B's first steps read pages that came by post-copy.
        cfg.cmdline = format!("quiet s2mmu.run=counter s2mmu.args=kib={BUFFER_KIB},ms=1");
        let vm_a = LinuxVm::boot(&cfg).expect("A boots");
        wait_lines(&vm_a, 0, 3, "A");
        let src = PurePostcopy::new(LinuxSource::new(vm_a));
        let dest = Arc::new(LinuxDest::new(cfg.echo, cfg.timeout));
        dest.prestart(cfg.vcpus, cfg.mem).expect("B's QEMU starts");

        let (s, d) = migrate_by_postcopy(&src, &dest);
        let pc = s.postcopy.clone().expect("the source switched to post-copy");
        let f = &pc.figures;
        eprintln!(
            "A -> B by post-copy after round {}: downtime {:?}, {f:?}",
            pc.after_round, s.downtime
        );
        assert_eq!(pc.after_round, 0);
        assert_eq!(d.postcopy.as_ref(), Some(f), "FINAL carried B's figures");
        assert_eq!(f.missing_pages, cfg.mem / 4096, "every page was missing");
        assert_eq!(
            f.background_pages + f.answered_pages,
            f.missing_pages,
            "each missing page landed once"
        );
        assert!(
            f.requests > 0 && f.remote_faults > 0,
            "no page came by request (a stage-2 fault): {f:?}"
        );
        // The source's check of FINAL agreed on the RAM slot's pages that B's
        // guest did not write.
        assert_eq!(s.slot_digests.len(), 1);
        assert_eq!(s.slot_digests[0].0, RAM_SLOT);

        let b = dest.built().expect("B was built");
        check_b_goes_on(src.src.vm(), &b);
    }
}

/// A post-copy source that is gone: every request fails.
struct Gone(AtomicU64);

impl PageFetch for Gone {
    fn fetch(&self, _vcpu: usize, gpa: u64) -> Result<bool, String> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Err(format!("no source for {gpa:#x}"))
    }
}

s2mmu_arm64::linux_test! {
    fn missing_page_that_cannot_come_stops_the_destination(a) { missing_page_stops(&a, Engine::El2) }
    /// The same with the engine on the host, whose fault path asks the hook
    /// itself.
    fn missing_page_that_cannot_come_stops_the_destination_on_the_host(a) { missing_page_stops(&a, Engine::Host) }
}

/// `set_page_fetch` alone, without a session: at EL2 it makes the RAM
/// slot a post-copy one itself, so B's missing pages reach the hook
/// instead of being mapped from B's empty backing.
fn missing_page_stops(a: &LinuxAssets, engine: Engine) {
    let cfg = LinuxConfig {
        engine,
        ..config(a, 1)
    };
    let mut vm_a = LinuxVm::boot(&cfg).expect("A boots");
    let a1 = wait_lines(&vm_a, 0, 2, "A");
    vm_a.pause_vcpus().expect("A pauses");
    let state = s2mmu_arm64_migrate::state::save(&mut vm_a).expect("A's state");
    let mut vm_b = LinuxVm::blank(&cfg).expect("B starts");
    s2mmu_arm64_migrate::state::load(&mut vm_b, &state).expect("B takes A's state");
    let gone = Arc::new(Gone(AtomicU64::new(0)));
    vm_b.set_page_fetch(Some(gone.clone()))
        .expect("B takes the hook");
    vm_b.resume_vcpus().expect("B starts its vCPU");
    let t = Instant::now();
    let why = loop {
        if let Some(r) = vm_b.stopped() {
            break r;
        }
        assert!(
            t.elapsed() < Duration::from_secs(600),
            "B runs on without its pages"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    match &why {
        StopReason::Error(e) => assert!(
            e.contains("could not be fetched") && e.contains("no source for"),
            "{e}"
        ),
        other => panic!("B stopped for {other:?}"),
    }
    assert!(gone.0.load(Ordering::Relaxed) > 0);
    drop(vm_b);
    // The source goes on.
    vm_a.resume_vcpus().expect("A resumes");
    let n = common::counter::counter_lines(&a1).len();
    wait_lines(&vm_a, 0, n + 2, "A after B failed");
}

s2mmu_arm64::linux_test! {
    /// The guest writing as fast as it can (the `dirtier`: 64 MiB of
    /// anonymous memory and 8 of tmpfs, every page re-checked) with
    /// `--postcopy auto` as `s2mmu migrate --guest linux` runs it in one
    /// process. A downtime budget of 1 µs keeps pre-copy from converging
    /// while the guest dirties any page at all (its estimate must fall to
    /// half of that), and auto switches to post-copy at `max_rounds` (1)
    /// whatever the estimate: with the dirty log re-armed by CLEAR, the
    /// dirtier's few hundred pages a second (each write a stage-2 fault
    /// through QEMU) let a 1 ms budget converge by round 2. The migration
    /// must complete, the source's check of FINAL pass, and the dirtier on B
    /// print its `ok` (every page it re-checked held what it wrote, across
    /// the switch).
    fn dirtier_with_postcopy_auto_completes(a) {
        let s = RunSettings {
            postcopy: Some(PostcopyMode::Auto),
            session: SourceConfig {
                max_downtime: Duration::from_micros(1),
                max_rounds: 1,
                ..SourceConfig::default()
            },
            ..common::run_settings(2, 256 << 20, GuestProgram::Dirtier)
        };
        let cfg = session_run::linux_config(&s, &a);
        let r = session_run::migrate_once(&s, &cfg).expect("the migration and the dirtier's check");
        eprintln!("dirtier, --postcopy auto: {r:?}");
        let RunDetails::Postcopy { figures: pc, .. } = &r.details else {
            panic!("pre-copy converged within 1 µs of downtime: {r:?}");
        };
        assert!(
            pc.after_round == 1,
            "auto switched at max_rounds, after round 1: {pc:?}"
        );
        assert_eq!(
            pc.figures.background_pages + pc.figures.answered_pages,
            pc.figures.missing_pages,
            "each missing page landed once"
        );
        match &r.went_on {
            Some(WentOn::DirtierOk(ok)) => assert!(ok.contains("s2mmu-dirtier: ok"), "{ok}"),
            other => panic!("B's dirtier: {other:?}"),
        }
    }
}

s2mmu_arm64::linux_test! {
    /// `--postcopy start` as `s2mmu migrate --guest linux --linux-run fill
    /// --postcopy start` runs it in one process: the session switches before
    /// any page is sent, so every page is missing when B resumes (no
    /// `EveryPageDirty` here: the plain Linux source), the guest's faults on
    /// pages the background stream has not brought yet are requests, and
    /// `fill`'s counter goes on on B with its re-checks of its data pages
    /// passing. (With `--postcopy on`, after round 0, the dirtier's run had
    /// 290 pages missing and no request: the background stream brought them
    /// first.)
    fn fill_with_postcopy_start_has_every_page_missing_and_fetches_by_request(a) {
        let s = RunSettings {
            postcopy: Some(PostcopyMode::Start),
            ..common::run_settings(2, 256 << 20, GuestProgram::Fill)
        };
        let cfg = session_run::linux_config(&s, &a);
        let r = session_run::migrate_once(&s, &cfg).expect("the migration and fill's checks");
        eprintln!("fill, --postcopy start: {r:?}");
        assert_eq!(r.round_pages, vec![0], "no page was sent before the switch");
        let RunDetails::Postcopy { figures: pc, .. } = &r.details else {
            panic!("no post-copy: {r:?}");
        };
        let f = &pc.figures;
        assert_eq!(f.missing_pages, s.mem / 4096, "every page was missing");
        assert_eq!(
            f.background_pages + f.answered_pages,
            f.missing_pages,
            "each missing page landed once"
        );
        assert!(f.requests > 0 && f.answered_pages > 0, "no request: {f:?}");
        assert!(
            matches!(r.went_on, Some(WentOn::CounterStep(n)) if n > 1),
            "B's counter: {:?}",
            r.went_on
        );
    }
}
