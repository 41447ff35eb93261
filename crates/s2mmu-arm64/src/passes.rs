//! The passes of a dirty-logging run: the coordinator starts each pass,
//! vCPU threads report the passes their guests finished (from the guest's
//! HVC) and wait at EL2 for the next, so the host harvests a quiet guest.

use crate::{Arm64Error, Result};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// Pass coordination between the host's coordinator and vCPU threads.
pub(crate) struct Control {
    pub(crate) state: Mutex<CtlState>,
    pub(crate) cv: Condvar,
}

pub(crate) struct CtlState {
    pub(crate) next: u64,
    pub(crate) stop: bool,
    pub(crate) done: Vec<Option<u64>>,
    pub(crate) failed: Option<String>,
    pub(crate) bad_tags: Vec<(u64, u64)>,
}

impl Control {
    pub(crate) fn report(&self, vcpu: usize, pass: u64) {
        let mut s = self.state.lock().unwrap();
        s.done[vcpu] = Some(pass);
        self.cv.notify_all();
    }

    /// Blocks a vCPU that finished `done` until the next pass or the stop.
    pub(crate) fn next_after(&self, done: u64) -> Option<u64> {
        let mut s = self.state.lock().unwrap();
        loop {
            if s.stop || s.failed.is_some() {
                return None;
            }
            if s.next > done {
                return Some(s.next);
            }
            s = self.cv.wait(s).unwrap();
        }
    }

    pub(crate) fn fail(&self, why: String) {
        let mut s = self.state.lock().unwrap();
        s.failed.get_or_insert(why);
        self.cv.notify_all();
    }

    pub(crate) fn go(&self, pass: u64) {
        self.state.lock().unwrap().next = pass;
        self.cv.notify_all();
    }

    pub(crate) fn wait_all(&self, pass: u64) -> Result<()> {
        let deadline = Instant::now() + crate::machine::DEADLINE;
        let mut s = self.state.lock().unwrap();
        loop {
            if let Some(f) = &s.failed {
                return Err(Arm64Error::Guest(f.clone()));
            }
            if s.done.iter().all(|&d| d.is_some_and(|d| d >= pass)) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Arm64Error::Boot(format!(
                    "vCPUs did not finish pass {pass}"
                )));
            }
            s = self.cv.wait_timeout(s, deadline - now).unwrap().0;
        }
    }

    pub(crate) fn all_done(&self, pass: u64) -> bool {
        let s = self.state.lock().unwrap();
        s.done.iter().all(|&d| d.is_some_and(|d| d >= pass))
    }

    pub(crate) fn stop(&self) {
        self.state.lock().unwrap().stop = true;
        self.cv.notify_all();
    }
}
