//! A migratable Linux VM's memory paths ([`crate::linux::migrate::LinuxVm`]):
//! pages read and written in bulk straight through the RAM mapping, the
//! digest (on a destination that has not run, from the hashes of what was
//! written; else every page hashed on every CPU), and post-copy's hook.

use crate::linux::lifecycle::LinuxVm;
use crate::linux::memory::{digest_of, page_hash, LinuxRam, PAGE};
use crate::linux::page_fetch::PageFetch;
use crate::linux::shared::RAM_IPA;

use crate::{Arm64Error, Result};
use std::sync::Arc;

fn range_err(first: u64, bytes: usize, pages: u64) -> Arm64Error {
    Arm64Error::Guest(format!(
        "pages {first}..+{} (of {bytes} bytes, whole pages only) outside the guest's {pages} \
         pages",
        bytes.div_ceil(PAGE)
    ))
}

impl LinuxVm {
    /// Guest RAM as one mapping: the current machine's (a VM that takes a
    /// guest back starts a new machine at its first write).
    pub fn ram(&self) -> &LinuxRam {
        &self.ram
    }

    /// Copies pages `first..` into `out` (whole pages) straight from the
    /// mapping, while the guest runs or not.
    ///
    /// # Errors
    /// A length that is not whole pages, or pages outside guest RAM.
    pub fn read_pages(&self, first: u64, out: &mut [u8]) -> Result<()> {
        let ok = out.len().is_multiple_of(PAGE)
            && first
                .checked_mul(PAGE as u64)
                .is_some_and(|off| self.ram.read_into(off, out));
        ok.then_some(())
            .ok_or_else(|| range_err(first, out.len(), self.ram.pages()))
    }

    /// Writes whole pages `data` at page `first` into a paused VM. The
    /// first write after this QEMU ran guest code starts a new QEMU (see
    /// `renew`): its translated-code cache has none of the old code.
    ///
    /// # Errors
    /// A running VM, a length that is not whole pages, pages outside guest
    /// RAM, or the new QEMU failing to start; nothing is written then.
    pub fn write_pages(&mut self, first: u64, data: &[u8]) -> Result<()> {
        if !self.paused {
            return Err(Arm64Error::Guest(
                "pages are written into a paused VM only".into(),
            ));
        }
        let n = (data.len() / PAGE) as u64;
        let fits = data.len().is_multiple_of(PAGE)
            && first
                .checked_add(n)
                .is_some_and(|end| end <= self.ram.pages());
        if !fits {
            return Err(range_err(first, data.len(), self.ram.pages()));
        }
        if self.ran {
            self.renew()?;
        }
        let ok = self.ram.write_from(first * PAGE as u64, data);
        debug_assert!(ok, "checked above");
        if let Some(h) = self.written.as_mut() {
            for (i, page) in data.chunks_exact(PAGE).enumerate() {
                let p = first + i as u64;
                h[p as usize] = page_hash(page, RAM_IPA + p * PAGE as u64);
            }
        }
        Ok(())
    }

    /// The digest of guest RAM ([`crate::linux::memory::digest_of`] the page
    /// hashes): on a VM whose QEMU has not run, from the hashes of its
    /// fresh RAM and of every page written since (nothing else writes
    /// it); otherwise every page is read and hashed, on every CPU.
    ///
    /// # Errors
    /// The hashes' memory cannot be had.
    pub fn digest(&self) -> Result<u64> {
        match &self.written {
            Some(h) if !self.ran => Ok(digest_of(h)),
            _ => self.ram.digest(),
        }
    }

    /// Sets (or with `None` removes) post-copy's hook: every vCPU's
    /// translation fault in guest RAM calls it before the engine maps the
    /// page. Set it on a destination before [`crate::linux::migrate::LinuxVm::resume_vcpus`].
    ///
    /// With the engine at EL2, a hook needs the RAM slot to be a post-copy
    /// slot there (else EL2 would map a page that has not arrived without
    /// asking): if [`crate::linux::migrate::LinuxVm::el2_postcopy`] has not
    /// made it one, this does, without logging.
    ///
    /// # Errors
    /// EL2 refuses the post-copy slot (for example, the machine has already
    /// run guest code); the hook is then left as it was.
    pub fn set_page_fetch(&mut self, hook: Option<Arc<dyn PageFetch>>) -> Result<()> {
        if hook.is_some() && !self.el2_postcopy_armed() {
            self.el2_postcopy(false)?;
        }
        self.hook = hook;
        if let Ok(r) = self.running() {
            r.sh.faults.page_fetch.set(self.hook_range());
        }
        Ok(())
    }

    /// The hook with the range it covers (all guest RAM).
    pub(in crate::linux) fn hook_range(&self) -> Option<crate::linux::page_fetch::RangeHook> {
        self.hook
            .clone()
            .map(|h| (h, self.ram.gpa(), self.ram.size()))
    }
}
