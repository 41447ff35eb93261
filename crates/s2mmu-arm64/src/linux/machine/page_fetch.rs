//! Post-copy's hook on a Linux VM: on a destination, guest RAM pages that
//! have not arrived are not mapped at stage 2 (a destination maps 4 KiB
//! pages, so mapping one page never maps a missing neighbour); the
//! engine's stage-2 translation fault on such a page is its request. The
//! faulting vCPU's host thread calls the [`PageFetch`] (a migration's
//! request for the page) before the engine maps the page and waits there
//! while the other vCPUs run on.

use crate::linux::memory::PAGE;
use crate::machine::Exit;
use crate::vm::fault_kind;
use crate::{Arm64Error, Result};
use s2mmu::mmu::FaultKind;
use std::sync::{Arc, RwLock};

/// Where a destination vCPU's translation fault in guest RAM goes first:
/// a post-copy migration's request for the page. The engine's one trait
/// for it, which the migration session implements and every VM calls.
pub use s2mmu::mmu::PageFetch;

/// A hook and the guest-physical range it covers (base, bytes).
pub(crate) type RangeHook = (Arc<dyn PageFetch>, u64, u64);

/// The hook of a running VM.
#[derive(Default)]
pub(crate) struct HookSlot(RwLock<Option<RangeHook>>);

impl HookSlot {
    /// Sets (or with `None` removes) the hook for `[gpa, gpa + size)`.
    pub(crate) fn set(&self, hook: Option<RangeHook>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = hook;
    }

    fn get(&self) -> Option<RangeHook> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Before the engine handles a stage-2 abort: a translation fault in the
    /// hooked range waits for its page.
    ///
    /// # Errors
    /// [`Arm64Error::Guest`] naming the page when the hook cannot have it.
    pub(crate) fn before_fault(&self, id: usize, e: &Exit) -> Result<()> {
        let Some((hook, base, size)) = self.get() else {
            return Ok(());
        };
        let ipa = e.ipa();
        if ipa < base
            || ipa - base >= size
            || !matches!(fault_kind(e.dfsc()), Some(FaultKind::Translation))
        {
            return Ok(());
        }
        hook.fetch(id, ipa & !(PAGE as u64 - 1))
            .map(|_| ())
            .map_err(|why| {
                Arm64Error::Guest(format!(
                    "vCPU {id}: the page at IPA {ipa:#x} is not on this host and could not be \
                     fetched: {why}"
                ))
            })
    }
}
