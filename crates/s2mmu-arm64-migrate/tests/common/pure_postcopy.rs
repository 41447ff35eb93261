//! Pure post-copy of the Linux guest: A's VM reports every page dirty
//! at each harvest, so the session switches with all of memory missing
//! on B. On this machine A's guest dirties few pages during round 0 (its
//! vCPUs share two cores with the sending threads) and the background
//! stream brings those in a few milliseconds, before B's guest touches
//! them; with every page missing, B's guest faults on pages that have
//! not come yet.

use s2mmu_arm64_migrate::ram::LinuxGuestRam;
use s2mmu_arm64_migrate::session_source::{LinuxSessionVm, LinuxSource};
use s2mmu_migrate::session::guest::{GuestShape, NoHook, SourceGuest};
use s2mmu_migrate::session::postcopy::Final;
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::vm::{GuestCounters, GuestRun, RamSlot, SessionVm, VmError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A's VM with every page reported dirty at each harvest: the session
/// then switches with all of memory missing on B (pure post-copy).
pub struct EveryPageDirty(Arc<LinuxSessionVm>);

impl SessionVm for EveryPageDirty {
    type Ram = LinuxGuestRam;
    fn ram(&self) -> &Arc<LinuxGuestRam> {
        self.0.ram()
    }
    fn slots(&self) -> &[RamSlot] {
        self.0.slots()
    }
    fn enable_dirty_logging(&self) -> Result<(), VmError> {
        self.0.enable_dirty_logging()
    }
    fn disable_dirty_logging(&self) -> Result<(), VmError> {
        self.0.disable_dirty_logging()
    }
    fn get_dirty_log(&self, slot: u16, bitmap: &mut [u64]) -> Result<(), VmError> {
        self.0.get_dirty_log(slot, bitmap)?;
        let pages = self.0.ram().size() / 4096;
        for (i, w) in bitmap.iter_mut().enumerate() {
            let left = pages.saturating_sub(i as u64 * 64);
            *w = if left >= 64 {
                u64::MAX
            } else {
                (1 << left) - 1
            };
        }
        Ok(())
    }
    fn clear_dirty_log(&self, slot: u16, first: u64, n: u64, mask: &[u64]) -> Result<(), VmError> {
        self.0.clear_dirty_log(slot, first, n, mask)
    }
}

/// The Linux source over [`EveryPageDirty`]; everything else is
/// [`LinuxSource`]'s.
/// `on_pause`, when set, is raised each time the session pauses A's
/// guest (at the switch): a test arms its connection cut with it.
pub struct PurePostcopy {
    pub src: LinuxSource,
    vm: Arc<EveryPageDirty>,
    on_pause: Option<Arc<AtomicBool>>,
}

impl PurePostcopy {
    pub fn new(src: LinuxSource) -> PurePostcopy {
        let vm = Arc::new(EveryPageDirty(src.vm().clone()));
        PurePostcopy {
            src,
            vm,
            on_pause: None,
        }
    }

    /// As [`PurePostcopy::new`], raising `flag` when A's guest pauses.
    pub fn raising_on_pause(src: LinuxSource, flag: Arc<AtomicBool>) -> PurePostcopy {
        PurePostcopy {
            on_pause: Some(flag),
            ..PurePostcopy::new(src)
        }
    }
}

impl GuestRun for PurePostcopy {
    fn pause(&self) {
        if let Some(f) = &self.on_pause {
            f.store(true, Ordering::SeqCst);
        }
        self.src.pause()
    }
    fn resume(&self) {
        self.src.resume()
    }
    fn counters(&self) -> GuestCounters {
        self.src.counters()
    }
    fn set_throttle_ns(&self, ns: u64) {
        self.src.set_throttle_ns(ns)
    }
    fn pace(&self) -> u64 {
        self.src.pace()
    }
    fn set_pace(&self, p: u64) {
        self.src.set_pace(p)
    }
}

impl SourceGuest for PurePostcopy {
    type Vm = EveryPageDirty;
    type Hook = NoHook;
    fn vm(&self) -> &Arc<EveryPageDirty> {
        &self.vm
    }
    fn shape(&self) -> GuestShape {
        self.src.shape()
    }
    fn counter_source(&self) -> Arc<dyn Fn() -> GuestCounters + Send + Sync> {
        self.src.counter_source()
    }
    fn state(&self, pace: u64) -> Result<Vec<u8>, MigrateError> {
        self.src.state(pace)
    }
    fn begin_hook(&self) -> Result<NoHook, MigrateError> {
        Ok(NoHook)
    }
    fn supports_postcopy(&self) -> bool {
        self.src.supports_postcopy()
    }
    fn verify_final(&self, state: &[u8], fin: &Final) -> Result<Vec<(u16, u64)>, MigrateError> {
        self.src.verify_final(state, fin)
    }
}

/// After a post-copy switch: runs B's guest on and checks that the guest
/// went on where A stopped, and that A's guest never ran again.
///
/// The counter checks its buffer holds the previous step's values before
/// each step (a FAIL line otherwise), so B's first steps read the pages
/// that came by post-copy. A line the switch cut in two is whole only in
/// A's text and B's joined: every step once, in order, across the switch,
/// and more than 3 past A's last. A's console and stub exits stay as they
/// were at the switch.
pub fn check_b_goes_on(a: &LinuxSessionVm, b: &LinuxSessionVm) {
    use super::counter::{counter_lines, wait_lines};
    use s2mmu_arm64_migrate::session_run::steps;
    let (a_text, a_exits) = {
        let a = a.lock();
        (a.console().contents(), a.stub_exits())
    };
    // The session ran B for its run_after, then paused it: run it on.
    let mut bvm = b.lock();
    bvm.resume_vcpus().expect("B runs on");
    let n = counter_lines(&bvm.console().contents()).len();
    let b1 = wait_lines(&bvm, 0, n + 5, "B");
    assert!(!b1.contains("FAIL"), "B's counter failed its check:\n{b1}");
    let all = steps(&format!("{a_text}{b1}"));
    let last_a = steps(&a_text).last().copied().expect("A counted");
    assert!(
        all.iter().any(|&n| n > last_a + 3),
        "B did not go on: {all:?}"
    );
    assert!(
        all.windows(2).all(|w| w[1] == w[0] + 1) && all[0] == 1,
        "the counter's steps across the switch: {all:?}"
    );
    let a = a.lock();
    assert_eq!(a.console().contents(), a_text, "A printed after the switch");
    assert_eq!(a.stub_exits(), a_exits, "A's guest ran after the switch");
    bvm.shut_down().expect("B's threads end cleanly");
}
