//! The simulated VM of `s2mmu-vm` behind the session's interface
//! ([`SessionVm`], [`GuestRam`], [`GuestRun`]): feature `sim`.
//!
//! Besides the mapping from the interface to the simulated VM's calls:
//! the simulated guest's own parts of a migration, which no other guest
//! has ([`source`]: building and running it, its STATE ([`state`]) and
//! post-copy's replay of its writes; [`extras`]: the lost-write check
//! ([`lost_write`], [`lost_check`]) and snapshots ([`snapshot_taker`])
//! beside pre-copy). The session's logic is in
//! [`crate::session`].

pub mod dest;
pub mod extras;
pub mod in_process;
pub mod lost_check;
pub mod lost_write;
pub mod snapshot_run;
pub mod snapshot_taker;
pub mod source;
pub mod state;

use crate::vm::{
    GuestCounters, GuestRam, GuestRun, PageFetch, RamSlot, RingEntry, SessionVm, VmError,
};
use s2mmu::memslot::TreeMemslots;
use s2mmu_vm::{Control, GuestMemory, KnownFormat, SlotInfo, Vm, Workload};
use std::sync::atomic::Ordering;
use std::sync::Arc;

// SAFETY: GuestMemory is one mapping of `size()` bytes (a multiple of the
// page size) at `host_addr()`, page-aligned (mmap), alive as long as the
// value, so `host_span` names the rest of it from any offset inside; and every access of
// its own (and of the vCPUs, through the engine's translation) is atomic
// per 8-byte word.
unsafe impl GuestRam for GuestMemory {
    fn size(&self) -> u64 {
        GuestMemory::size(self)
    }

    fn host_span(&self, offset: u64) -> Option<(u64, u64)> {
        let size = GuestMemory::size(self);
        (offset < size).then(|| (GuestMemory::host_addr(self) + offset, size - offset))
    }

    fn read_into(&self, offset: u64, out: &mut [u8]) -> bool {
        GuestMemory::read_into(self, offset, out)
    }

    fn write_from(&self, offset: u64, data: &[u8]) -> bool {
        GuestMemory::write_from(self, offset, data)
    }
}

/// A simulated VM (tables of format `F`) as the session sees it.
pub struct SimVm<F: KnownFormat> {
    vm: Arc<Vm<TreeMemslots, F>>,
    slots: Vec<RamSlot>,
}

impl From<&SlotInfo> for RamSlot {
    /// The simulated VM's slot as the session moves it.
    fn from(s: &SlotInfo) -> Self {
        RamSlot {
            id: s.id,
            gpa: s.gpa,
            size: s.size,
            mem_offset: s.mem_offset,
        }
    }
}

impl<F: KnownFormat> SimVm<F> {
    /// The session's view of `vm`.
    pub fn new(vm: Arc<Vm<TreeMemslots, F>>) -> Self {
        let slots = vm.slots().iter().map(RamSlot::from).collect();
        SimVm { vm, slots }
    }

    /// The simulated VM.
    pub fn vm(&self) -> &Arc<Vm<TreeMemslots, F>> {
        &self.vm
    }
}

fn engine(what: &str) -> impl FnOnce(s2mmu::Error) -> VmError + '_ {
    move |e| VmError::new(format!("{what}: {e}"))
}

impl<F: KnownFormat> SessionVm for SimVm<F> {
    type Ram = GuestMemory;

    fn ram(&self) -> &Arc<GuestMemory> {
        self.vm.memory()
    }

    fn slots(&self) -> &[RamSlot] {
        &self.slots
    }

    fn gpa_base(&self) -> u64 {
        self.vm.config().gpa_base
    }

    fn enable_dirty_logging(&self) -> Result<(), VmError> {
        self.vm
            .enable_dirty_logging()
            .map_err(|e| VmError::new(e.to_string()))
    }

    fn disable_dirty_logging(&self) -> Result<(), VmError> {
        self.vm
            .disable_dirty_logging()
            .map_err(|e| VmError::new(e.to_string()))
    }

    fn get_dirty_log(&self, slot: u16, bitmap: &mut [u64]) -> Result<(), VmError> {
        self.vm
            .mmu()
            .get_dirty_log(slot, bitmap)
            .map(|_| ())
            .map_err(engine("getting the dirty log"))
    }

    fn clear_dirty_log(&self, slot: u16, first: u64, n: u64, mask: &[u64]) -> Result<(), VmError> {
        self.vm
            .mmu()
            .clear_dirty_log(slot, first, n, mask)
            .map(|_| ())
            .map_err(engine("clearing the dirty log"))
    }

    fn harvest_rings(&self, out: &mut Vec<RingEntry>) -> Result<(), VmError> {
        let mut gfns = Vec::new();
        self.vm
            .mmu()
            .harvest_rings(&mut gfns)
            .map_err(engine("harvesting the dirty rings"))?;
        out.try_reserve(gfns.len())
            .map_err(|_| VmError::new("no memory for the harvested ring entries"))?;
        out.extend(gfns.iter().map(|g| RingEntry {
            slot: g.slot,
            offset: g.offset,
        }));
        Ok(())
    }

    fn reset_rings(&self) -> Result<(), VmError> {
        self.vm
            .mmu()
            .reset_rings()
            .map(|_| ())
            .map_err(engine("resetting the dirty rings"))
    }

    fn ring_soft_full(&self, vcpu: usize) -> bool {
        self.vm.mmu().ring_soft_full(vcpu)
    }

    fn set_page_fetch(&self, fetch: Option<Arc<dyn PageFetch>>) -> Result<(), VmError> {
        self.vm.set_page_fetch(fetch);
        Ok(())
    }
}

/// A reader of the vCPUs' counters in `control` that a sampling thread
/// can own.
pub fn counter_source(control: Arc<Control>) -> Arc<dyn Fn() -> GuestCounters + Send + Sync> {
    Arc::new(move || counters_of(&control))
}

fn counters_of(control: &Control) -> GuestCounters {
    let live = &control.live;
    GuestCounters {
        writes: live.iter().map(|l| l.writes.load(Ordering::Relaxed)).sum(),
        guest_ns: live
            .iter()
            .map(|l| l.guest_ns.load(Ordering::Relaxed))
            .sum(),
    }
}

impl<F: KnownFormat> GuestRun for Workload<TreeMemslots, F> {
    fn pause(&self) {
        Workload::pause(self);
    }

    fn request_pause(&self) {
        Workload::request_pause(self);
    }

    fn resume(&self) {
        Workload::resume(self);
    }

    fn counters(&self) -> GuestCounters {
        counters_of(self.control())
    }

    fn set_throttle_ns(&self, ns: u64) {
        self.control().throttle_ns.store(ns, Ordering::Relaxed);
    }

    fn pace(&self) -> u64 {
        self.control().pace_pages_per_sec.load(Ordering::Relaxed)
    }

    fn set_pace(&self, pages_per_sec: u64) {
        self.control()
            .pace_pages_per_sec
            .store(pages_per_sec, Ordering::Relaxed);
    }
}
