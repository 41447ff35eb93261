//! Stage-2 changes the host makes under a running Linux between two
//! harvests, while the dirtier checks its data and the hash check runs:
//! MMU-notifier remaps of guest pages (copy, switch, old page poisoned) and
//! logging stopped (huge pages collapsed back in place) then started again,
//! and a logged memslot outside RAM (a framebuffer the guest maps through
//! `/dev/mem`) moved to other host memory at the same guest address.

use crate::layout;
use crate::linux::fdt::FdtConfig;
use crate::linux::placement::Placement;
use crate::linux::shared::{RamFaults, RAM_SLOT};
use crate::Result;
use s2mmu::mmu::DirtyMode;
use std::sync::atomic::Ordering;

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
    /// blocks back in place, [`s2mmu::mmu::HugePageRecovery::Collapse`]),
    /// and start it again `after` ticks of the harvest period later.
    Collapse {
        /// The harvest after which logging stops.
        at: u64,
        /// Harvest periods without logging.
        after: u64,
    },
    /// A framebuffer: a memslot of [`FB_SIZE`] bytes at [`FB_IPA`] (a
    /// region node in the device tree, mapped by the guest through
    /// `/dev/mem`), logged like RAM. During harvest `at` the host moves it
    /// as a VMM moves a framebuffer: guest faults on it wait (as KVM's on an
    /// invalid slot), the harvest collects its log, the slot is deleted,
    /// its contents copied to other host memory, and the slot added again at
    /// the same IPA from there, logging.
    MoveSlot {
        /// The harvest that moves it.
        at: u64,
    },
    /// A fixed amount of work: the framebuffer's memslot (as for
    /// [`HostChange::MoveSlot`], never moved) written by the dirtier in
    /// `passes` passes (`fb=...,paced=N`), each page once a pass. The host
    /// starts each pass after the harvest that collected the last, so each
    /// pass's pages are logged once each, and records how many per pass
    /// ([`crate::linux::dirty::HarvestReport::per_pass`]): under write
    /// protection, the write faults the pass took on the slot.
    Paced {
        /// Passes the host starts.
        passes: u64,
    },
}

/// The framebuffer's guest-physical address (below RAM, clear of the
/// devices).
pub const FB_IPA: u64 = 0x1000_0000;
/// The framebuffer's size.
pub const FB_SIZE: u64 = 1 << 20;
/// The framebuffer's memslot.
pub const FB_SLOT: u16 = 2;

/// Whether `ipa` lies in the framebuffer.
pub(crate) fn in_fb(ipa: u64) -> bool {
    (FB_IPA..FB_IPA + FB_SIZE).contains(&ipa)
}

/// The framebuffer's memslot (backed right after guest RAM) and its device
/// tree node, where `change` moves one.
///
/// # Errors
/// The engine's memslot errors.
pub(crate) fn add_framebuffer(
    vm: &dyn Placement,
    change: HostChange,
    mem: u64,
    f: &mut FdtConfig,
) -> Result<()> {
    if change.fb_pages() > 0 {
        vm.add_slot(FB_SLOT, FB_IPA, layout::DATA + mem, FB_SIZE, 4096)?;
        f.framebuffer = Some((FB_IPA, FB_SIZE));
    }
    Ok(())
}

/// Host memory past guest RAM that remapped pages move to.
pub const SPARE_BYTES: u64 = 16 << 20;

impl HostChange {
    /// Whether the change can run under `mode`: a framebuffer move holds
    /// guest writes by holding faults, which hardware dirty state does not
    /// take (and without logging nothing runs between harvests).
    ///
    /// # Errors
    /// A message naming the change and the mode.
    pub fn check(self, mode: Option<DirtyMode>) -> std::result::Result<(), String> {
        let bad = match self {
            HostChange::None => false,
            HostChange::MoveSlot { .. } => mode.is_none_or(DirtyMode::hardware),
            HostChange::Paced { passes } => mode.is_none() || !(1..=1000).contains(&passes),
            _ => mode.is_none(),
        };
        if bad {
            let mode = mode.map_or("off", DirtyMode::name);
            return Err(format!("host change {self:?} under dirty mode {mode}"));
        }
        Ok(())
    }

    /// Pages of the framebuffer, if the change has one.
    pub fn fb_pages(self) -> u64 {
        match self {
            HostChange::MoveSlot { .. } | HostChange::Paced { .. } => FB_SIZE / 4096,
            _ => 0,
        }
    }

    /// Host memory the change needs past guest RAM.
    pub fn spare_bytes(self) -> u64 {
        match self {
            HostChange::Remap { .. } => SPARE_BYTES,
            // Whole 2 MiB: the machine's data region is made of them.
            HostChange::MoveSlot { .. } | HostChange::Paced { .. } => 2 * FB_SIZE,
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
    /// Times the framebuffer moved.
    pub(crate) moves: u64,
    resume_at: Option<u64>,
    cursor: u64,
    /// [`HostChange::Paced`]: the pass started last (0: none yet), the
    /// last pass the dirtier had finished before this harvest, the pages
    /// logged since the pass started, and each finished pass's.
    go: u64,
    done: u64,
    acc: u64,
    pub(crate) per_pass: Vec<u64>,
}

impl Changer {
    /// `npages` of guest RAM; the framebuffer's pages follow them in
    /// [`Changer::loc`] and in the harvester's bitmaps.
    pub(crate) fn new(change: HostChange, npages: u64) -> Changer {
        Changer {
            change,
            loc: (0..npages + change.fb_pages()).collect(),
            next_spare: npages,
            spare_end: npages + change.spare_bytes() / 4096,
            remapped: 0,
            collapsed: 0,
            pauses: 0,
            moves: 0,
            resume_at: None,
            cursor: 0,
            go: 0,
            done: 0,
            acc: 0,
            per_pass: Vec::new(),
        }
    }

    /// The logged slots: (memslot, first bit in the harvester's bitmap,
    /// pages).
    pub(crate) fn slots(&self, npages: u64) -> Vec<(u16, u64, u64)> {
        let mut v = vec![(RAM_SLOT, 0, npages)];
        if self.change.fb_pages() > 0 {
            v.push((FB_SLOT, npages, self.change.fb_pages()));
        }
        v
    }

    /// Before harvest number `harvests + 1`: where this harvest moves the
    /// framebuffer, holds guest faults on it from now on.
    pub(crate) fn before_harvest(&self, faults: &RamFaults, harvests: u64) {
        if self.change == (HostChange::MoveSlot { at: harvests + 1 }) {
            faults.fb_moving.store(true, Ordering::Release);
        }
    }

    /// Under [`HostChange::Paced`]: whether the pass the host started last
    /// is still running. The harvester then skips the harvest, so that no
    /// harvest re-protects a page in the middle of its pass: each page of
    /// a pass is logged once, whatever the timing.
    pub(crate) fn pass_running(&mut self, vm: &dyn Placement) -> bool {
        if let HostChange::Paced { .. } = self.change {
            self.done = vm.machine().ram().read(self.control() + 8);
            return self.go > 0 && self.done < self.go;
        }
        false
    }

    /// The paced framebuffer's control page: word 0 the pass the host
    /// started, word 1 the last the dirtier finished.
    fn control(&self) -> u64 {
        let last = *self.loc.last().expect("the framebuffer has pages");
        layout::DATA + last * 4096
    }

    /// After a harvest under [`HostChange::Paced`] that logged `fb_logged`
    /// of the framebuffer's pages: a pass finished before it is recorded
    /// and the next one started.
    fn pace(&mut self, vm: &dyn Placement, passes: u64, fb_logged: u64) {
        self.acc += fb_logged;
        if self.go > 0 && self.done < self.go {
            return;
        }
        if self.go > 0 && (self.per_pass.len() as u64) < self.go {
            self.per_pass.push(self.acc);
        }
        self.acc = 0;
        if self.go < passes {
            self.go += 1;
            vm.machine().ram().write(self.control(), self.go);
        }
    }

    /// The page the host itself wrote after the last harvest (the paced
    /// framebuffer's control page): the check hashes it afresh.
    pub(crate) fn host_written(&self) -> Option<usize> {
        match self.change {
            HostChange::Paced { .. } => Some(self.loc.len() - 1),
            _ => None,
        }
    }

    /// After the harvest collected the framebuffer's log (no guest write
    /// reached it since: faults on it wait, and the harvest re-protected
    /// it): deletes its slot, copies it to the other backing, adds it again
    /// logging, and lets the faults go on. `npages`: guest RAM's pages;
    /// `bitmap`: the harvest's log (bit `npages` the framebuffer's first).
    ///
    /// With the engine at EL2, faults on the framebuffer are answered there
    /// until its slot is gone, so the delete hands back the log of the
    /// writes since the harvest (`MEMSLOT_DELETE_LOGGED`), added to this
    /// one; in ring mode those writes are in the rings for the next.
    ///
    /// # Errors
    /// The engine's memslot errors.
    pub(crate) fn move_framebuffer(
        &mut self,
        vm: &dyn Placement,
        faults: &RamFaults,
        npages: u64,
        mode: Option<DirtyMode>,
        bitmap: &mut [u64],
    ) -> Result<()> {
        if !faults.fb_moving.load(Ordering::Acquire) {
            return Ok(());
        }
        let ram = vm.machine().ram();
        let from = layout::DATA + self.loc[npages as usize] * 4096;
        let to = if from == layout::DATA + (npages << 12) {
            from + FB_SIZE
        } else {
            layout::DATA + (npages << 12)
        };
        // Without rings the slot's last log joins this harvest's.
        let first = (npages / 64) as usize;
        let words = &mut bitmap[first..first + (FB_SIZE / 4096 / 64) as usize];
        let last = mode.is_some_and(|m| m.ring_entries().is_none());
        vm.delete_slot(FB_SLOT, FB_IPA, from, last.then_some(words))?;
        for off in (0..FB_SIZE).step_by(8) {
            ram.write(to + off, ram.read(from + off));
        }
        vm.add_slot(FB_SLOT, FB_IPA, to, FB_SIZE, 4096)?;
        vm.enable_dirty_logging(FB_SLOT)?;
        for (i, l) in self.loc[npages as usize..].iter_mut().enumerate() {
            *l = (to - layout::DATA) / 4096 + i as u64;
        }
        self.moves += 1;
        faults.fb_moving.store(false, Ordering::Release);
        Ok(())
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
        vm: &dyn Placement,
        harvests: u64,
        bitmap: &[u64],
    ) -> Result<()> {
        match self.change {
            HostChange::None | HostChange::MoveSlot { .. } => Ok(()),
            HostChange::Paced { passes } => {
                let first = self.loc.len() as u64 - FB_SIZE / 4096;
                let fb = (first..self.loc.len() as u64)
                    .filter(|&p| bitmap[(p / 64) as usize] >> (p % 64) & 1 == 1)
                    .count() as u64;
                self.pace(vm, passes, fb);
                Ok(())
            }
            HostChange::Remap { pages } => self.remap(vm, pages, bitmap),
            HostChange::Collapse { at, after } if harvests == at => {
                self.collapsed += vm.collapse(RAM_SLOT)?;
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
    pub(crate) fn tick_paused(&mut self, vm: &dyn Placement) -> Result<bool> {
        match self.resume_at {
            Some(0) | None => {
                vm.enable_dirty_logging(RAM_SLOT)?;
                self.resume_at = None;
                Ok(true)
            }
            Some(n) => {
                self.resume_at = Some(n - 1);
                Ok(false)
            }
        }
    }

    fn remap(&mut self, vm: &dyn Placement, pages: u32, bitmap: &[u64]) -> Result<()> {
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
            let new_pa = layout::DATA + self.next_spare * 4096;
            vm.remap_page(layout::DATA + p * 4096, new_pa)?;
            self.loc[p as usize] = self.next_spare;
            self.next_spare += 1;
            self.remapped += 1;
            left -= 1;
            self.cursor = p + 1;
        }
        Ok(())
    }
}
