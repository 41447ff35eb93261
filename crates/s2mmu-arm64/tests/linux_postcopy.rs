//! Post-copy of a running Linux guest between QEMU machines in one
//! process: the destination resumes before (some or all of) its RAM has
//! arrived; a vCPU's stage-2 translation fault on a missing page is that
//! page's request, served before the engine maps it, while the background
//! copy brings the rest. The guest program `counter` must go on from its
//! next step with every hash right, and the source's guest must not run
//! again. A destination whose pages cannot be had stops with an error
//! naming the page instead of running on zeros.

mod common;

use common::counter::{check_lives, config, wait_lines};
use s2mmu_arm64::linux::migrate::LinuxVm;
use s2mmu_arm64::linux::postcopy::{migrate_postcopy, PageFetch, PostcopyPolicy};
use s2mmu_arm64::linux::vm::StopReason;
use s2mmu_migrate::{MigratableVm, Pausable};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `n` pre-copy passes, then post-copy of whatever is dirty.
fn passes(n: u32) -> PostcopyPolicy {
    PostcopyPolicy {
        precopy_passes: n,
        switch_below_pages: 0,
    }
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn linux_guest_goes_on_by_postcopy() {
    let _one = common::serial();
    let Some(a) = common::linux_assets() else {
        return;
    };
    let cfg = config(&a, 2);
    let mut vm_a = LinuxVm::boot(&cfg).expect("A boots");
    wait_lines(&vm_a, 0, 3, "A");

    // Pure post-copy: nothing is copied before the pause, so every page
    // B's guest touches is a remote fault.
    let mut vm_b = LinuxVm::blank(&cfg).expect("B starts");
    let r = migrate_postcopy(&mut vm_a, &mut vm_b, &passes(0)).expect("A -> B by post-copy");
    eprintln!("A -> B, post-copy only: {r:?}");
    let a_text = vm_a.console().contents();
    let a_exits = vm_a.stub_exits();
    assert_eq!(r.missing, vm_a.page_count(), "every page was missing");
    assert_eq!(
        r.by_fault + r.by_background,
        r.missing,
        "each page landed once"
    );
    assert!(
        r.by_fault > 0,
        "B's guest faulted on no missing page: {r:?}"
    );
    let b1 = wait_lines(&vm_b, 0, 5, "B");
    check_lives(&[&a_text, &b1]);
    assert_eq!(
        vm_a.console().contents(),
        a_text,
        "A's guest printed after the switch"
    );
    assert_eq!(vm_a.stub_exits(), a_exits, "A's guest ran after the switch");
    drop(vm_a);

    // Pre-copy passes first: only what the guest wrote since the last one
    // is missing.
    let mut vm_c = LinuxVm::blank(&cfg).expect("C starts");
    let r =
        migrate_postcopy(&mut vm_b, &mut vm_c, &passes(2)).expect("B -> C by pre- then post-copy");
    eprintln!("B -> C, 2 pre-copy passes: {r:?}");
    let b_text = vm_b.console().contents();
    assert!(r.missing < vm_b.page_count(), "{r:?}");
    assert_eq!(
        r.by_fault + r.by_background,
        r.missing,
        "each page landed once"
    );
    let c1 = wait_lines(&vm_c, 0, 5, "C");
    check_lives(&[&a_text, &b_text, &c1]);
    assert_eq!(
        vm_b.console().contents(),
        b_text,
        "B's guest printed after the switch"
    );
    vm_c.shut_down().expect("C's threads end cleanly");
}

/// A post-copy source that is gone: every request fails.
struct Gone(AtomicU64);

impl PageFetch for Gone {
    fn fetch(&self, _vcpu: usize, gpa: u64) -> Result<bool, String> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Err(format!("no source for {gpa:#x}"))
    }
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn missing_page_that_cannot_come_stops_the_destination() {
    let _one = common::serial();
    let Some(a) = common::linux_assets() else {
        return;
    };
    let cfg = config(&a, 1);
    let mut vm_a = LinuxVm::boot(&cfg).expect("A boots");
    let a1 = wait_lines(&vm_a, 0, 2, "A");
    vm_a.pause().expect("A pauses");
    let state = vm_a.save_state().expect("A's state");
    let mut vm_b = LinuxVm::blank(&cfg).expect("B starts");
    vm_b.restore_state(&state).expect("B takes A's state");
    let gone = Arc::new(Gone(AtomicU64::new(0)));
    vm_b.set_page_fetch(Some(gone.clone()));
    vm_b.resume().expect("B starts its vCPU");
    let t = Instant::now();
    let why = loop {
        if let Some(r) = vm_b.stopped() {
            break r;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
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
    vm_a.resume().expect("A resumes");
    let n = common::counter::counter_lines(&a1).len();
    wait_lines(&vm_a, 0, n + 2, "A after B failed");
}
