//! The EL2 placement: the engine linked into the EL2 stub (`el2/`, the
//! stub assembled with `EL2_ENGINE`). Each vCPU's stage-2 aborts on RAM
//! are answered at EL2 on its own CPU, the guest resuming without an exit;
//! only what the engine leaves to the host (an IPA no memslot covers:
//! MMIO; a full dirty ring) is posted to the vCPU's mailbox, as the host
//! placement posts every abort. The host drives the engine with
//! `s2mmu_el2` command blocks the service CPU hands it (the mailbox's
//! `EL2` command), which EL2 checks.
//!
//! Memory: EL2's carve-out is everything below [`layout::DATA`] (the stub,
//! mailboxes, stacks, the engine's code, heap and table pool); slots may be
//! backed by guest data only, and the [`SHARED_BYTES`] after it hold the
//! bitmaps and ring entries EL2 writes for the host.

use crate::layout::{self, mb, CMD_EL2};
use crate::machine::{Exit, Machine};
use crate::stage2;
use crate::tlbi::HypSink;
use crate::{Arm64Error, Result};
use mb::{EL2_FAULTS, EL2_OUTCOME, EL2_PACE_NS, EL2_THROTTLE_NS, EL2_TICKS};
use s2mmu::dirty::DirtyGfn;
use s2mmu::format::arm64::{Arm64Stage2, Granule};
use s2mmu::mmu::DirtyMode;
use s2mmu::Gpa;
use s2mmu_el2::{Counters, HypError, LogMode, Op, RingEntry};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Bytes of the area shared with EL2, after the memory slots may use.
pub const SHARED_BYTES: u64 = 4 << 20;
/// Bytes after it, shared with EL2 too, for the break-before-make trace.
pub const TRACE_BYTES: u64 = 16 << 20;
/// EL2's first command: its heap, pool and layout (`el2/src/lib.rs`).
const OP_SETUP: u64 = 0x100;
/// The trace's start and stop, and the withheld invalidations.
const OP_TRACE: u64 = 0x101;
const OP_WITHHOLD: u64 = 0x102;
/// `EL2_OUTCOME` values (`el2/src/lib.rs`).
const ABORT_NO_SLOT: u64 = 1;
const ABORT_RING_FULL: u64 = 2;
const ABORT_PAGE_MISSING: u64 = 3;
const ABORT_PACED: u64 = 5;

/// The Linux VM's engine at EL2, as the host drives it (a clone drives
/// the same engine: a migration's session holds one for the dirty log).
#[derive(Clone)]
pub(crate) struct El2Vm {
    machine: Arc<Machine>,
    sink: Arc<HypSink>,
    vtcr: u64,
    vttbr: u64,
    mode: LogMode,
    ram_bytes: u64,
    /// The slots EL2 holds: (id, IPA, bytes).
    slots: Arc<std::sync::Mutex<Vec<(u16, u64, u64)>>>,
    /// Post-copy's slot and the pages made ready on it ([`El2Vm::set_postcopy`]).
    pub(crate) postcopy: Arc<std::sync::Mutex<Option<PostcopySlot>>>,
    /// Each vCPU's wait that EL2's brakes handed over and its host thread
    /// has not served yet: throttle and pace, in nanoseconds.
    waits: Arc<[[AtomicU64; 2]]>,
    /// Held from a command that writes the shared area to the host's read
    /// of what it wrote: the session's harvests and the counters' readers
    /// run on different threads.
    shared_use: Arc<Mutex<()>>,
}

/// EL2's mode for the host's dirty mode (no logging: `wp`, never used).
fn log_mode(mode: Option<DirtyMode>) -> Result<(LogMode, u64)> {
    match mode {
        None => Ok((LogMode::WpGet, 0)),
        Some(m) if m.hardware() => Ok((LogMode::Hw, 0)),
        Some(m) => match m.ring_entries() {
            Some(n) => Ok((LogMode::Ring, u64::from(n))),
            None if m.manual_protect() => Ok((LogMode::Manual, 0)),
            None => Ok((LogMode::WpGet, 0)),
        },
    }
}

impl El2Vm {
    /// Sets EL2's engine up on `machine` (started with the EL2 image) for
    /// `vcpus` vCPUs, slots backed by the first `ram_bytes` of guest data.
    ///
    /// # Errors
    /// EL2's refusal, the service CPU not answering.
    pub(crate) fn new(
        machine: Arc<Machine>,
        mode: Option<DirtyMode>,
        vcpus: usize,
        ram_bytes: u64,
    ) -> Result<El2Vm> {
        let service = machine.cpus() - 1;
        machine.mailbox(service).route_bell_in()?;
        let sink = Arc::new(HypSink::new(machine.clone(), service));
        let fmt = Arm64Stage2::new(Granule::K4, s2mmu_el2::check::IPA_BITS)?;
        let (lm, entries) = log_mode(mode)?;
        let mut vm = El2Vm {
            machine,
            sink,
            vtcr: stage2::vtcr(&fmt, lm == LogMode::Hw),
            vttbr: 0,
            mode: lm,
            ram_bytes,
            slots: Default::default(),
            postcopy: Arc::default(),
            waits: (0..vcpus).map(|_| Default::default()).collect(),
            shared_use: Arc::default(),
        };
        let shared = layout::DATA + ram_bytes;
        let area = SHARED_BYTES + TRACE_BYTES;
        vm.call(OP_SETUP, &[layout::DATA, ram_bytes, shared, area])?;
        let root = vm.call(Op::VmInit as u64, &[lm as u64, entries, vcpus as u64])?[0];
        vm.vttbr = stage2::vttbr(root, stage2::VMID);
        vm.sink.set_context(vm.vtcr, vm.vttbr);
        Ok(vm)
    }

    /// One command block: its result words, or EL2's refusal.
    pub(crate) fn call(&self, op: u64, args: &[u64]) -> Result<[u64; 4]> {
        let mut a = [0u64; 9];
        a[0] = self.vtcr;
        a[1] = self.vttbr;
        a[2] = op;
        for (d, s) in a[3..].iter_mut().zip(args) {
            *d = *s;
        }
        self.sink.with_service(|mbox| {
            let st = if mbox.parked() {
                mbox.command_ringing(CMD_EL2, &a)?
            } else {
                mbox.command(CMD_EL2, &a)?
            } as i64;
            if st != 0 {
                let e = i32::try_from(st).ok().and_then(HypError::from_status);
                return Err(Arm64Error::Config(format!(
                    "EL2 refused command {op:#x} {args:x?}: {e:?} ({st})"
                )));
            }
            Ok(std::array::from_fn(|i| {
                mbox.read(mb::ARG0 + 8 * (2 + i as u64))
            }))
        })
    }

    /// The machine.
    pub(crate) fn machine(&self) -> &Arc<Machine> {
        &self.machine
    }

    /// The service CPU's sink (kicks; its counters stay zero: EL2 issues
    /// the engine's invalidations itself).
    pub(crate) fn sink(&self) -> &Arc<HypSink> {
        &self.sink
    }

    /// VTCR_EL2 and VTTBR_EL2 of the VM.
    pub(crate) fn stage2_regs(&self) -> (u64, u64) {
        (self.vtcr, self.vttbr)
    }

    /// Creates memslot `id` (`MEMSLOT_SET`, no flags).
    pub(crate) fn add_slot(&self, id: u16, gpa: u64, pa: u64, size: u64, page: u64) -> Result<()> {
        let args = [u64::from(id), 0, gpa, size, pa, page];
        self.call(Op::MemslotSet as u64, &args)?;
        self.slot_changed(id, Some((gpa, size)));
        Ok(())
    }

    /// Turns dirty logging on for `slot` in the VM's mode.
    pub(crate) fn enable_dirty_logging(&self, slot: u16) -> Result<()> {
        let args = [u64::from(slot), 1, self.mode as u64];
        self.call(Op::LogSet as u64, &args).map(|_| ())
    }

    fn shared(&self) -> u64 {
        layout::DATA + self.ram_bytes
    }

    /// The shared area, this thread's until the guard drops.
    fn shared_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.shared_use.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bitmap_bytes(words: &[u64]) -> Result<u64> {
        let bytes = (words.len() as u64) * 8;
        if bytes > SHARED_BYTES {
            return Err(Arm64Error::Config(format!(
                "a dirty bitmap of {bytes} bytes does not fit the {SHARED_BYTES} bytes shared with EL2"
            )));
        }
        Ok(bytes)
    }

    /// `GET_DIRTY` of `slot` into `words` (through the shared area).
    pub(crate) fn get_dirty_log(&self, slot: u16, words: &mut [u64]) -> Result<()> {
        let _shared = self.shared_lock();
        let bytes = Self::bitmap_bytes(words)?;
        self.call(
            Op::GetDirty as u64,
            &[u64::from(slot), self.shared(), bytes],
        )?;
        let ram = self.machine.ram();
        for (i, w) in words.iter_mut().enumerate() {
            *w = ram.read(self.shared() + 8 * i as u64);
        }
        Ok(())
    }

    /// `CLEAR_DIRTY` of the pages `words` names in `slot`'s pages
    /// `first..first + n` (`first` a multiple of 64).
    pub(crate) fn clear_dirty_log(
        &self,
        slot: u16,
        first: u64,
        n: u64,
        words: &[u64],
    ) -> Result<()> {
        let _shared = self.shared_lock();
        let bytes = Self::bitmap_bytes(words)?;
        let ram = self.machine.ram();
        for (i, w) in words.iter().enumerate() {
            ram.write(self.shared() + 8 * i as u64, *w);
        }
        let args = [u64::from(slot), first, n, self.shared(), bytes];
        self.call(Op::ClearDirty as u64, &args).map(|_| ())
    }

    /// `RING_HARVEST` into `out`.
    pub(crate) fn harvest_rings(&self, out: &mut Vec<DirtyGfn>) -> Result<()> {
        let _shared = self.shared_lock();
        let size = std::mem::size_of::<RingEntry>() as u64;
        let n = self.call(Op::RingHarvest as u64, &[self.shared(), SHARED_BYTES])?[0];
        let ram = self.machine.ram();
        for i in 0..n.min(SHARED_BYTES / size) {
            let at = self.shared() + i * size;
            out.push(DirtyGfn {
                slot: ram.read(at) as u32,
                offset: ram.read(at + 8),
            });
        }
        Ok(())
    }

    /// `RING_RESET`.
    pub(crate) fn reset_rings(&self) -> Result<()> {
        self.call(Op::RingReset as u64, &[]).map(|_| ())
    }

    /// EL2's counters (`COUNTERS` through the shared area).
    pub(crate) fn counters(&self) -> Result<Counters> {
        let _shared = self.shared_lock();
        let bytes = std::mem::size_of::<Counters>() as u64;
        self.call(Op::Counters as u64, &[self.shared(), bytes])?;
        let ram = self.machine.ram();
        let mut w = [0u64; 14];
        for (i, x) in w.iter_mut().enumerate() {
            *x = ram.read(self.shared() + 8 * i as u64);
        }
        Ok(Counters::from_words(&w))
    }

    /// Aborts CPU `cpu` answered at EL2, and their counter ticks.
    pub(crate) fn el2_faults(&self, cpu: usize) -> (u64, u64) {
        let m = self.machine.mailbox(cpu);
        (m.read(EL2_FAULTS), m.read(EL2_TICKS))
    }

    /// Whether the abort EL2 left to the host for vCPU `id` as on an IPA
    /// no slot covers has a slot now: one added since EL2 looked. The
    /// guest retries, and EL2 answers the fault if it comes again.
    pub(crate) fn slot_added_since(&self, id: usize, e: &Exit) -> bool {
        self.machine.mailbox(id).read(EL2_OUTCOME) == ABORT_NO_SLOT && self.covered(e.ipa())
    }

    /// An abort the stub posted for vCPU `id` after EL2 left it to the
    /// host: an IPA no slot covers (the host's devices), a full ring.
    pub(crate) fn stage2_abort(
        &self,
        id: usize,
        e: &Exit,
    ) -> Result<s2mmu::Result<Vec<(u64, u64)>>> {
        match self.machine.mailbox(id).read(EL2_OUTCOME) {
            ABORT_NO_SLOT => Ok(Err(s2mmu::Error::NoSlot {
                gpa: Gpa::new(e.ipa()),
            })),
            ABORT_RING_FULL => Ok(Err(s2mmu::Error::RingFull { vcpu: id })),
            ABORT_PAGE_MISSING => self.page_arrived(e.ipa()).map(|()| Ok(Vec::new())),
            ABORT_PACED => {
                // Answered at EL2; the wait it owes is served before the
                // guest resumes (`DirtyLimit::serve`).
                let m = self.machine.mailbox(id);
                if let Some(w) = self.waits.get(id) {
                    w[0].fetch_add(m.read(EL2_THROTTLE_NS), Ordering::Relaxed);
                    w[1].fetch_add(m.read(EL2_PACE_NS), Ordering::Relaxed);
                }
                Ok(Ok(Vec::new()))
            }
            o => Err(Arm64Error::Config(format!(
                "EL2 left vCPU {id}'s abort at IPA {:#x} (ESR {:#x}) to the host ({o})",
                e.ipa(),
                e.esr
            ))),
        }
    }
}

/// The host changing memory under a running guest, through EL2.
impl El2Vm {
    /// `REMAP_PAGE`: the backing page `at` (as its slot names it) moves
    /// to `to`; EL2 copies it with its faults held. Returns where it was.
    pub(crate) fn remap_page(&self, at: u64, to: u64) -> Result<u64> {
        Ok(self.call(Op::RemapPage as u64, &[at, to])?[1])
    }

    /// `COLLAPSE` of `slot`: logging off, its blocks back in place.
    /// Returns the blocks collapsed.
    pub(crate) fn collapse(&self, slot: u16) -> Result<u64> {
        Ok(self.call(Op::Collapse as u64, &[u64::from(slot)])?[0])
    }

    /// Deletes `slot` (`MEMSLOT_SET` with size 0).
    pub(crate) fn delete_slot(&self, slot: u16) -> Result<()> {
        let args = [u64::from(slot), 0, 0, 0, 0, 0];
        self.call(Op::MemslotSet as u64, &args)?;
        self.slot_changed(slot, None);
        Ok(())
    }

    /// Records that slot `id` now covers `range` (IPA, bytes), or nothing.
    fn slot_changed(&self, id: u16, range: Option<(u64, u64)>) {
        let mut s = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        s.retain(|x| x.0 != id);
        s.extend(range.map(|(ipa, size)| (id, ipa, size)));
    }

    /// Whether a slot covers `ipa` now.
    fn covered(&self, ipa: u64) -> bool {
        let s = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        s.iter().any(|&(_, b, n)| (b..b + n).contains(&ipa))
    }

    /// `MEMSLOT_DELETE_LOGGED` of `slot`: its last log into `words` (a bit
    /// per page), the slot gone.
    pub(crate) fn delete_logged(&self, slot: u16, words: &mut [u64]) -> Result<()> {
        let _shared = self.shared_lock();
        let bytes = Self::bitmap_bytes(words)?;
        let args = [u64::from(slot), self.shared(), bytes];
        self.call(Op::MemslotDeleteLogged as u64, &args)?;
        self.slot_changed(slot, None);
        let ram = self.machine.ram();
        for (i, w) in words.iter_mut().enumerate() {
            *w = ram.read(self.shared() + 8 * i as u64);
        }
        Ok(())
    }
}

/// The break-before-make trace of EL2's stores and invalidations, and its
/// fault injection.
impl El2Vm {
    /// Starts the trace afresh in the [`TRACE_BYTES`] after the shared
    /// area.
    pub(crate) fn trace_start(&self) -> Result<()> {
        let records = TRACE_BYTES / (s2mmu_el2::trace::WORDS as u64 * 8);
        let at = self.shared() + SHARED_BYTES;
        self.call(OP_TRACE, &[at, records]).map(|_| ())
    }

    /// Stops the trace: its records' bytes, and the records dropped
    /// because the ring was full.
    pub(crate) fn trace_stop(&self) -> Result<(Vec<u8>, u64)> {
        let r = self.call(OP_TRACE, &[0, 0])?;
        let words = r[0] * s2mmu_el2::trace::WORDS as u64;
        let at = self.shared() + SHARED_BYTES;
        let ram = self.machine.ram();
        let bytes = (0..words.min(TRACE_BYTES / 8))
            .flat_map(|i| ram.read(at + 8 * i).to_le_bytes())
            .collect();
        Ok((bytes, r[1]))
    }

    /// Withholds EL2's invalidations (`on`), or issues them again with a
    /// whole-VMID flush.
    pub(crate) fn withhold(&self, on: bool) -> Result<()> {
        self.call(OP_WITHHOLD, &[u64::from(on)]).map(|_| ())
    }
}

/// Post-copy's slot at EL2 ([`El2Vm::set_postcopy`]): its id, where it
/// lies, and a bit per page the host has made ready, so that each page
/// gets one `PAGE_READY` (two vCPUs may take the same missing page).
pub(crate) struct PostcopySlot {
    id: u16,
    gpa: u64,
    pages: u64,
    ready: Vec<u64>,
}

/// The page EL2 maps a post-copy slot with.
const PAGE: u64 = 4096;
/// The largest post-copy slot the host tracks (the Linux guest's most RAM).
const MAX_POSTCOPY_BYTES: u64 = 4 << 30;
/// `MEMSLOT_SET`'s post-copy flag (`s2mmu_el2`'s `FLAG_POSTCOPY`).
const FLAG_POSTCOPY: u64 = s2mmu_el2::FLAG_POSTCOPY;
/// `MEMSLOT_SET`'s logging flag.
const FLAG_LOG: u64 = s2mmu_el2::FLAG_LOG;

impl El2Vm {
    /// Turns dirty logging off for `slot`.
    ///
    /// # Errors
    /// EL2's refusal (no such slot).
    pub(crate) fn disable_dirty_logging(&self, slot: u16) -> Result<()> {
        self.call(Op::LogSet as u64, &[u64::from(slot), 0, 0])
            .map(|_| ())
    }

    /// Makes memslot `id` (`size` bytes at `gpa`, backed at `pa`, no page
    /// of it mapped yet) a post-copy slot: EL2 maps none of its pages
    /// until [`El2Vm::page_arrived`] says it is here. The slot is created
    /// again with 4 KiB pages, logging if `logging`.
    ///
    /// # Errors
    /// EL2's refusal; a size over what the host tracks.
    pub(crate) fn set_postcopy(
        &self,
        id: u16,
        gpa: u64,
        pa: u64,
        size: u64,
        logging: bool,
    ) -> Result<()> {
        let pages = size / PAGE;
        if size > MAX_POSTCOPY_BYTES || !size.is_multiple_of(PAGE) || size == 0 {
            return Err(Arm64Error::Config(format!(
                "a post-copy slot of {size} bytes: whole 4 KiB pages up to {} bytes",
                MAX_POSTCOPY_BYTES
            )));
        }
        let mut ready = Vec::new();
        ready
            .try_reserve_exact(pages.div_ceil(64) as usize)
            .map_err(|e| Arm64Error::Config(format!("post-copy's page bitmap: {e}")))?;
        ready.resize(pages.div_ceil(64) as usize, 0);
        let mut g = self.postcopy.lock().unwrap_or_else(|p| p.into_inner());
        let id64 = u64::from(id);
        self.call(Op::MemslotSet as u64, &[id64, 0, gpa, 0, pa, 0])?;
        let log = if logging { FLAG_LOG } else { 0 };
        let args = [id64, FLAG_POSTCOPY | log, gpa, size, pa, PAGE];
        if let Err(e) = self.call(Op::MemslotSet as u64, &args) {
            // The slot as it was (nothing was mapped in it), then the error.
            let _ = self.call(Op::MemslotSet as u64, &[id64, log, gpa, size, pa, PAGE]);
            return Err(e);
        }
        *g = Some(PostcopySlot {
            id,
            gpa,
            pages,
            ready,
        });
        Ok(())
    }

    /// A post-copy page EL2 left to the host (`ipa` in it) is here (the
    /// vCPU's host thread fetched it first): EL2 maps it (`PAGE_READY`),
    /// once.
    ///
    /// # Errors
    /// No post-copy slot covers `ipa`; EL2's refusal.
    fn page_arrived(&self, ipa: u64) -> Result<()> {
        let mut g = self.postcopy.lock().unwrap_or_else(|p| p.into_inner());
        let p = g
            .as_mut()
            .filter(|p| ipa >= p.gpa && (ipa - p.gpa) / PAGE < p.pages)
            .ok_or_else(|| {
                Arm64Error::Config(format!(
                    "EL2 reported a missing post-copy page at IPA {ipa:#x}, which no post-copy \
                     slot covers"
                ))
            })?;
        let page = (ipa - p.gpa) / PAGE;
        let (w, bit) = ((page / 64) as usize, 1u64 << (page % 64));
        if p.ready[w] & bit != 0 {
            // Another vCPU's fault made it ready meanwhile.
            return Ok(());
        }
        self.call(Op::PageReady as u64, &[u64::from(p.id), page])?;
        p.ready[w] |= bit;
        Ok(())
    }
}

/// The brakes at EL2 (`crate::linux::dirty_limit`): auto-converge's
/// throttle and the dirty limit's pace, applied in EL2's write-fault path.
impl El2Vm {
    /// `PACE`: `throttle_ns` per page dirtied and `pace` pages a second per
    /// vCPU (0: off), each cut to what EL2 takes.
    pub(crate) fn set_brakes(&self, throttle_ns: u64, pace: u64) -> Result<()> {
        let args = [
            throttle_ns.min(s2mmu_el2::pace::MAX_THROTTLE_NS),
            pace.min(s2mmu_el2::pace::MAX_PACE),
        ];
        self.call(Op::Pace as u64, &args).map(|_| ())
    }

    /// A handle that does not keep the machine alive.
    pub(crate) fn downgrade(&self) -> WeakEl2Vm {
        WeakEl2Vm {
            machine: Arc::downgrade(&self.machine),
            sink: Arc::downgrade(&self.sink),
            vtcr: self.vtcr,
            vttbr: self.vttbr,
            mode: self.mode,
            ram_bytes: self.ram_bytes,
            slots: Arc::downgrade(&self.slots),
            postcopy: Arc::downgrade(&self.postcopy),
            waits: self.waits.clone(),
            shared_use: self.shared_use.clone(),
        }
    }
}

/// An [`El2Vm`] held without keeping its machine alive
/// ([`El2Vm::downgrade`]).
#[derive(Clone)]
pub(crate) struct WeakEl2Vm {
    machine: Weak<Machine>,
    sink: Weak<HypSink>,
    vtcr: u64,
    vttbr: u64,
    mode: LogMode,
    ram_bytes: u64,
    slots: Weak<Mutex<Vec<(u16, u64, u64)>>>,
    postcopy: Weak<Mutex<Option<PostcopySlot>>>,
    /// The waits EL2's paced aborts hand each vCPU: throttle and pace, ns.
    pub(crate) waits: Arc<[[AtomicU64; 2]]>,
    shared_use: Arc<Mutex<()>>,
}

impl WeakEl2Vm {
    /// The VM, while its machine lives.
    pub(crate) fn upgrade(&self) -> Option<El2Vm> {
        Some(El2Vm {
            machine: self.machine.upgrade()?,
            sink: self.sink.upgrade()?,
            vtcr: self.vtcr,
            vttbr: self.vttbr,
            mode: self.mode,
            ram_bytes: self.ram_bytes,
            slots: self.slots.upgrade()?,
            postcopy: self.postcopy.upgrade()?,
            waits: self.waits.clone(),
            shared_use: self.shared_use.clone(),
        })
    }

    /// Whether both name the same machine.
    pub(crate) fn same_machine(&self, other: &WeakEl2Vm) -> bool {
        Weak::ptr_eq(&self.machine, &other.machine)
    }
}
