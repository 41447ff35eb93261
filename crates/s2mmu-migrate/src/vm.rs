//! The VM interface the session runs over: [`SessionVm`] (guest RAM as
//! one mapping, [`GuestRam`], and the engine's dirty log), [`GuestRun`]
//! (stop and go, throttle, pace, counters), and post-copy's
//! [`PageFetch`].

use std::fmt;

/// Bytes of one guest page as migration moves it.
pub const PAGE_SIZE: usize = 4096;

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

/// One memslot of guest RAM as the network session moves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RamSlot {
    /// The slot's id in the dirty log.
    pub id: u16,
    /// Guest-physical base.
    pub gpa: u64,
    /// Bytes.
    pub size: u64,
    /// Offset of its memory in [`SessionVm::ram`].
    pub mem_offset: u64,
}

/// A page a dirty ring named: its slot's id and its page index there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingEntry {
    /// The slot's id ([`RamSlot::id`]).
    pub slot: u32,
    /// Page index in the slot.
    pub offset: u64,
}

/// Guest RAM as one host mapping that the session reads while the guest
/// runs (the sender) and writes before it runs (the receiver) straight,
/// without a copy through the VM.
///
/// # Safety
/// From [`GuestRam::host_addr`] on, [`GuestRam::size`] bytes are mapped
/// readable and writable for as long as the value lives, and the address
/// is 8-byte aligned. Every other access the VM makes to them is
/// atomic per 8-byte word (the session reads and writes them per word
/// while vCPUs may run), so racing with the session is not UB.
pub unsafe trait GuestRam: Send + Sync {
    /// Bytes of the mapping.
    fn size(&self) -> u64;

    /// Host address of byte 0.
    fn host_addr(&self) -> u64;

    /// Copies `out.len()` bytes at `offset` into `out`; false (and `out`
    /// untouched) when they are not all inside.
    fn read_into(&self, offset: u64, out: &mut [u8]) -> bool;

    /// Copies `data` to `offset`; false (and nothing written) when it
    /// does not fit.
    fn write_from(&self, offset: u64, data: &[u8]) -> bool;
}

/// Post-copy's page request: what a destination vCPU calls on a fault on
/// a page that has not arrived.
pub trait PageFetch: Send + Sync {
    /// Returns once the page at `gpa` is in guest memory (at once when it
    /// is there, else after asking for it and waiting). `vcpu` is the
    /// faulting vCPU. Returns whether it had to wait (a remote fault).
    ///
    /// # Errors
    /// A reason when the page cannot be had (the connection broke).
    fn fetch(&self, vcpu: usize, gpa: u64) -> Result<bool, String>;
}

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

    /// Runs the vCPUs again.
    fn resume(&self);

    /// The guest's counters now.
    fn counters(&self) -> GuestCounters;

    /// Auto-converge: a delay of `ns` per guest page written (0: none).
    fn set_throttle_ns(&self, ns: u64);

    /// Dirty-limit: each vCPU's pace in pages per second (0: unpaced).
    fn pace(&self) -> u64;

    /// Sets each vCPU's pace (see [`GuestRun::pace`]).
    fn set_pace(&self, pages_per_sec: u64);
}
