//! The `PACE` command and the brakes in the abort path.

use core::sync::atomic::Ordering;

use super::{now_ns, Brakes};
use crate::abi::HypError;
use crate::abort::AbortOutcome;
use crate::hyp::{Hyp, Vm};

impl Hyp {
    /// `PACE`: throttle ns per page dirtied, pace pages a second per vCPU
    /// ([`Brakes::from_args`]). Each vCPU's next dirtying fault works
    /// under the new brakes.
    pub(crate) fn pace(&self, vm: &Vm, args: &[u64; 6]) -> Result<(), HypError> {
        let b = Brakes::from_args(args)?;
        *vm.brakes.lock() = b;
        Ok(())
    }

    /// vCPU `vcpu`'s abort was answered, dirtying `pages` pages: what the
    /// guest does next, [`AbortOutcome::Handled`] or, when a wait is due,
    /// [`AbortOutcome::Paced`] (counted).
    pub(crate) fn brake(&self, vm: &Vm, vcpu: usize, pages: u64, permission: bool) -> AbortOutcome {
        let handled = AbortOutcome::Handled { permission };
        if pages == 0 {
            return handled;
        }
        let b = *vm.brakes.lock();
        if !b.on() {
            return handled;
        }
        let Some(v) = vm.vcpu_brakes.get(vcpu) else {
            return handled;
        };
        let (w, ahead) = v.lock().on_dirty(b, pages, now_ns());
        let c = &self.counters;
        if ahead {
            c.paced_pages.fetch_add(pages, Ordering::Relaxed);
        }
        if !w.any() {
            return handled;
        }
        c.paced_exits.fetch_add(1, Ordering::Relaxed);
        c.throttle_ns.fetch_add(w.throttle_ns, Ordering::Relaxed);
        c.pace_ns.fetch_add(w.pace_ns, Ordering::Relaxed);
        AbortOutcome::Paced {
            throttle_ns: w.throttle_ns,
            pace_ns: w.pace_ns,
        }
    }
}
