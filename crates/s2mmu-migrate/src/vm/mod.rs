//! The VM interface the session runs over: [`SessionVm`] (guest RAM as
//! one or more mappings, [`GuestRam`] and [`RamRegions`], and the
//! engine's dirty log), [`GuestRun`] (stop and go, throttle, pace,
//! counters), and post-copy's [`PageFetch`].

pub mod regions;
#[cfg(test)]
mod regions_tests;
mod words;

pub use regions::{RamRegion, RamRegions, RamSlot, RegionError, PAGE_SIZE};
use std::fmt;

/// An error of the VM behind the interface, with its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmError {
    /// What failed, in the VM's words.
    pub what: String,
}

impl VmError {
    /// An error with text `what`.
    pub fn new(what: impl Into<String>) -> VmError {
        VmError { what: what.into() }
    }
}

impl fmt::Display for VmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)
    }
}

impl std::error::Error for VmError {}

/// A page a dirty ring named: its slot's id and its page index there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingEntry {
    /// The slot's id ([`RamSlot::id`]).
    pub slot: u32,
    /// Page index in the slot.
    pub offset: u64,
}

/// Guest RAM as the session reads it while the guest runs (the sender)
/// and writes it before the guest runs (the receiver), straight through
/// the host mappings, without a copy through the VM.
///
/// Guest RAM is one or more regions, each its own host mapping (below
/// and above a PCI hole, hot-plugged memory); its offsets `0..size()` run
/// over them back to back, in guest-physical order (see [`regions`]: a
/// VMM describes its regions with [`RamRegions`], which checks them and
/// answers [`GuestRam::host_span`] and [`SessionVm::slots`] so that the
/// two agree).
///
/// # Safety
/// For every offset `o` below [`GuestRam::size`], [`GuestRam::host_span`]
/// returns `Some((h, n))` with `h` 8-byte aligned and `n > 0` bytes from
/// `h` mapped readable and writable, holding RAM offsets `o..o + n`, for
/// as long as the value lives; for a page-aligned `o`, `n` is a multiple
/// of [`PAGE_SIZE`] (no page straddles two mappings). Past the end it returns `None`,
/// and its answers never change. Every other access the VM makes to the
/// mapped bytes is atomic per 8-byte word (the session reads and writes
/// them per word while vCPUs may run), so racing with the session is not
/// UB.
pub unsafe trait GuestRam: Send + Sync {
    /// Bytes of guest RAM, all regions together.
    fn size(&self) -> u64;

    /// The host address of RAM offset `offset` and the bytes mapped
    /// contiguously from there (to the end of its region); `None` at or
    /// past [`GuestRam::size`].
    fn host_span(&self, offset: u64) -> Option<(u64, u64)>;

    /// The host address of RAM offset `offset` when `len` bytes from it
    /// lie in one mapping.
    fn host_range(&self, offset: u64, len: u64) -> Option<u64> {
        let (host, n) = self.host_span(offset)?;
        (len <= n).then_some(host)
    }

    /// Copies `out.len()` bytes at `offset` into `out`, per 8-byte word
    /// (across regions where they meet); false (and `out` untouched) when
    /// they are not all inside, or `offset` or the length is not a
    /// multiple of 8.
    fn read_into(&self, offset: u64, out: &mut [u8]) -> bool {
        words::read(self.size(), |o| self.host_span(o), offset, out)
    }

    /// Copies `data` to `offset`, per 8-byte word; false (and nothing
    /// written) when it does not fit, or `offset` or the length is not a
    /// multiple of 8.
    fn write_from(&self, offset: u64, data: &[u8]) -> bool {
        words::write(self.size(), |o| self.host_span(o), offset, data)
    }
}

/// Post-copy's page request: what a destination vCPU calls on a fault on
/// a page that has not arrived. The engine's trait, which the simulated and
/// the arm64 VMs call too.
pub use s2mmu::mmu::PageFetch;

/// What the network session ([`crate::session`]) needs of a VM's memory
/// and dirty log. Shared by the sending threads, so every method takes
/// `&self`.
pub trait SessionVm: Send + Sync + 'static {
    /// Its guest RAM.
    type Ram: GuestRam + 'static;

    /// Guest RAM.
    fn ram(&self) -> &std::sync::Arc<Self::Ram>;

    /// The memslots, in guest-physical order.
    fn slots(&self) -> &[RamSlot];

    /// The guest-physical address of the first slot.
    fn gpa_base(&self) -> u64 {
        self.slots().first().map_or(0, |s| s.gpa)
    }

    /// The slot holding `gpa` and the offset of `gpa` in guest RAM.
    fn locate(&self, gpa: u64) -> Option<(RamSlot, u64)> {
        self.slots()
            .iter()
            .find(|s| gpa >= s.gpa && gpa - s.gpa < s.size)
            .map(|s| (*s, s.mem_offset + gpa - s.gpa))
    }

    /// Starts dirty logging on every slot.
    ///
    /// # Errors
    /// The engine's.
    fn enable_dirty_logging(&self) -> Result<(), VmError>;

    /// Stops dirty logging on every slot.
    ///
    /// # Errors
    /// The engine's.
    fn disable_dirty_logging(&self) -> Result<(), VmError>;

    /// `KVM_GET_DIRTY_LOG`: ORs the pages of slot `slot` written since the
    /// last call into `bitmap` (bit i: page i of the slot).
    ///
    /// # Errors
    /// The engine's (an unknown slot, a bitmap too short).
    fn get_dirty_log(&self, slot: u16, bitmap: &mut [u64]) -> Result<(), VmError>;

    /// `KVM_CLEAR_DIRTY_LOG`: re-arms (write-protects) the pages of `mask`
    /// (bit i: page `first + i`) in `n` pages of slot `slot`.
    ///
    /// # Errors
    /// The engine's.
    fn clear_dirty_log(&self, slot: u16, first: u64, n: u64, mask: &[u64]) -> Result<(), VmError>;

    /// Appends every dirty ring's entries to `out` (rings only).
    ///
    /// # Errors
    /// The engine's (no rings).
    fn harvest_rings(&self, _out: &mut Vec<RingEntry>) -> Result<(), VmError> {
        Err(VmError::new("this VM has no dirty rings"))
    }

    /// Resets the harvested rings (re-protecting their pages).
    ///
    /// # Errors
    /// The engine's (no rings).
    fn reset_rings(&self) -> Result<(), VmError> {
        Err(VmError::new("this VM has no dirty rings"))
    }

    /// Whether vCPU `vcpu`'s ring is past its soft limit (false for a
    /// vCPU that does not exist, or without rings).
    fn ring_soft_full(&self, _vcpu: usize) -> bool {
        false
    }

    /// Sets the hook that vCPUs created from now on call on a fault
    /// before the page is mapped (post-copy: absent pages are not
    /// mapped, and the fault is their request).
    ///
    /// # Errors
    /// This VM cannot run post-copy.
    fn set_page_fetch(&self, _fetch: Option<std::sync::Arc<dyn PageFetch>>) -> Result<(), VmError> {
        Err(VmError::new("this VM does not support post-copy"))
    }

    /// Readies a destination VM for a post-copy resume, with its dirty log
    /// on already: what [`SessionVm::set_page_fetch`] would otherwise do
    /// first (a VM whose engine runs elsewhere makes its memory a slot
    /// that maps no page until the host has it). The session calls it at
    /// SYNC, before SYNCED, when the source announced the switch, so that
    /// it runs while the source's guest still runs rather than inside the
    /// downtime; `set_page_fetch` then only sets the hook. Nothing by
    /// default.
    ///
    /// # Errors
    /// The engine's refusal (the source's guest goes on there).
    fn prepare_postcopy(&self) -> Result<(), VmError> {
        Ok(())
    }
}

/// The guest's own counters, for the figures of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuestCounters {
    /// Guest writes (pages written by the guest; 0 when unknown).
    pub writes: u64,
    /// Nanoseconds the vCPUs ran guest code (0 when unknown).
    pub guest_ns: u64,
}

/// The running guest as the source's convergence and the destination's
/// resume see it: stop and go, throttle, dirty-rate limit, counters.
pub trait GuestRun: Send + Sync {
    /// Stops every vCPU at an instruction boundary (returns when they
    /// have stopped).
    fn pause(&self);

    /// Asks the vCPUs to stop without waiting.
    fn request_pause(&self) {
        self.pause();
    }

    /// Readies the guest for the pause that comes next, before the
    /// downtime starts (a migration's source calls it before it pauses
    /// for the stop-and-copy or the switch to post-copy): work a pause
    /// would otherwise do first, such as waking what serves the kick.
    /// Nothing by default.
    fn prepare_pause(&self) {}

    /// Runs the vCPUs again.
    fn resume(&self);

    /// When the guest's first instruction after its last start or resume
    /// ran, on this process's monotonic clock, where the VM knows it more
    /// closely than the caller's clock read after the call returned (a
    /// stamp the vCPU made as it entered the guest, where the host saw it
    /// only at its next look). The destination's session takes it as the
    /// instant its guest resumed, the end of the downtime. `None` (the
    /// default): the session's clock after the start returned.
    fn first_instruction_at(&self) -> Option<std::time::Instant> {
        None
    }

    /// The guest's counters now.
    fn counters(&self) -> GuestCounters;

    /// Auto-converge: a delay of `ns` per guest page written (0: none).
    fn set_throttle_ns(&self, ns: u64);

    /// Auto-converge as a share of each vCPU's time: asleep `pct` % of it
    /// (0: none; at most 99), as QEMU's throttle. Set with every
    /// [`GuestRun::set_throttle_ns`]: a guest whose writes the host does
    /// not see one by one (hardware dirty state) throttles by this one,
    /// the others by the delay per page. The default ignores it.
    fn set_throttle_pct(&self, pct: u32) {
        let _ = pct;
    }

    /// Dirty-limit: each vCPU's pace in pages per second (0: unpaced).
    fn pace(&self) -> u64;

    /// Sets each vCPU's pace (see [`GuestRun::pace`]).
    fn set_pace(&self, pages_per_sec: u64);
}
