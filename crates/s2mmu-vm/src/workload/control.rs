//! Pause and pace control of a workload: the block the host and the vCPU
//! threads share ([`Control`]), the host's pause, resume and free-running
//! switches, and the vCPU side of them: parking while paused and keeping
//! to a pace (QEMU's dirty-limit).

use super::pass::{LiveCounters, VcpuState};
use crate::vcpu::Vcpu;
use crate::vm::KnownFormat;
use s2mmu::memslot::MemslotStore;
use s2mmu::mmu::FaultStats;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
// Lock poisoning: the `Control` mutexes hold plain per-vCPU records that are
// replaced or pushed whole, and vCPU threads report failures as errors, not
// panics; the `unwrap`s only propagate a panic that is already a bug.
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// State shared between the host and the vCPU threads.
pub struct Control {
    /// Pass the host asks for (vCPUs run passes until they reach it).
    pub(super) target: AtomicU64,
    /// Free-running mode: vCPUs run passes until stopped (migration).
    pub(super) free_running: AtomicBool,
    pub(super) paused: AtomicBool,
    /// Per vCPU: whether it is executing guest accesses right now.
    pub(super) running: Vec<AtomicBool>,
    pub(super) stop: AtomicBool,
    /// Passes each vCPU completed.
    pub(super) done: Vec<AtomicU64>,
    /// Pages written by each vCPU, in total (updated at the end of a pass).
    pub pages_written: Vec<AtomicU64>,
    /// Live counters of each vCPU, updated every [`LIVE_EVERY`](super::LIVE_EVERY) accesses
    /// and at the end of every pass: for throughput timelines.
    pub live: Vec<LiveCounters>,
    /// Delay per page in nanoseconds (0 = none): the throttle, served in
    /// sleeps of at least a millisecond outside guest mode.
    pub throttle_ns: AtomicU64,
    /// Pages per second each vCPU accesses at most (0 = as fast as it
    /// can): a guest that dirties memory at a set rate. vCPUs that are
    /// ahead of it sleep outside guest mode; lowering it is QEMU's
    /// dirty-limit.
    pub pace_pages_per_sec: AtomicU64,
    /// Where each vCPU is: saved whenever it stops for a pause and at the
    /// end of each pass, so a paused workload can be resumed elsewhere.
    pub(super) states: Mutex<Vec<VcpuState>>,
    /// Percent of accesses that are writes, read at the start of each pass
    /// (starts as the configuration's).
    pub write_percent: AtomicU64,
    /// Whether passes visit pages at random, read at the start of each pass.
    pub random: AtomicBool,
    /// Last pass-completion time of each vCPU and its duration.
    pub(super) pass_times: Mutex<Vec<Vec<Duration>>>,
    pub(super) fault_stats: Mutex<Vec<FaultStats>>,
    pub(super) errors: Mutex<Vec<String>>,
    /// Time spent stopped on a full dirty ring, nanoseconds, all vCPUs.
    pub ring_full_wait_ns: AtomicU64,
    /// The host thread waiting in [`Workload::run_pass`], woken when a vCPU
    /// ends its pass or stops on a full ring (it sleeps instead of polling,
    /// so it takes no CPU from the vCPUs on a machine with few cores).
    pub(super) host: Mutex<Option<std::thread::Thread>>,
}

impl Control {
    pub(super) fn new(vcpus: usize) -> Self {
        Control {
            target: AtomicU64::new(0),
            free_running: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            running: (0..vcpus).map(|_| AtomicBool::new(false)).collect(),
            stop: AtomicBool::new(false),
            done: (0..vcpus).map(|_| AtomicU64::new(0)).collect(),
            pages_written: (0..vcpus).map(|_| AtomicU64::new(0)).collect(),
            live: (0..vcpus).map(|_| LiveCounters::default()).collect(),
            throttle_ns: AtomicU64::new(0),
            pace_pages_per_sec: AtomicU64::new(0),
            states: Mutex::new(vec![VcpuState::default(); vcpus]),
            write_percent: AtomicU64::new(100),
            random: AtomicBool::new(false),
            pass_times: Mutex::new(vec![Vec::new(); vcpus]),
            fault_stats: Mutex::new(vec![FaultStats::default(); vcpus]),
            errors: Mutex::new(Vec::new()),
            ring_full_wait_ns: AtomicU64::new(0),
            host: Mutex::new(None),
        }
    }

    pub(super) fn wake_host(&self) {
        if let Some(t) = self.host.lock().unwrap().as_ref() {
            t.unpark();
        }
    }

    /// Each vCPU's guest writes so far, from its [`live`](Self::live)
    /// counters (updated every [`LIVE_EVERY`](super::LIVE_EVERY) accesses
    /// and at the end of each pass): whether a vCPU ran since an earlier
    /// reading.
    pub fn live_writes(&self) -> Vec<u64> {
        self.live
            .iter()
            .map(|l| l.writes.load(Ordering::Relaxed))
            .collect()
    }
}

/// Keeps a vCPU at its pace: pages per second from a start instant.
pub(super) struct Pacer {
    pub(super) rate: u64,
    pub(super) since: Instant,
    pub(super) pages: u64,
}

impl Pacer {
    /// How long to sleep before the next access (None: on time or behind).
    /// A vCPU that fell far behind (paused, throttled) does not burst to
    /// catch up: its schedule restarts.
    pub(super) fn delay(&mut self, rate: u64) -> Option<Duration> {
        if rate != self.rate {
            *self = Pacer {
                rate,
                since: Instant::now(),
                pages: 0,
            };
        }
        if rate == 0 {
            return None;
        }
        self.pages += 1;
        let due =
            self.since + Duration::from_nanos(self.pages.saturating_mul(1_000_000_000) / rate);
        let now = Instant::now();
        if due > now {
            Some(due - now)
        } else {
            if now - due > Duration::from_millis(50) {
                self.since = now;
                self.pages = 0;
            }
            None
        }
    }
}

/// Marks the vCPU running unless the host paused it; while paused, waits
/// outside guest mode. Returns false if the workload is stopping.
pub(super) fn park<S: MemslotStore, F: KnownFormat>(
    vcpu: &mut Vcpu<S, F>,
    idx: usize,
    c: &Control,
) -> bool {
    loop {
        c.running[idx].store(true, Ordering::SeqCst);
        if !c.paused.load(Ordering::SeqCst) {
            return true;
        }
        vcpu.exit();
        c.running[idx].store(false, Ordering::SeqCst);
        while c.paused.load(Ordering::SeqCst) {
            if c.stop.load(Ordering::Acquire) {
                return false;
            }
            // [`Workload::resume`] and stop unpark vCPUs.
            std::thread::park_timeout(Duration::from_millis(1));
        }
    }
}
