//! The brakes a migration puts on a Linux guest that dirties memory
//! faster than it is sent (`linux/dirty_limit.rs`), on a real guest: the
//! `dirtier` writing as fast as it can under dirty logging, harvested
//! through the session's `SessionVm`. With a pace (the dirty limit) or a
//! throttle (auto-converge) set, the pages dirtied between two harvests
//! fall below the unbraked guest's, to within what the pace or the
//! throttle allows for the time between the harvests; the counters show
//! the paced faults and the throttle's sleep. A pause does not wait for a
//! throttle's whole delay. The guest's own check of every page passes.

mod common;

use common::counter::config;
use s2mmu_arm64::linux::migrate::LinuxVm;
use s2mmu_arm64::linux::session_source::LinuxSource;
use s2mmu_arm64::linux::vm::RAM_SLOT;
use s2mmu_migrate::session::guest::SourceGuest;
use s2mmu_migrate::vm::{GuestRun, SessionVm};
use std::time::{Duration, Instant};

const VCPUS: u64 = 2;

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

/// Pages dirtied over about a second from a fresh harvest, and the
/// seconds between the two harvests. Each page dirtied faulted at least
/// once in between (the first harvest write-protected it).
fn window(src: &LinuxSource, words: usize) -> (u64, f64) {
    let f0 = src.limit_counters().write_faults;
    harvest(src, words);
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let n = harvest(src, words);
    let secs = t.elapsed().as_secs_f64();
    let faults = src.limit_counters().write_faults - f0;
    eprintln!("window: {n} pages dirtied, {faults} dirtying faults, {secs:.2} s");
    // A fault counts just after the engine logged its page: one per vCPU
    // may be logged before the second GET and counted after it.
    assert!(faults + VCPUS >= n, "{n} pages dirtied, {faults} faults");
    (n, secs)
}

fn no_fail(vm: &LinuxVm) {
    let text = vm.console().contents();
    assert!(
        !text.contains(": FAIL"),
        "the dirtier's check failed:\n{text}"
    );
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn pace_and_throttle_slow_a_linux_guests_dirtying() {
    let _one = common::serial();
    let Some(a) = common::linux_assets() else {
        return;
    };
    let mut cfg = config(&a, VCPUS as usize);
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

    let (free, _) = window(&src, words);
    let before = src.limit_counters();
    assert!(free > 0, "the dirtier dirtied nothing");
    assert_eq!((before.paced_faults, before.throttled_ns), (0, 0));

    // The dirty limit: 20 pages a second per vCPU.
    let pace = 20;
    src.set_pace(pace);
    assert_eq!(src.pace(), pace);
    let (paced, secs) = window(&src, words);
    let c = src.limit_counters();
    eprintln!("unbraked {free} pages, paced {paced} pages in {secs:.2} s; {c:?}");
    assert!(c.paced_faults > 0 && c.paced_ns > 0, "{c:?}");
    assert!(paced < free, "paced {paced} pages, unbraked {free}");
    // Each vCPU's faults keep to the pace: one at the window's start, one
    // for the lead under the slack, one logged at the GET, a few more.
    let most = VCPUS * (pace as f64 * secs) as u64 + VCPUS * 5;
    assert!(paced <= most, "paced {paced} pages, at most {most} allowed");
    src.set_pace(0);

    // Auto-converge's throttle: 5 ms per page written.
    src.set_throttle_ns(5_000_000);
    let (throttled, secs) = window(&src, words);
    let c2 = src.limit_counters();
    eprintln!("throttled {throttled} pages in {secs:.2} s; {c2:?}");
    assert!(c2.throttled_ns > 0, "{c2:?}");
    assert!(throttled < free, "throttled {throttled}, unbraked {free}");
    let most = VCPUS * (secs / 0.005) as u64 + VCPUS * 2;
    assert!(
        throttled <= most,
        "throttled {throttled} pages, at most {most}"
    );
    assert_eq!(c2.paced_faults, c.paced_faults, "no pace: no paced fault");

    // A throttle of 120 s a page: a pause (its deadline is 60 s) stops the
    // vCPUs asleep in it without waiting for the rest.
    src.set_throttle_ns(120_000_000_000);
    std::thread::sleep(Duration::from_millis(500));
    src.vm()
        .lock()
        .pause_vcpus()
        .expect("the pause cuts the throttle's sleep short");
    src.set_throttle_ns(0);
    let slept = src.limit_counters().throttled_ns - c2.throttled_ns;
    assert!(slept < 60_000_000_000, "slept {slept} ns");
    src.vm().lock().resume_vcpus().expect("resume");

    // Unbraked again: the guest dirties as before, and its check passes.
    let (again, _) = window(&src, words);
    assert!(again > paced, "unbraked again {again}, paced {paced}");
    src.vm().disable_dirty_logging().expect("dirty logging off");
    let mut vm = src.vm().lock();
    no_fail(&vm);
    vm.shut_down().expect("shut down");
}
