//! A simulated vCPU: guest accesses through a software TLB, stage-2 walks
//! on a miss, and the engine's fault handler on a fault.

use crate::memory::GuestMemory;
use crate::mmu::VmMmu;
use crate::tlb::SoftTlb;
use crate::vm::KnownFormat;
use s2mmu::format::arm64::Arm64Stage2;
use s2mmu::memslot::MemslotStore;
use s2mmu::mmu::{FaultKind, FaultOutcome, FaultStats, PmlLog, PmlWriteError, VcpuMmu};
use s2mmu::{Gpa, HostMmOps, Prot, TableReader, Translation};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What a walk of a TLB miss found: the entry (or none), or a PML log-full
/// exit that flushed the log, after which the walk is made again.
enum Walked {
    Entry(Option<Translation>),
    LogFlushed,
}

/// Why a guest access left the vCPU (what a `KVM_RUN` exit would report).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VcpuExit {
    /// No memslot there, or a write to a read-only slot: MMIO.
    Mmio {
        /// The address.
        gpa: u64,
        /// Whether it was a write.
        write: bool,
    },
    /// The vCPU's dirty ring is soft-full: harvest and reset, then retry.
    DirtyRingFull,
    /// The access is not 8-byte aligned.
    Misaligned {
        /// The address.
        gpa: u64,
    },
    /// The page is not on this host yet and could not be fetched (the
    /// [`PageFetch`] hook failed: post-copy's connection broke).
    PageUnavailable {
        /// The address.
        gpa: u64,
    },
    /// The engine failed (out of memory).
    Engine(s2mmu::Error),
    /// The stage-2 table maps the page to host memory outside the VM's
    /// guest memory (a slot added through [`crate::Vm::mmu`] with a host
    /// range of its own): the access is refused, never made.
    OutsideGuestMemory {
        /// The address.
        gpa: u64,
        /// The host address the table gave.
        host: u64,
    },
}

/// Where a fault on a page not on this host yet is resolved (post-copy's
/// page request): the engine's trait, the one every VM calls. A fetch that
/// fails makes the vCPU exit with [`VcpuExit::PageUnavailable`].
pub use s2mmu::mmu::PageFetch;

impl fmt::Display for VcpuExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VcpuExit::Mmio { gpa, write } => write!(
                f,
                "MMIO {} at {gpa:#x}",
                if *write { "write" } else { "read" }
            ),
            VcpuExit::DirtyRingFull => write!(f, "dirty ring full"),
            VcpuExit::Misaligned { gpa } => write!(f, "misaligned access at {gpa:#x}"),
            VcpuExit::PageUnavailable { gpa } => write!(
                f,
                "the page at {gpa:#x} is not on this host and could not be fetched"
            ),
            VcpuExit::Engine(e) => write!(f, "{e}"),
            VcpuExit::OutsideGuestMemory { gpa, host } => write!(
                f,
                "guest address {gpa:#x} is mapped to host address {host:#x}, outside the VM's guest memory"
            ),
        }
    }
}

/// A vCPU of a [`crate::Vm`]. Owned by the thread that runs it.
pub struct Vcpu<S: MemslotStore, F: KnownFormat = Arm64Stage2> {
    mmu: Arc<VmMmu<S, F>>,
    reader: TableReader<F, HostMmOps>,
    // Keeps guest memory mapped while this vCPU can reach it; the software
    // TLB caches only pages inside it.
    memory: Arc<GuestMemory>,
    vmmu: VcpuMmu<HostMmOps>,
    tlb: SoftTlb,
    in_guest: bool,
    /// The MMU tracks dirty pages in hardware state (arm64 DBM): this vCPU's
    /// walker records a write to a writable-clean leaf itself, as the
    /// hardware does, instead of faulting.
    hw_dirty: bool,
    /// Its page-modification log, when the MMU tracks with
    /// [`s2mmu::mmu::DirtyMode::Pml`]: the walker appends each page whose
    /// dirty state it sets, and a full log exits.
    pml: Option<Arc<PmlLog>>,
    /// Write walks made that way (the leaf's write permission set by the
    /// walk, or already set).
    pub hw_dirty_walks: u64,
    /// Post-copy's page request hook (None: all memory is here).
    fetch: Option<Arc<dyn PageFetch>>,
    /// Translation faults that had to wait for a page from elsewhere.
    pub remote_faults: u64,
    /// Faults taken (exits).
    pub faults: u64,
    /// Guest accesses made.
    pub accesses: u64,
}

impl<S: MemslotStore, F: KnownFormat> Vcpu<S, F> {
    pub(crate) fn new(
        mmu: Arc<VmMmu<S, F>>,
        memory: Arc<GuestMemory>,
        vmmu: VcpuMmu<HostMmOps>,
        tlb: SoftTlb,
        fetch: Option<Arc<dyn PageFetch>>,
    ) -> Self {
        Vcpu {
            fetch,
            remote_faults: 0,
            reader: mmu.reader(),
            hw_dirty: mmu.policy().dirty.hardware(),
            hw_dirty_walks: 0,
            pml: vmmu.pml().cloned(),
            mmu,
            memory,
            vmmu,
            tlb,
            in_guest: false,
            faults: 0,
            accesses: 0,
        }
    }

    /// The vCPU index.
    pub fn id(&self) -> usize {
        self.vmmu.id()
    }

    /// Fault and lock counters.
    pub fn fault_stats(&self) -> FaultStats {
        self.vmmu.stats
    }

    /// The software TLB.
    pub fn tlb(&self) -> &SoftTlb {
        &self.tlb
    }

    /// Enters guest mode (applies pending TLB invalidations).
    pub fn enter(&mut self) {
        if !self.in_guest {
            self.tlb.enter_guest();
            self.in_guest = true;
        }
    }

    /// Leaves guest mode (invalidations stop waiting for this vCPU). Call
    /// before the thread blocks.
    pub fn exit(&mut self) {
        if self.in_guest {
            self.tlb.exit_guest();
            self.in_guest = false;
        }
    }

    /// Whether the vCPU must stay out of the guest until the dirty rings
    /// are reset.
    pub fn ring_full(&self) -> bool {
        self.vmmu.ring_soft_full()
    }

    /// Host address for a guest access, faulting as needed.
    #[inline]
    fn translate(&mut self, gpa: u64, write: bool) -> Result<u64, VcpuExit> {
        if !gpa.is_multiple_of(8) {
            return Err(VcpuExit::Misaligned { gpa });
        }
        self.enter();
        // Pinned from the first miss to the end of the access, so the walk,
        // the fault handler and the walk after it share one epoch pin.
        let mut pin = None;
        loop {
            self.tlb.check_requests();
            if let Some(h) = self.tlb.lookup(gpa, write) {
                return Ok(h);
            }
            pin.get_or_insert_with(|| self.reader.read_guard());
            let t = match self.walk(gpa, write)? {
                Walked::Entry(t) => t,
                Walked::LogFlushed => continue,
            };
            let kind = match t {
                Some(t) if write && !t.prot.contains(Prot::W) => {
                    FaultKind::Permission { level: t.level }
                }
                Some(t) => {
                    self.check_host_page(gpa, t.pa)?;
                    self.tlb.fill(gpa, t.pa, t.prot.contains(Prot::W));
                    continue;
                }
                None => FaultKind::Translation,
            };
            self.stage2_fault(gpa, write, kind)?;
        }
    }

    /// The table walk of a TLB miss, as the hardware makes it: with
    /// hardware dirty state a write to a writable-clean leaf sets its dirty
    /// state (or is logged by PML) instead of faulting.
    #[inline]
    fn walk(&mut self, gpa: u64, write: bool) -> Result<Walked, VcpuExit> {
        if !(write && self.hw_dirty) {
            return Ok(Walked::Entry(self.reader.translate(gpa)));
        }
        // The hardware's own update: no fault for a writable-clean leaf
        // (the fill after it then caches it writable).
        let t = match &self.pml {
            Some(log) => match log.hw_write(&self.reader, gpa) {
                Ok(t) => t,
                Err(PmlWriteError::Full) => {
                    // The "log-full" VM exit: the exit handler flushes the
                    // log, the write is retried.
                    self.exit();
                    self.vmmu.stats.pml_full_exits += 1;
                    let r = self.mmu.flush_pml(&mut self.vmmu);
                    self.enter();
                    r.map_err(VcpuExit::Engine)?;
                    return Ok(Walked::LogFlushed);
                }
                Err(PmlWriteError::ForeignReader) => {
                    unreachable!("a vCPU's log and reader are both its VM's")
                }
            },
            None => self.reader.hw_dirty_update(gpa),
        };
        if t.is_some_and(|t| t.prot.contains(Prot::W)) {
            self.hw_dirty_walks += 1;
        }
        Ok(Walked::Entry(t))
    }

    /// A stage-2 fault: leaves guest mode while the engine handles it, with
    /// what the walk found, as hardware reports it; back in guest mode for
    /// the access to be retried, or the exit the caller must handle.
    fn stage2_fault(&mut self, gpa: u64, write: bool, kind: FaultKind) -> Result<(), VcpuExit> {
        self.exit();
        self.faults += 1;
        if let (FaultKind::Translation, Some(f)) = (kind, &self.fetch) {
            // Not mapped: the page may not be on this host yet. Only
            // this vCPU waits for it (outside guest mode, so TLB
            // invalidations do not wait for it either).
            match f.fetch(self.vmmu.id(), gpa) {
                Ok(waited) => self.remote_faults += u64::from(waited),
                Err(_) => return Err(VcpuExit::PageUnavailable { gpa }),
            }
        }
        let r = self
            .mmu
            .handle_stage2_fault(&mut self.vmmu, Gpa::new(gpa), write, kind);
        if self.pml.is_some() {
            // KVM flushes the log on every exit.
            self.mmu
                .flush_pml(&mut self.vmmu)
                .map_err(VcpuExit::Engine)?;
        }
        if self.ring_full() {
            return Err(VcpuExit::DirtyRingFull);
        }
        self.enter();
        match r {
            Ok(
                FaultOutcome::Fast
                | FaultOutcome::Slow
                | FaultOutcome::Spurious
                | FaultOutcome::Retry,
            ) => Ok(()),
            Err(s2mmu::Error::NoSlot { .. }) => Err(VcpuExit::Mmio { gpa, write }),
            Err(s2mmu::Error::WriteToReadOnly { .. }) => Err(VcpuExit::Mmio { gpa, write: true }),
            Err(e) => Err(VcpuExit::Engine(e)),
        }
    }

    /// Refuses a translation whose host page lies outside guest memory: the
    /// software TLB, and so every access, then only reaches memory that
    /// `memory` keeps mapped, whatever slots the caller gave the engine.
    fn check_host_page(&self, gpa: u64, host: u64) -> Result<(), VcpuExit> {
        let page = 1u64 << self.tlb.page_shift();
        let start = host & !(page - 1);
        let (lo, size) = (self.memory.host_addr(), self.memory.size());
        let inside = start >= lo && start - lo <= size.saturating_sub(page);
        if inside {
            Ok(())
        } else {
            Err(VcpuExit::OutsideGuestMemory { gpa, host })
        }
    }

    /// Writes the 8-byte word at `gpa`, as a guest store.
    ///
    /// # Errors
    /// A [`VcpuExit`] the caller must handle before retrying.
    #[inline]
    pub fn write_u64(&mut self, gpa: u64, value: u64) -> Result<(), VcpuExit> {
        let h = self.translate(gpa, true)?;
        self.accesses += 1;
        // SAFETY: `h` is the host address of an aligned word of guest memory:
        // the TLB only holds pages inside `memory` (`check_host_page`), which
        // it keeps mapped; guest memory is only accessed through atomics.
        unsafe { AtomicU64::from_ptr(h as *mut u64) }.store(value, Ordering::Relaxed);
        Ok(())
    }

    /// Reads the 8-byte word at `gpa`, as a guest load.
    ///
    /// # Errors
    /// A [`VcpuExit`] the caller must handle before retrying.
    #[inline]
    pub fn read_u64(&mut self, gpa: u64) -> Result<u64, VcpuExit> {
        let h = self.translate(gpa, false)?;
        self.accesses += 1;
        // SAFETY: as in `write_u64`.
        Ok(unsafe { AtomicU64::from_ptr(h as *mut u64) }.load(Ordering::Relaxed))
    }
}

impl<S: MemslotStore, F: KnownFormat> Drop for Vcpu<S, F> {
    fn drop(&mut self) {
        self.exit();
    }
}
