//! The guest of `memslot-perf`: its memory, the VM with its slots and the guest
//! thread's accesses, and the host side's discards and syncs (the running part).

use super::*;
use s2mmu::{Gfn, Gpa, Hva};
use std::hint::black_box;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// Anonymous host memory backing the guest.
pub(super) struct GuestMemory {
    pub(super) base: *mut u8,
    pub(super) len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; threads touch it only through
// volatile accesses at addresses inside it, and it is unmapped only on drop, after the
// scoped guest thread has been joined.
unsafe impl Send for GuestMemory {}
// SAFETY: as above; concurrent volatile accesses to plain memory are what the selftest's
// guest and host do too.
unsafe impl Sync for GuestMemory {}

impl GuestMemory {
    pub(super) fn new(len: u64) -> Result<Self, String> {
        let len = usize::try_from(len).map_err(|_| "area too large".to_string())?;
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing;
        // nothing else is affected.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(format!(
                "mmap of {len} bytes failed: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(Self {
            base: base.cast(),
            len,
        })
    }

    pub(super) fn addr(&self) -> u64 {
        self.base as u64
    }

    /// `MADV_DONTNEED` on `[hva, hva + len)`, which must lie in this mapping.
    pub(super) fn discard(&self, hva: u64, len: u64) {
        debug_assert!(hva >= self.addr() && hva + len <= self.addr() + self.len as u64);
        // SAFETY: the range lies inside this private anonymous mapping; discarding it only
        // makes later reads see zeroes, which the tests expect.
        unsafe { libc::madvise(hva as *mut libc::c_void, len as usize, libc::MADV_DONTNEED) };
    }

    /// Writes a u64 at host address `hva`, which must lie in this mapping.
    pub(super) fn write(&self, hva: u64, value: u64) {
        debug_assert!(hva >= self.addr() && hva + 8 <= self.addr() + self.len as u64);
        // SAFETY: in bounds (every hva comes from a slot carved out of this mapping), 8-byte
        // aligned (page base plus 0 or half a page), and the mapping outlives all users.
        unsafe { ptr::write_volatile(hva as *mut u64, value) }
    }

    /// Reads a u64 at host address `hva`, which must lie in this mapping.
    pub(super) fn read(&self, hva: u64) -> u64 {
        debug_assert!(hva >= self.addr() && hva + 8 <= self.addr() + self.len as u64);
        // SAFETY: as for `write`.
        unsafe { ptr::read_volatile(hva as *const u64) }
    }
}

impl Drop for GuestMemory {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; no reference into it survives.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// A simulated VM: memory, its slots, and the sync flags of the selftest.
pub(super) struct Vm<S> {
    pub(super) store: S,
    pub(super) memory: GuestMemory,
    pub(super) nslots: u32,
    pub(super) pages: u64,
    pub(super) pages_per_slot: u64,
    pub(super) sync: AtomicBool,
    pub(super) exit: AtomicBool,
    /// Guest accesses that found no usable slot (MMIO exits in the selftest).
    pub(super) mmio_exits: AtomicU64,
}

impl<S: MemslotStore> Vm<S> {
    /// The selftest's `prepare_vm`: the area cut into `nslots` equal slots, the remainder
    /// added to the last, created one by one. Returns the time the creates took.
    /// The last slot where it was set up, and the same slot moved just past the end of the
    /// area (the selftest's move target).
    pub(super) fn last_slot_home_and_away(&self) -> (UserMemoryRegion, UserMemoryRegion) {
        let last_base = self.last_slot_base_gfn();
        let home = UserMemoryRegion::new(
            (self.nslots - 1) as u16,
            SlotFlags::NONE,
            Gpa::new(last_base << PAGE_SHIFT),
            (self.base_gfn() + self.pages - last_base) << PAGE_SHIFT,
            Hva::new(self.page_hva(last_base - self.base_gfn())),
        );
        let away = UserMemoryRegion {
            guest_phys_addr: Gpa::new(MEM_GPA + self.pages * PAGE_SIZE),
            ..home
        };
        (home, away)
    }

    pub(super) fn prepare(nslots: u32, bytes: u64) -> Result<(Self, Duration), String> {
        let memory = GuestMemory::new(bytes)?;
        let pages = bytes / PAGE_SIZE;
        let pages_per_slot = pages / u64::from(nslots);
        if pages_per_slot == 0 {
            return Err(format!("{nslots} slots do not fit {bytes} bytes"));
        }
        let store = S::with_config(s2mmu::memslot::MemslotConfig::default());
        let start = Instant::now();
        for index in 0..u64::from(nslots) {
            let npages = if index + 1 == u64::from(nslots) {
                pages - index * pages_per_slot
            } else {
                pages_per_slot
            };
            let offset = index * pages_per_slot * PAGE_SIZE;
            let region = UserMemoryRegion::new(
                index as u16,
                SlotFlags::NONE,
                Gpa::new(MEM_GPA + offset),
                npages * PAGE_SIZE,
                Hva::new(memory.addr() + offset),
            );
            store
                .set_memory_region(&region, &NoStage2)
                .map_err(|e| format!("slot setup: {e}"))?;
        }
        let setup = start.elapsed();
        // Populate the memory untimed, as the selftest does after adding the slots.
        for page in 0..pages {
            memory.write(memory.addr() + page * PAGE_SIZE, 0);
        }
        let vm = Self {
            store,
            memory,
            nslots,
            pages,
            pages_per_slot,
            sync: AtomicBool::new(false),
            exit: AtomicBool::new(false),
            mmio_exits: AtomicU64::new(0),
        };
        Ok((vm, setup))
    }

    pub(super) fn base_gfn(&self) -> u64 {
        MEM_GPA >> PAGE_SHIFT
    }

    pub(super) fn last_slot_base_gfn(&self) -> u64 {
        self.base_gfn() + u64::from(self.nslots - 1) * self.pages_per_slot
    }

    /// Host address of the page `page` of the area (host side: the selftest's own
    /// `addr_gpa2hva`, not a KVM lookup).
    pub(super) fn page_hva(&self, page: u64) -> u64 {
        self.memory.addr() + page * PAGE_SIZE
    }

    /// One guest access through the engine's translation, as a fault would do it.
    /// The snapshot is held only while translating, as KVM holds SRCU in the fault handler
    /// but not while the guest then runs on the mapping.
    pub(super) fn guest_access(
        &self,
        cache: &mut VcpuSlotCache,
        gfn: u64,
        offset: u64,
        write: Option<u64>,
    ) -> Option<u64> {
        let snapshot = self.store.snapshot();
        let hva = snapshot
            .gfn_to_slot_vcpu(cache, Gfn::new(gfn))
            .and_then(|slot| slot.gfn_to_hva(Gfn::new(gfn), write.is_some()).ok())
            .map(Hva::raw);
        drop(snapshot);
        let Some(hva) = hva else {
            self.mmio_exits.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        match write {
            Some(value) => {
                self.memory.write(hva + offset, value);
                Some(value)
            }
            None => Some(self.memory.read(hva + offset)),
        }
    }

    /// `madvise(MADV_DONTNEED)` plus what KVM's MMU notifier does for it.
    pub(super) fn host_discard(&self, hva: u64, len: u64) {
        self.memory.discard(hva, len);
        let snapshot = self.store.snapshot();
        let mut hits = 0u64;
        snapshot.for_each_in_hva_range(Hva::new(hva), Hva::new(hva + len), |overlap| {
            NoStage2.unmap_gfn_range(
                overlap.gfn_start,
                overlap.gfn_end.raw() - overlap.gfn_start.raw(),
            );
            hits += 1;
        });
        black_box(hits);
    }

    /// The selftest's `host_perform_sync`: raise the flag, wait for the guest to take it.
    pub(super) fn host_sync(&self) {
        self.sync.store(true, Ordering::Release);
        let mut spins = 0u32;
        while self.sync.load(Ordering::Acquire) {
            backoff(&mut spins);
        }
    }

    /// The selftest's `guest_perform_sync`; false once the host asked the guest to stop.
    pub(super) fn guest_sync(&self) -> bool {
        let mut spins = 0u32;
        loop {
            if self
                .sync
                .compare_exchange(true, false, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return true;
            }
            if self.exit.load(Ordering::Acquire) {
                return false;
            }
            backoff(&mut spins);
        }
    }

    /// Runs `guest` on its own thread and `iteration` on this one until `seconds` pass;
    /// returns the iterations done and their total time.
    pub(super) fn run_loop(
        &self,
        seconds: Duration,
        guest: impl FnOnce(&Self) + Send,
        mut iteration: impl FnMut(&Self) -> Result<(), String>,
    ) -> Result<(u64, Duration), String> {
        thread::scope(|scope| {
            let guest_thread = scope.spawn(|| guest(self));
            let start = Instant::now();
            let mut iterations = 0;
            let mut outcome = Ok(());
            while start.elapsed() < seconds {
                if let Err(e) = iteration(self) {
                    outcome = Err(e);
                    break;
                }
                iterations += 1;
            }
            let elapsed = start.elapsed();
            self.exit.store(true, Ordering::Release);
            guest_thread
                .join()
                .map_err(|_| "guest thread panicked".to_string())?;
            outcome.map(|()| (iterations, elapsed))
        })
    }
}

pub(super) fn backoff(spins: &mut u32) {
    if *spins < 256 {
        *spins += 1;
        std::hint::spin_loop();
    } else {
        thread::yield_now();
    }
}
