//! The brakes a migration puts on a Linux guest that dirties memory
//! faster than it is sent (`s2mmu_arm64::linux::dirty_limit`), on a real guest: the
//! `dirtier` writing as fast as it can under dirty logging, harvested
//! through the session's `SessionVm`. With a pace (the dirty limit) or a
//! throttle (auto-converge) set, the pages dirtied in a window stay within
//! what the pace or the throttle allows for the window's length; unbraked,
//! before and after, the guest dirties more than either allows. The
//! counters show the paced faults and the throttle's sleep. A pause does
//! not wait for a throttle's whole delay. The guest's own check of every
//! page passes. Both placements of the engine: with the engine at EL2 the
//! guest's write faults never reach the host, and EL2 applies the brakes
//! in its fault path, handing each wait it works out to the host (the
//! counters show those exits).
//!
//! No check compares two windows of fixed length: a window lasts until
//! what it shows has happened (at least a second), so a guest that a
//! loaded machine leaves unscheduled for a while only makes it longer.
//! Its bounds are rates over the window's own measured length, which the
//! brakes keep to however little the guest runs.

mod common;

use common::counter::config;
use s2mmu_arm64::linux::assets::LinuxAssets;
use s2mmu_arm64::linux::dirty_limit::DirtyLimitCounters;
use s2mmu_arm64::linux::migrate::LinuxVm;
use s2mmu_arm64::linux::vm::{Engine, RAM_SLOT};
use s2mmu_arm64_migrate::session_source::LinuxSource;
use s2mmu_migrate::session::guest::SourceGuest;
use s2mmu_migrate::vm::{GuestRun, SessionVm};
use std::time::{Duration, Instant};

const VCPUS: u64 = 2;
/// The dirty limit: pages a second per vCPU. Far below what the unbraked
/// dirtier writes even on a heavily loaded machine, where each page it
/// writes under the host placement is a stage-2 fault through QEMU.
const PACE: u64 = 4;
/// Auto-converge's throttle: nanoseconds slept per page written (at most
/// 4 pages a second per vCPU).
const THROTTLE_NS: u64 = 250_000_000;
/// The longest a window waits for what it shows: a bound for a hung guest,
/// not a speed.
const WINDOW_LIMIT: Duration = Duration::from_secs(300);

/// The most pages the pace lets the vCPUs dirty in `secs`: each vCPU's
/// faults keep to the pace, plus one at the window's start, one for the
/// lead under the slack, one logged at a GET, a few more.
fn paced_most(secs: f64) -> u64 {
    VCPUS * (PACE as f64 * secs) as u64 + VCPUS * 5
}

/// The most pages the throttle lets the vCPUs dirty in `secs` (each page's
/// fault sleeps its delay before the next; one in flight per vCPU at each
/// end).
fn throttled_most(secs: f64) -> u64 {
    VCPUS * (secs * 1e9 / THROTTLE_NS as f64) as u64 + VCPUS * 2
}

/// Pages dirtied since the last harvest, re-armed as the session does it
/// (GET, then CLEAR of what it reported).
fn harvest(src: &LinuxSource, words: usize) -> u64 {
    let mut bitmap = vec![0u64; words];
    let vm = src.vm();
    vm.get_dirty_log(RAM_SLOT, &mut bitmap)
        .expect("GET of the RAM slot");
    vm.clear_dirty_log(RAM_SLOT, 0, words as u64 * 64, &bitmap)
        .expect("CLEAR of the RAM slot");
    bitmap.iter().map(|w| u64::from(w.count_ones())).sum()
}

/// A window from a fresh harvest, harvested every 200 ms, that ends once
/// it has lasted a second and `done(pages, secs, counters)` holds for the
/// pages dirtied in it so far, its seconds and the counters now: those
/// pages and seconds. Each page dirtied faulted once in between (a
/// harvest write-protected it).
fn window(
    src: &LinuxSource,
    words: usize,
    what: &str,
    done: impl Fn(u64, f64, &DirtyLimitCounters) -> bool,
) -> (u64, f64) {
    let f0 = src.limit_counters().write_faults;
    harvest(src, words);
    let t = Instant::now();
    let mut n = 0;
    let secs = loop {
        std::thread::sleep(Duration::from_millis(200));
        n += harvest(src, words);
        let secs = t.elapsed().as_secs_f64();
        if secs >= 1.0 && done(n, secs, &src.limit_counters()) {
            break secs;
        }
        assert!(
            t.elapsed() < WINDOW_LIMIT,
            "{what}: not within {WINDOW_LIMIT:?}: {n} pages in {secs:.1} s, {:?}",
            src.limit_counters()
        );
    };
    let faults = src.limit_counters().write_faults - f0;
    eprintln!("{what}: {n} pages dirtied, {faults} dirtying faults, {secs:.2} s");
    // A fault counts just after the engine logged its page: one per vCPU
    // may be logged before the last GET and counted after it.
    assert!(faults + VCPUS >= n, "{n} pages dirtied, {faults} faults");
    (n, secs)
}

/// An unbraked window: until the guest has dirtied more than the pace and
/// the throttle would each allow in that time (a guest that never does,
/// a brake left on, fails at [`WINDOW_LIMIT`]).
fn unbraked(src: &LinuxSource, words: usize, what: &str) -> u64 {
    let (n, secs) = window(src, words, what, |n, secs, _| {
        n > paced_most(secs).max(throttled_most(secs))
    });
    eprintln!(
        "{what}: {n} pages in {secs:.2} s, over the pace's {} and the throttle's {}",
        paced_most(secs),
        throttled_most(secs)
    );
    n
}

fn no_fail(vm: &LinuxVm) {
    let text = vm.console().contents();
    assert!(
        !text.contains(": FAIL"),
        "the dirtier's check failed:\n{text}"
    );
}

/// The brakes as `engine`'s placement applies them, seen in the counters:
/// the exits EL2 handed a wait to the host are counted at EL2 only.
fn check_placement(engine: Engine, before: &DirtyLimitCounters, now: &DirtyLimitCounters) {
    assert_eq!(now.el2_refused, 0, "EL2 took every brake: {now:?}");
    match engine {
        Engine::El2 => assert!(
            now.el2_paced_exits > before.el2_paced_exits,
            "EL2 handed no wait to the host: {now:?}"
        ),
        Engine::Host => assert_eq!(now.el2_paced_exits, 0, "{now:?}"),
    }
}

/// A throttle of 120 s a page: a pause (its deadline is 60 s) stops the
/// vCPUs asleep in it without waiting for the rest.
fn pause_cuts_a_throttle_short(src: &LinuxSource) {
    let c = src.limit_counters();
    src.set_throttle_ns(120_000_000_000);
    std::thread::sleep(Duration::from_millis(500));
    src.vm()
        .lock()
        .pause_vcpus()
        .expect("the pause cuts the throttle's sleep short");
    src.set_throttle_ns(0);
    let slept = src.limit_counters().throttled_ns - c.throttled_ns;
    assert!(slept < 60_000_000_000, "slept {slept} ns");
    src.vm().lock().resume_vcpus().expect("resume");
}

s2mmu_arm64::linux_test! {
    fn pace_and_throttle_slow_a_linux_guests_dirtying(a) { brakes_slow_the_dirtier(&a, Engine::Host) }
    fn pace_and_throttle_slow_a_linux_guests_dirtying_at_el2(a) { brakes_slow_the_dirtier(&a, Engine::El2) }
}

fn brakes_slow_the_dirtier(a: &LinuxAssets, engine: Engine) {
    let mut cfg = config(a, VCPUS as usize);
    cfg.engine = engine;
    cfg.cmdline = "quiet s2mmu.run=dirtier s2mmu.args=mem=16,file=0,rate=0,secs=3600".into();
    let vm = LinuxVm::boot(&cfg).expect("the guest boots");
    let t = Instant::now();
    while !vm.console().contents().contains("s2mmu-dirtier: start") {
        assert!(vm.stopped().is_none(), "{}", vm.console().contents());
        assert!(t.elapsed() < Duration::from_secs(900), "no dirtier");
        std::thread::sleep(Duration::from_millis(100));
    }
    let words = (cfg.mem / 4096).div_ceil(64) as usize;
    let src = LinuxSource::new(vm);
    src.vm().enable_dirty_logging().expect("dirty logging on");

    let free = unbraked(&src, words, "unbraked");
    let before = src.limit_counters();
    assert_eq!((before.paced_faults, before.throttled_ns), (0, 0));
    assert_eq!(before.el2_paced_exits, 0);

    // The dirty limit: the window lasts until a fault found its vCPU
    // ahead of the pace and the vCPU slept for it.
    src.set_pace(PACE);
    assert_eq!(src.pace(), PACE);
    let (paced, secs) = window(&src, words, "paced", |_, _, c| {
        c.paced_faults > before.paced_faults && c.paced_ns > before.paced_ns
    });
    let c = src.limit_counters();
    eprintln!("unbraked {free} pages, paced {paced} pages in {secs:.2} s; {c:?}");
    let most = paced_most(secs);
    assert!(paced <= most, "paced {paced} pages, at most {most} allowed");
    assert_eq!(c.throttled_ns, 0, "no throttle: no throttle's sleep");
    check_placement(engine, &before, &c);
    src.set_pace(0);

    // Auto-converge's throttle: the window lasts until a vCPU slept for it.
    src.set_throttle_ns(THROTTLE_NS);
    let (throttled, secs) = window(&src, words, "throttled", |_, _, c2| c2.throttled_ns > 0);
    let c2 = src.limit_counters();
    eprintln!("throttled {throttled} pages in {secs:.2} s; {c2:?}");
    let most = throttled_most(secs);
    assert!(
        throttled <= most,
        "throttled {throttled} pages, at most {most}"
    );
    assert_eq!(c2.paced_faults, c.paced_faults, "no pace: no paced fault");
    check_placement(engine, &c, &c2);

    pause_cuts_a_throttle_short(&src);

    // Unbraked again: the guest dirties faster than either brake allows
    // (`unbraked` waits for it), and its check passes.
    unbraked(&src, words, "unbraked again");
    src.vm().disable_dirty_logging().expect("dirty logging off");
    let mut vm = src.vm().lock();
    no_fail(&vm);
    vm.shut_down().expect("shut down");
}
