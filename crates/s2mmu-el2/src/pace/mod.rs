//! The brakes on a guest that dirties memory faster than a migration sends
//! it, applied in EL2's write-fault path: auto-converge's throttle (a delay
//! owed per page dirtied) and the dirty limit's pace (pages a second per
//! vCPU), computed as the host placement computes them.
//!
//! EL2 does not sleep with the guest's CPU: each page a vCPU's fault
//! dirties adds to what the vCPU owes, and once that reaches a batch (a
//! millisecond of throttle, or a lead of 200 µs over its pace) the fault,
//! answered, goes to the host with the delay
//! ([`crate::AbortOutcome::Paced`]). The vCPU's host thread sleeps it
//! before the guest resumes, so a pause or a stop can cut it short. KVM's
//! dirty limit works the same way: a vCPU over its quota exits to user
//! space, which sleeps.
//!
//! Time is the physical counter (`CNTPCT_EL0`), which no guest's virtual
//! offset moves ([`now_ns`]; a [`crate::Hyp`] may be given another clock,
//! as the host's tests do). Without a clock, where the counter's frequency
//! is unknown (off aarch64, or firmware that left `CNTFRQ_EL0` 0), `PACE`
//! refuses a pace ([`HypError::NoClock`]): time standing still would put
//! every vCPU further ahead of its pace with each page, without bound.

use crate::abi::HypError;

/// The largest throttle `PACE` takes: ten minutes a page.
pub const MAX_THROTTLE_NS: u64 = 600_000_000_000;
/// The fastest pace `PACE` takes: a page a nanosecond.
pub const MAX_PACE: u64 = 1_000_000_000;
/// Throttle owed goes to the host once it reaches this.
pub const THROTTLE_BATCH_NS: u64 = 1_000_000;
/// A lead over the pace goes to the host once it reaches this (a shorter
/// one stays on the pace's clock, served at a later fault).
pub const PACE_SLACK_NS: u64 = 200_000;

/// The brakes the host set (`PACE`): 0 is off for each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Brakes {
    /// Nanoseconds owed per page dirtied (auto-converge).
    pub throttle_ns: u64,
    /// Pages a second each vCPU may dirty (the dirty limit).
    pub pace: u64,
}

impl Brakes {
    /// `PACE`'s arguments, checked in this order: the throttle over
    /// [`MAX_THROTTLE_NS`], the pace over [`MAX_PACE`], an argument after
    /// the second not 0 (each [`HypError::BadArgument`]).
    ///
    /// # Errors
    /// As listed.
    pub fn from_args(args: &[u64; 6]) -> Result<Brakes, HypError> {
        if args[0] > MAX_THROTTLE_NS || args[1] > MAX_PACE || args[2..] != [0; 4] {
            return Err(HypError::BadArgument);
        }
        Ok(Brakes {
            throttle_ns: args[0],
            pace: args[1],
        })
    }

    /// Whether either brake is on.
    pub fn on(&self) -> bool {
        self.throttle_ns != 0 || self.pace != 0
    }
}

/// What a vCPU must wait before its guest goes on (0 each: nothing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wait {
    /// The throttle owed, in nanoseconds.
    pub throttle_ns: u64,
    /// The lead over the pace, in nanoseconds.
    pub pace_ns: u64,
}

impl Wait {
    /// Whether there is anything to wait.
    pub fn any(&self) -> bool {
        self.throttle_ns != 0 || self.pace_ns != 0
    }
}

/// One vCPU's brake state, touched by its own CPU's abort handler only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VcpuBrake {
    /// Throttle owed and not handed to the host yet.
    owed_ns: u64,
    /// When the vCPU may dirty its next page at its pace: a virtual clock
    /// advanced one interval per page.
    next_ns: u64,
}

impl VcpuBrake {
    /// The vCPU's fault dirtied `pages` pages at `now_ns` under `b`: adds
    /// what they owe, and returns what is due now (taken off what is owed)
    /// and whether the vCPU was ahead of its pace.
    pub fn on_dirty(&mut self, b: Brakes, pages: u64, now_ns: u64) -> (Wait, bool) {
        let mut w = Wait::default();
        if b.throttle_ns == 0 {
            self.owed_ns = 0;
        } else {
            self.owed_ns = self
                .owed_ns
                .saturating_add(b.throttle_ns.saturating_mul(pages));
            if self.owed_ns >= THROTTLE_BATCH_NS {
                w.throttle_ns = core::mem::take(&mut self.owed_ns);
            }
        }
        if b.pace == 0 {
            return (w, false);
        }
        // One interval per page; a vCPU that fell behind its clock (idle,
        // paused, throttled) restarts from now, with no burst to catch up.
        let interval = 1_000_000_000 / b.pace;
        let next = self.next_ns.max(now_ns);
        self.next_ns = next.saturating_add(interval.saturating_mul(pages));
        let lead = next - now_ns;
        if lead >= PACE_SLACK_NS {
            w.pace_ns = lead;
        }
        (w, lead > 0)
    }

    /// The pace changed: the vCPU's clock restarts from its next fault,
    /// so no lead built under the old pace is owed under the new one.
    pub fn restart_pace(&mut self) {
        self.next_ns = 0;
    }
}

/// Nanoseconds of the physical counter now: `None` off aarch64, or where
/// the counter's frequency is not set.
pub fn now_ns() -> Option<u64> {
    #[cfg(target_arch = "aarch64")]
    {
        use crate::platform::GenericTimer;
        use aarch64_cpu::asm::barrier;
        use aarch64_cpu::registers::{Readable, CNTPCT_EL0};
        barrier::isb(barrier::SY);
        let ticks = CNTPCT_EL0.get();
        GenericTimer::frequency().map(|hz| GenericTimer::ticks_to_ns(ticks, hz))
    }
    #[cfg(not(target_arch = "aarch64"))]
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_bounded() {
        let a = |t, p, x| [t, p, x, 0, 0, 0];
        assert_eq!(
            Brakes::from_args(&a(MAX_THROTTLE_NS, MAX_PACE, 0)),
            Ok(Brakes {
                throttle_ns: MAX_THROTTLE_NS,
                pace: MAX_PACE
            })
        );
        for bad in [
            a(MAX_THROTTLE_NS + 1, 0, 0),
            a(0, MAX_PACE + 1, 0),
            a(0, 0, 1),
            [0, 0, 0, 0, 0, 9],
        ] {
            assert_eq!(Brakes::from_args(&bad), Err(HypError::BadArgument));
        }
    }

    #[test]
    fn throttle_is_owed_per_page_and_handed_over_in_batches() {
        let b = Brakes {
            throttle_ns: 400_000,
            pace: 0,
        };
        let mut v = VcpuBrake::default();
        assert_eq!(v.on_dirty(b, 1, 0), (Wait::default(), false));
        assert_eq!(v.on_dirty(b, 1, 0), (Wait::default(), false));
        let (w, _) = v.on_dirty(b, 1, 0);
        assert_eq!(w.throttle_ns, 1_200_000);
        assert_eq!(v.owed_ns, 0);
        // Off: what is owed is forgiven.
        v.on_dirty(b, 1, 0);
        v.on_dirty(Brakes::default(), 1, 0);
        assert_eq!(v.owed_ns, 0);
    }

    #[test]
    fn a_vcpu_ahead_of_its_pace_owes_its_lead() {
        // 1 ms a page.
        let b = Brakes {
            throttle_ns: 0,
            pace: 1000,
        };
        let mut v = VcpuBrake::default();
        assert_eq!(v.on_dirty(b, 1, 5_000_000), (Wait::default(), false));
        for i in 1..20u64 {
            let (w, ahead) = v.on_dirty(b, 1, 5_000_000);
            assert!(ahead);
            assert_eq!(w.pace_ns, i * 1_000_000);
        }
        // Behind its clock: restarts from now, no lead.
        assert_eq!(v.on_dirty(b, 1, 1_000_000_000), (Wait::default(), false));
        // A lead under the slack (100 µs at 10,000 a second) stays on the
        // clock.
        let fast = Brakes {
            throttle_ns: 0,
            pace: 10_000,
        };
        v.on_dirty(fast, 1, 2_000_000_000);
        assert_eq!(v.on_dirty(fast, 1, 2_000_000_000), (Wait::default(), true));
        let (w, _) = v.on_dirty(fast, 1, 2_000_000_000);
        assert_eq!(w.pace_ns, 200_000);
    }

    #[test]
    fn a_new_pace_restarts_the_clock() {
        let slow = Brakes {
            throttle_ns: 0,
            pace: 100,
        };
        let mut v = VcpuBrake::default();
        // Five pages at one instant at 10 ms a page: the clock is 50 ms on.
        for _ in 0..5 {
            v.on_dirty(slow, 1, 7_000_000);
        }
        assert_eq!(v.next_ns, 57_000_000);
        // Loosened to 10,000 a second: the old lead is not owed.
        v.restart_pace();
        let fast = Brakes {
            throttle_ns: 0,
            pace: 10_000,
        };
        assert_eq!(v.on_dirty(fast, 1, 7_000_000), (Wait::default(), false));
        assert_eq!(v.next_ns, 7_100_000);
    }

    #[cfg(not(target_arch = "aarch64"))]
    #[test]
    fn off_aarch64_there_is_no_clock() {
        assert_eq!(now_ns(), None);
    }
}
