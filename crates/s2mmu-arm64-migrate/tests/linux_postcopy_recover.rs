//! Post-copy recovery of a running Linux guest, with the connection cut
//! for real: the source reaches the destination through a TCP proxy
//! (`common::cut_proxy`) that shuts every connection down at the socket
//! once the session has paused A's guest and a few MiB more went through,
//! inside the post-copy background stream of a guest whose every page was
//! missing on B (`common::pure_postcopy`). Both ends are in this process
//! (the library's `run_source` and `serve_with`), over loopback mutual
//! TLS. The migration must then recover, automatically (`--recovery
//! auto`) or when the operator says `recover` on each side's control
//! socket (`--recovery manual`, the source told a new ADDR), and complete:
//! each missing page landed once, the source's check of FINAL passes (the
//! pages B's guest did not write hash as A's frozen memory), and B's
//! counter goes on from A's next step, every step once and in order, its
//! own check of its buffer passing; A never prints again.

mod common;

use common::counter::{config, wait_lines};
use common::cut_proxy::{self, CutProxy};
use common::pure_postcopy::{check_b_goes_on, PurePostcopy};
use s2mmu_arm64::linux::migrate::LinuxVm;
use s2mmu_arm64::linux::vm::LinuxConfig;
use s2mmu_arm64_migrate::session_dest::LinuxDest;
use s2mmu_arm64_migrate::session_run::connect_source;
use s2mmu_arm64_migrate::session_source::LinuxSource;
use s2mmu_migrate::session::dest::{serve_with, DestConfig, DestOutcome};
use s2mmu_migrate::session::guest::SourceGuest;
use s2mmu_migrate::session::postcopy::control::{self, Control, Recovery, RecoveryMode};
use s2mmu_migrate::session::source::{run_source, SourceConfig, SourceOutcome};
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::transport::{self, Listener};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The counter's buffer (KiB), rewritten flat out (a step every
/// millisecond at most): B's guest touches pages that have not come.
const BUFFER_KIB: u64 = 1024;

/// Bytes through the proxy after A's guest paused before the cut: the
/// switch's records are a few KiB, the background stream of a 128 MiB
/// guest whose every page is missing about 128 MiB.
const CUT_AFTER: u64 = 4 << 20;

/// What each end returned.
struct Ends {
    source: Result<SourceOutcome, MigrateError>,
    dest: Result<DestOutcome, MigrateError>,
}

/// A booted and counting, the source over it raising the proxy's arm at
/// the switch, and B's QEMU started.
fn machines(cfg: &LinuxConfig, proxy: &CutProxy) -> (PurePostcopy, Arc<LinuxDest>) {
    let vm_a = LinuxVm::boot(cfg).expect("A boots");
    wait_lines(&vm_a, 0, 3, "A");
    let src = PurePostcopy::raising_on_pause(LinuxSource::new(vm_a), proxy.armed.clone());
    let dest = Arc::new(LinuxDest::new(cfg.echo, cfg.timeout));
    dest.prestart(cfg.vcpus, cfg.mem).expect("B's QEMU starts");
    (src, dest)
}

/// Migrates `src` into a guest `dest` builds by pure post-copy: the
/// destination serves `listener` on a thread, the source connects to `to`
/// (the proxy; after `recover ADDR`, ADDR), each side recovering as its
/// `Recovery` says.
fn migrate_through(
    src: &PurePostcopy,
    dest: &Arc<LinuxDest>,
    listener: Box<dyn Listener>,
    to: &str,
    (src_rec, dest_rec): (Recovery, Recovery),
) -> Ends {
    let net = common::tls();
    let scfg = SourceConfig {
        recovery: src_rec,
        ..common::postcopy_on()
    };
    let dcfg = DestConfig {
        prefault: false,
        recovery: dest_rec,
        ..DestConfig::with_run_after(Duration::from_millis(300))
    };
    let (d2, n2, factory) = (dcfg.clone(), net.clone(), dest.clone());
    let served = std::thread::spawn(move || serve_with(&*listener, &*factory, &d2, &n2));
    let source = run_source(src, &scfg, &mut |_| connect_source(to, &scfg, &net));
    if source.is_err() {
        dcfg.stop.store(true, Ordering::SeqCst);
    }
    let dest = served.join().expect("the destination's thread");
    Ends { source, dest }
}

/// Checks the migration completed after exactly one recovery of a cut
/// that came while pages were missing, and that B's guest goes on from
/// A's next step while A stays silent.
fn completed_after_one_recovery(ends: Ends, src: &PurePostcopy, dest: &LinuxDest, pages: u64) {
    let s = ends.source.expect("the source recovered and completed");
    let d = ends.dest.expect("the destination recovered and completed");
    let pc = s
        .postcopy
        .clone()
        .expect("the source switched to post-copy");
    let f = &pc.figures;
    eprintln!("recovered post-copy: {pc:?}");
    assert_eq!(pc.recoveries, 1, "the source's recoveries");
    assert_eq!(f.recoveries, 1, "the destination's recoveries (its FINAL)");
    assert_eq!(d.postcopy.as_ref(), Some(f), "FINAL carried B's figures");
    assert_eq!(f.missing_pages, pages, "every page was missing");
    assert_eq!(
        f.background_pages + f.answered_pages,
        f.missing_pages,
        "each missing page landed once"
    );
    // The source's check of FINAL (run_source's success) agreed on the
    // RAM slot's pages that B's guest did not write.
    assert_eq!(s.slot_digests.len(), 1);

    let b = dest.built().expect("B was built");
    check_b_goes_on(src.src.vm(), &b);
}

fn counter_config(a: &s2mmu_arm64::linux::assets::LinuxAssets) -> LinuxConfig {
    let mut cfg = config(a, 2);
    cfg.cmdline = format!("quiet s2mmu.run=counter s2mmu.args=kib={BUFFER_KIB},ms=1");
    cfg
}

s2mmu_arm64::linux_test! {
    fn a_cut_postcopy_connection_is_recovered_automatically_and_the_guest_goes_on(a) {
        let cfg = counter_config(&a);
        let listener = transport::bind("127.0.0.1:0").expect("a loopback listener");
        let proxy = cut_proxy::start(listener.local(), CUT_AFTER, false);
        let (src, dest) = machines(&cfg, &proxy);
        let auto = Recovery::default();
        assert_eq!(auto.mode, RecoveryMode::Auto);
        let ends = migrate_through(&src, &dest, listener, &proxy.addr, (auto.clone(), auto));
        assert!(proxy.cut_done.load(Ordering::SeqCst), "the proxy never cut");
        completed_after_one_recovery(ends, &src, &dest, cfg.mem / 4096);
    }
}

/// A control socket's path for `side` in the system's temporary
/// directory (sticky: the control socket's own check accepts it).
fn sock(side: &str) -> PathBuf {
    std::env::temp_dir().join(format!("s2mmu-lrecov-{}-{side}.sock", std::process::id()))
}

/// The `pages_missing` of a status line.
fn pages_missing(status: &str) -> u64 {
    let (_, rest) = status
        .split_once("\"pages_missing\":")
        .unwrap_or_else(|| panic!("no pages_missing in {status}"));
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().expect("a count")
}

/// Polls the control socket at `path` until its side is paused; its
/// status line then.
fn until_paused(path: &Path) -> String {
    let t = Instant::now();
    loop {
        let st = control::request(path, "status").expect("the control socket answers");
        if st.contains("\"phase\":\"paused\"") {
            return st;
        }
        assert!(
            !st.contains("\"phase\":\"done\"") && !st.contains("\"phase\":\"failed\""),
            "{} ended without pausing: {st}",
            path.display()
        );
        assert!(t.elapsed() < Duration::from_secs(600), "never paused: {st}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

s2mmu_arm64::linux_test! {
    fn a_cut_postcopy_waits_for_the_operator_whose_recover_addr_resumes_it(a) {
        let cfg = counter_config(&a);
        let listener = transport::bind("127.0.0.1:0").expect("a loopback listener");
        let direct = listener.local();
        // Closed to new connections after the cut: only `recover ADDR` to the
        // destination's own address gets through.
        let proxy = cut_proxy::start(direct.clone(), CUT_AFTER, true);
        let (src_sock, dest_sock) = (sock("source"), sock("destination"));
        let manual = |path: &Path, side| Recovery {
            mode: RecoveryMode::Manual,
            wait: Duration::from_secs(300),
            control: Some(Control::start(path, side).expect("a control socket")),
        };
        let (src_rec, dest_rec) = (
            manual(&src_sock, "source"),
            manual(&dest_sock, "destination"),
        );
        let (src, dest) = machines(&cfg, &proxy);
        let operator = {
            let (s, d) = (src_sock.clone(), dest_sock.clone());
            std::thread::spawn(move || {
                let (ds, ss) = (until_paused(&d), until_paused(&s));
                let dest_ok = control::request(&d, "recover").expect("the destination answers");
                let src_ok =
                    control::request(&s, &format!("recover {direct}")).expect("the source answers");
                (ds, ss, dest_ok, src_ok)
            })
        };
        let ends = migrate_through(
            &src,
            &dest,
            listener,
            &proxy.addr,
            (src_rec.clone(), dest_rec.clone()),
        );
        let (ds, ss, dest_ok, src_ok) = operator.join().expect("the operator's thread");
        eprintln!("paused: {ds} / {ss}; answers: {dest_ok} / {src_ok}");
        assert!(proxy.cut_done.load(Ordering::SeqCst), "the proxy never cut");
        assert!(
            pages_missing(&ds) > 0,
            "the destination lacked no page at the cut: {ds}"
        );
        assert!(
            !dest_ok.starts_with("error") && !src_ok.starts_with("error"),
            "{dest_ok} / {src_ok}"
        );
        completed_after_one_recovery(ends, &src, &dest, cfg.mem / 4096);
        for r in [&src_rec, &dest_rec] {
            let st = r.control.as_ref().unwrap().status_json();
            assert!(
                st.contains("\"phase\":\"done\"") && st.contains("\"recoveries\":1"),
                "{st}"
            );
        }
        for r in [src_rec, dest_rec] {
            r.control.unwrap().stop();
        }
    }
}
