//! Stage-2 changes the host makes under a running Linux between two
//! harvests, while the dirtier checks its data and the hash check runs:
//! MMU-notifier remaps of guest pages (copy, switch, old page poisoned) and
//! logging stopped (huge pages collapsed back in place) then started again.

use super::vm::{Shared, RAM_SLOT};
use crate::layout;
use crate::Result;

/// What the host changes under the guest while it logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HostChange {
    /// Nothing.
    #[default]
    None,
    /// After every harvest, move up to `pages` of the pages that harvest
    /// logged to fresh host pages through the engine's MMU notifier
    /// ([`crate::vm::Arm64Vm::remap_host_page`]), until the spare host
    /// memory ([`SPARE_BYTES`]) is used up.
    Remap {
        /// Pages moved per harvest.
        pages: u32,
    },
    /// After harvest `at`, stop logging (the engine collapses the split
    /// blocks back in place, [`s2mmu::mmu::MmuPolicy::recover_in_place`]),
    /// and start it again `after` ticks of the harvest period later.
    Collapse {
        /// The harvest after which logging stops.
        at: u64,
        /// Harvest periods without logging.
        after: u64,
    },
}

/// Host memory past guest RAM that remapped pages move to.
pub const SPARE_BYTES: u64 = 16 << 20;

impl HostChange {
    /// Host memory the change needs past guest RAM.
    pub fn spare_bytes(self) -> u64 {
        match self {
            HostChange::Remap { .. } => SPARE_BYTES,
            _ => 0,
        }
    }
}

/// The host side of the changes as the harvester runs them.
pub(crate) struct Changer {
    change: HostChange,
    /// Page index inside the machine's data region of each guest page.
    pub(crate) loc: Vec<u64>,
    next_spare: u64,
    spare_end: u64,
    /// Pages remapped.
    pub(crate) remapped: u64,
    /// Blocks collapsed back in place.
    pub(crate) collapsed: u64,
    /// Times logging stopped and started again.
    pub(crate) pauses: u64,
    resume_at: Option<u64>,
    cursor: u64,
}

impl Changer {
    pub(crate) fn new(change: HostChange, npages: u64) -> Changer {
        Changer {
            change,
            loc: (0..npages).collect(),
            next_spare: npages,
            spare_end: npages + change.spare_bytes() / 4096,
            remapped: 0,
            collapsed: 0,
            pauses: 0,
            resume_at: None,
            cursor: 0,
        }
    }

    /// Whether logging is paused now.
    pub(crate) fn paused(&self) -> bool {
        self.resume_at.is_some()
    }

    /// After harvest number `harvests` (1-based) was checked, with
    /// `bitmap` its log: makes this harvest's change.
    ///
    /// # Errors
    /// The engine's and the remap's errors.
    pub(crate) fn after_harvest(
        &mut self,
        sh: &Shared,
        harvests: u64,
        bitmap: &[u64],
    ) -> Result<()> {
        match self.change {
            HostChange::None => Ok(()),
            HostChange::Remap { pages } => self.remap(sh, pages, bitmap),
            HostChange::Collapse { at, after } if harvests == at => {
                let before = sh.vm.mmu().vm_stats().collapsed;
                sh.vm.mmu().disable_dirty_logging(RAM_SLOT)?;
                self.collapsed += sh.vm.mmu().vm_stats().collapsed - before;
                self.resume_at = Some(after);
                self.pauses += 1;
                Ok(())
            }
            HostChange::Collapse { .. } => Ok(()),
        }
    }

    /// One harvest period passed with logging paused: `true` once logging
    /// is back on (the caller then hashes afresh).
    ///
    /// # Errors
    /// The engine's errors.
    pub(crate) fn tick_paused(&mut self, sh: &Shared) -> Result<bool> {
        match self.resume_at {
            Some(0) | None => {
                sh.vm.mmu().enable_dirty_logging(RAM_SLOT)?;
                self.resume_at = None;
                Ok(true)
            }
            Some(n) => {
                self.resume_at = Some(n - 1);
                Ok(false)
            }
        }
    }

    fn remap(&mut self, sh: &Shared, pages: u32, bitmap: &[u64]) -> Result<()> {
        let ram = sh.vm.machine().ram();
        let mut left = pages;
        let n = self.loc.len() as u64;
        // From where the last harvest's moves stopped, so that the moves
        // spread over the RAM.
        for i in 0..n {
            let p = (self.cursor + i) % n;
            if left == 0 || self.next_spare >= self.spare_end {
                break;
            }
            if bitmap[(p / 64) as usize] >> (p % 64) & 1 == 0 {
                continue;
            }
            let hva = ram
                .hva(layout::DATA + p * 4096)
                .expect("guest RAM lies inside the machine's data region");
            let new_pa = layout::DATA + self.next_spare * 4096;
            sh.vm.remap_host_page(hva, new_pa)?;
            self.loc[p as usize] = self.next_spare;
            self.next_spare += 1;
            self.remapped += 1;
            left -= 1;
            self.cursor = p + 1;
        }
        Ok(())
    }
}
