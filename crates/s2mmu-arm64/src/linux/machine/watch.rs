//! What ends a Linux VM's run whatever its guest does, and who needs a
//! kick.
//!
//! - The deadline is watched by a thread of its own ([`spawn`]) that
//!   waits on nothing the guest controls: a guest asleep in WFI with its
//!   interrupts masked, one that turned every CPU off, one looping on
//!   exits, one that never booted all reach the stop at the same instant.
//! - Each vCPU's mode, as KVM's `vcpu->mode`: in its guest, in its guest
//!   with a kick on the way, or in the host. An interrupt or a stop kicks
//!   only a vCPU that runs its guest and has no kick on the way
//!   ([`Watch::claim_kick`]); a vCPU in the host loads its list registers
//!   before it resumes and needs none.
//! - A stop's time, which a vCPU thread waiting for an exit that does not
//!   come reads to kick its own vCPU again, then to give up
//!   ([`STOP_GRACE`]).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The vCPU runs host code (an exit being answered, or no run at all).
const OUTSIDE: u8 = 0;
/// The vCPU runs its guest (or is about to): an interrupt for it needs a
/// kick.
const IN_GUEST: u8 = 1;
/// The vCPU runs its guest and a kick is on the way.
const EXITING: u8 = 2;

/// How long a vCPU thread waits for its vCPU to leave the guest after a
/// stop (kicking it again meanwhile) before it gives the vCPU up: QEMU
/// is killed with the machine.
pub(crate) const STOP_GRACE: Duration = Duration::from_secs(2);
/// How often a vCPU thread kicks its own vCPU again while it waits for
/// its exit after a stop.
pub(crate) const STOP_REKICK: Duration = Duration::from_millis(100);
/// The stub's code for "write this to ICC_SGI1R_EL1" in an answer's
/// maintenance list (`asm/hyp.S`, `exec_insns`).
pub(crate) const INSN_KICK: u64 = 0x20;
/// The SGI that kicks a CPU to EL2 (`KICK_SGI` in `asm/hyp.S`).
pub(crate) const KICK_SGI: u64 = 15;
/// How often the watchdog looks whether its VM is gone.
const WATCH_TICK: Duration = Duration::from_millis(500);

/// The vCPUs' modes, the stop's time and the watchdog.
pub(crate) struct Watch {
    modes: Vec<AtomicU8>,
    stopped_at: OnceLock<Instant>,
    m: Mutex<()>,
    cv: Condvar,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Watch {
    /// A watch over `vcpus` vCPUs, each in the host.
    pub(crate) fn new(vcpus: usize) -> Arc<Watch> {
        Arc::new(Watch {
            modes: (0..vcpus).map(|_| AtomicU8::new(OUTSIDE)).collect(),
            stopped_at: OnceLock::new(),
            m: Mutex::new(()),
            cv: Condvar::new(),
            thread: Mutex::new(None),
        })
    }

    /// vCPU `id` is about to run its guest. Sequentially consistent with
    /// [`Watch::claim_kick`]: either the pending interrupts its thread
    /// reads next include one raised meanwhile, or the raise sees the
    /// vCPU in its guest and kicks it.
    pub(crate) fn enter(&self, id: usize) {
        if let Some(m) = self.modes.get(id) {
            m.store(IN_GUEST, Ordering::SeqCst);
        }
    }

    /// vCPU `id` was turned on (it is about to run its guest) or off.
    pub(crate) fn powered(&self, id: usize, on: bool) {
        if on {
            self.enter(id);
        } else {
            self.exited(id);
        }
    }

    /// vCPU `id` left its guest (an exit is being answered, or the run
    /// ended).
    pub(crate) fn exited(&self, id: usize) {
        if let Some(m) = self.modes.get(id) {
            m.store(OUTSIDE, Ordering::SeqCst);
        }
    }

    /// Whether vCPU `id` needs a kick now: it runs its guest and no kick
    /// is on the way. A `true` marks the kick as on the way; the caller
    /// sends it.
    pub(crate) fn claim_kick(&self, id: usize) -> bool {
        self.modes.get(id).is_some_and(|m| {
            m.compare_exchange(IN_GUEST, EXITING, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        })
    }

    /// Notes the stop (its first time counts) and wakes the watchdog.
    pub(crate) fn stopped(&self) {
        self.stopped_at.get_or_init(Instant::now);
        let _g = self.m.lock().unwrap_or_else(|p| p.into_inner());
        self.cv.notify_all();
    }

    /// How long ago the VM was stopped, if it was.
    pub(crate) fn stopped_for(&self) -> Option<Duration> {
        self.stopped_at.get().map(Instant::elapsed)
    }

    /// Waits for the watchdog's thread, once the VM is stopped.
    pub(crate) fn join(&self) {
        let t = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

/// Starts the watchdog of `vm`: at `deadline` it calls `on_deadline`
/// with the VM; it ends at any stop, or when the VM is gone. It holds the
/// VM only for that call.
///
/// # Errors
/// The thread could not be made (the text says why).
pub(crate) fn spawn<T: Send + Sync + 'static>(
    vm: &Arc<T>,
    watch: &Arc<Watch>,
    deadline: Instant,
    on_deadline: fn(&T),
) -> Result<(), String> {
    let weak: Weak<T> = Arc::downgrade(vm);
    let w = watch.clone();
    let t = std::thread::Builder::new()
        .name("linux-deadline".into())
        .spawn(move || watchdog(&weak, &w, deadline, on_deadline))
        .map_err(|e| format!("the deadline's thread: {e}"))?;
    *watch.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(t);
    Ok(())
}

fn watchdog<T>(weak: &Weak<T>, watch: &Watch, deadline: Instant, on_deadline: fn(&T)) {
    let mut g = watch.m.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        if watch.stopped_at.get().is_some() || weak.strong_count() == 0 {
            return;
        }
        let now = Instant::now();
        if now >= deadline {
            drop(g);
            if let Some(vm) = weak.upgrade() {
                on_deadline(&vm);
            }
            return;
        }
        let nap = (deadline - now).min(WATCH_TICK);
        g = watch
            .cv
            .wait_timeout(g, nap)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vcpu_is_kicked_once_while_in_its_guest_and_never_in_the_host() {
        let w = Watch::new(2);
        assert!(!w.claim_kick(0), "a vCPU in the host needs no kick");
        w.enter(0);
        assert!(w.claim_kick(0), "a vCPU in its guest needs one");
        assert!(!w.claim_kick(0), "a second while the first is on the way");
        assert!(!w.claim_kick(1), "another vCPU is not touched");
        w.exited(0);
        assert!(!w.claim_kick(0));
        w.powered(1, true);
        assert!(w.claim_kick(1));
        w.powered(1, false);
        w.enter(1);
        w.exited(1);
        assert!(!w.claim_kick(1));
        assert!(!w.claim_kick(7), "no such vCPU");
    }

    #[test]
    fn the_first_stop_is_the_one_timed() {
        let w = Watch::new(1);
        assert_eq!(w.stopped_for(), None);
        w.stopped();
        let first = w.stopped_for().expect("stopped");
        std::thread::sleep(Duration::from_millis(5));
        w.stopped();
        assert!(w.stopped_for().expect("stopped") >= first);
    }
}
