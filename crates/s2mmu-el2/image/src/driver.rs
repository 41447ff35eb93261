//! The program's script, played from the guest's HVCs: the host's side
//! (commands through blocks in the shared area) and the checks. The VM has
//! one vCPU per CPU ([`CPUS`]); each pass splits its pages between them,
//! and their aborts reach the engine at once, each CPU on its own. A step
//! runs when every CPU has finished the pass before it (its HVC), on the
//! CPU that arrived last.
//!
//! 1. First touch: the guest writes every page of its data slot; each
//!    abort maps from the slot's backing (2 MiB blocks).
//! 2. Logging on (manual protect): the guest writes every 3rd page; each
//!    write-protection fault is marked dirty at EL2 and timed.
//! 3. GET checks the bitmap against the pages written (0 lost, no
//!    extra); CLEAR protects them; the guest writes every 5th page; GET
//!    checks again.
//! 4. Isolation: the guest reads and writes an address in the carve-out
//!    (both refused, not mapped, the accesses skipped) and a slot backed by
//!    the carve-out is refused.
//! 5. Hardware dirty state: a new VM in `hw` mode (VTCR_EL2.HA/HD), every
//!    page touched, logging on, every 11th page written: no fault, the
//!    CPU sets the dirty state (DBM) and GET's scan reports the pages.
//! 6. Rings: a new VM in ring mode with rings of 256 entries, the guest
//!    writes every page: each time a vCPU's ring is soft-full its abort
//!    exits to the host (here the driver on that CPU), which harvests and
//!    resets the rings, and the vCPU resumes and retries the access;
//!    the harvests together must hold every page written.
//! 7. Post-copy (`postcopy.rs`): a new VM whose data slot is post-copy,
//!    its backing poisoned; the guest writes every page: each first touch
//!    exits to the host, which fills the page and sends `PAGE_READY`, and
//!    the write completes; every page is checked (the host's contents, the
//!    guest's word).
//! 8. Break-before-make fault injection (`inject.rs`): a VM on blocks,
//!    logging on, then its invalidations withheld while the guest's writes
//!    split the blocks, CLEAR protects and COLLAPSE merges them back; the
//!    trace of every store and invalidation goes to the host's file
//!    `el2-bbm.trace`, whose replay must flag this VM and no other.

use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::arch::asm;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use s2mmu::TlbInvalidate;
use s2mmu_el2::abi::{Command, Counters, HypError, LogMode, Op};
use s2mmu_el2::tlb::cpu::Cpu;
use s2mmu_el2::trace::TracedTlb;
use s2mmu_el2::{AbortOutcome, El2Tlbi, Hyp, Refusal, Stage2Abort};
use spin::mutex::SpinMutex;

use crate::board::{sysreg, Frame, SHARED};
use crate::semihosting;

/// CPUs, one vCPU each.
pub const CPUS: usize = 2;
const CODE_IPA: u64 = 0x1000_0000;
const CODE_BACKING: u64 = 0x4320_0000;
const DATA_IPA: u64 = 0x8000_0000;
const DATA_BACKING: u64 = 0x4400_0000;
/// Pages of the data slot.
const PAGES: u64 = 1024;
/// Entries of each vCPU's ring: fewer than the ring pass writes, so it
/// fills and exits to the host.
const RING_ENTRIES: u64 = 256;
/// Offsets in the shared area: the command block, bitmaps, ring entries,
/// counters.
const OFF_BITMAP: u64 = 0x1000;
const OFF_RING: u64 = 0x2000;
const OFF_COUNTERS: u64 = 0x3_0000;
/// The guest's accesses to the carve-out.
const CARVE_PROBE: u64 = 0x4010_0000;

/// Stage 2's registers for every CPU, and their generation.
#[derive(Clone, Copy)]
struct Stage2Regs {
    vtcr: u64,
    vttbr: u64,
    generation: u64,
}

/// EL2's TLB backend, each invalidation recorded for the host's replay.
pub type Tlb = TracedTlb<El2Tlbi<Cpu>>;

struct Driver {
    tlb: Arc<Tlb>,
    step: u32,
    /// CPUs at the HVC that ends the current step's pass.
    arrived: usize,
    /// Pages the current pass writes.
    expect: Vec<u64>,
    /// Each CPU's next guest request (x0-x4).
    work: [[u64; 5]; CPUS],
    stage2: Stage2Regs,
    /// Refused aborts: why, the IPA, whether a write.
    refusals: Vec<(Refusal, u64, bool)>,
    /// Faults (translation and permission) counted up to the last harvest or mark.
    fault_mark: u64,
    /// Pages of the data slot harvested from the rings so far.
    ring_seen: Vec<bool>,
    /// Ring-full exits the host answered.
    ring_exits: u64,
    /// Post-copy: how often each page of the data slot was sent.
    sent: Vec<u32>,
    failures: u32,
}

/// What each CPU keeps without the driver's lock.
struct PerCpu {
    /// The entry counter of the write-protection fault whose ERET is next
    /// (0: none).
    pending: AtomicU64,
    samples: SpinMutex<Vec<u64>>,
    /// The stage-2 generation this CPU runs.
    generation: AtomicU64,
    /// Aborts this CPU answered at EL2.
    aborts: AtomicU64,
}

static DRIVER: SpinMutex<Option<Driver>> = SpinMutex::new(None);
static HYP: AtomicPtr<Hyp> = AtomicPtr::new(core::ptr::null_mut());
static PER_CPU: [PerCpu; CPUS] = [const {
    PerCpu {
        pending: AtomicU64::new(0),
        samples: SpinMutex::new(Vec::new()),
        generation: AtomicU64::new(0),
        aborts: AtomicU64::new(0),
    }
}; CPUS];
/// Time write-protection faults while set.
static MEASURE: AtomicBool = AtomicBool::new(false);

/// EL2's state, shared by every CPU.
fn hyp() -> &'static Hyp {
    let p = HYP.load(Ordering::Acquire);
    if p.is_null() {
        fail(format_args!("EL2's state used before it was made"));
    }
    // SAFETY: set once in `start` from a leaked box, never freed.
    unsafe { &*p }
}

/// Prints `what` and ends QEMU with exit code 1.
pub fn fail(what: core::fmt::Arguments) -> ! {
    semihosting::println(format_args!("el2: FAILED: {what}"));
    semihosting::exit(1)
}

extern "C" {
    static guest_start: u8;
    static guest_end: u8;
}

/// Sets up EL2 for the guest (the guest's code in place, its VM and
/// slots); every CPU then calls [`enter_stage2`].
pub fn start(hyp: Hyp, tlb: Arc<Tlb>) -> u64 {
    // SAFETY: the guest's code lies between the two symbols of boot.S;
    // its backing is RAM outside the carve-out that nothing else uses.
    unsafe {
        let src = &raw const guest_start;
        let len = (&raw const guest_end).offset_from(src) as usize;
        core::ptr::copy_nonoverlapping(src, CODE_BACKING as *mut u8, len);
        // The guest fetches with its stage 1 off (non-cacheable): clean
        // the copy to the point of coherency, drop stale instructions.
        let mut a = CODE_BACKING;
        while a < CODE_BACKING + len as u64 {
            asm!("dc civac, {}", in(reg) a, options(nostack));
            a += 64;
        }
        asm!("dsb ish", "ic ialluis", "dsb ish", "isb", options(nostack));
    }
    HYP.store(Box::into_raw(Box::new(hyp)), Ordering::Release);
    let mut d = Driver {
        tlb,
        step: 0,
        arrived: 0,
        expect: Vec::new(),
        work: [[0; 5]; CPUS],
        stage2: Stage2Regs {
            vtcr: 0,
            vttbr: 0,
            generation: 0,
        },
        refusals: Vec::new(),
        fault_mark: 0,
        ring_seen: alloc::vec![false; PAGES as usize],
        ring_exits: 0,
        sent: Vec::new(),
        failures: 0,
    };
    d.new_vm(LogMode::Manual, 0, 2 << 20);
    *DRIVER.lock() = Some(d);
    CODE_IPA
}

/// Loads this CPU's guest registers and the VM's stage 2 (if it changed
/// since this CPU last ran); returns the guest's entry.
pub fn enter_stage2(cpu: usize) -> u64 {
    let regs = match DRIVER.lock().as_ref() {
        Some(d) => d.stage2,
        None => fail(format_args!("CPU {cpu} before the driver started")),
    };
    if PER_CPU[cpu]
        .generation
        .swap(regs.generation, Ordering::Relaxed)
        != regs.generation
    {
        // SAFETY: the engine's root and configuration for this VM (VMID 1),
        // whose old entries were flushed (inner shareable) when it was
        // made; the guest runs nothing on this CPU until the ERET. The
        // guest's stage 1 off (SCTLR_EL1, RES1 bits); HCR_EL2: VM, RW.
        unsafe {
            asm!(
                "msr sctlr_el1, {s}",
                "msr vtcr_el2, {c}",
                "msr vttbr_el2, {t}",
                "msr hcr_el2, {h}",
                "isb",
                "tlbi vmalls12e1",
                "dsb nsh",
                "isb",
                s = in(reg) 0x30d0_0800u64,
                c = in(reg) regs.vtcr,
                t = in(reg) regs.vttbr,
                h = in(reg) (1u64 | 1 << 31),
                options(nostack)
            )
        };
    }
    CODE_IPA
}

/// A trap from CPU `cpu`'s vCPU: an HVC asks for the next step, an abort
/// goes to the engine.
pub fn trap(cpu: usize, frame: &mut Frame, last_exit: u64) {
    let pc = &PER_CPU[cpu];
    let entry = pc.pending.swap(0, Ordering::Relaxed);
    if entry != 0 {
        pc.samples.lock().push(last_exit.wrapping_sub(entry));
    }
    let esr = sysreg!("esr_el2");
    match (esr >> 26) & 0x3f {
        0x16 => hvc(cpu, frame),
        0x20 | 0x24 => abort(cpu, frame, esr),
        ec => fail(format_args!(
            "guest exit class {ec:#x} ESR {esr:#x} ELR {:#x}",
            sysreg!("elr_el2")
        )),
    }
}

fn abort(cpu: usize, frame: &Frame, esr: u64) {
    let a = Stage2Abort {
        esr,
        far: sysreg!("far_el2"),
        hpfar: sysreg!("hpfar_el2"),
    };
    match hyp().handle_abort(cpu, &a) {
        AbortOutcome::Handled { permission } => {
            PER_CPU[cpu].aborts.fetch_add(1, Ordering::Relaxed);
            if permission && MEASURE.load(Ordering::Relaxed) {
                PER_CPU[cpu]
                    .pending
                    .store(frame.entry_ticks.max(1), Ordering::Relaxed);
            }
        }
        AbortOutcome::Refused(r) => {
            if let Some(d) = DRIVER.lock().as_mut() {
                d.refusals.push((r, a.ipa(), a.is_write()));
            }
            // The guest goes on past the refused access.
            let elr = sysreg!("elr_el2") + 4;
            // SAFETY: the next instruction of the guest's code.
            unsafe { asm!("msr elr_el2, {}", in(reg) elr, options(nostack)) };
        }
        // The host's side: harvest and reset; the guest retries the access
        // (ELR_EL2 unchanged).
        AbortOutcome::RingFull => match DRIVER.lock().as_mut() {
            Some(d) => d.ring_full_exit(),
            None => fail(format_args!("a ring-full exit before the driver started")),
        },
        // Post-copy: the host fills the page and has EL2 map it; the
        // guest retries the access.
        AbortOutcome::PageMissing { ipa } => match DRIVER.lock().as_mut() {
            Some(d) => d.postcopy_fill(ipa),
            None => fail(format_args!("a missing page before the driver started")),
        },
        AbortOutcome::ToHost => fail(format_args!("abort at {:#x} needs a host", a.ipa())),
        // This program sets no brakes (`PACE`).
        AbortOutcome::Paced { .. } => fail(format_args!("abort at {:#x} paced", a.ipa())),
    }
}

/// The end of CPU `cpu`'s pass: the last CPU to arrive runs the next
/// step; every CPU waits for it, then takes its part.
fn hvc(cpu: usize, frame: &mut Frame) {
    let mine = {
        let mut g = DRIVER.lock();
        let Some(d) = g.as_mut() else {
            fail(format_args!("an HVC before the driver started"))
        };
        let mine = d.step;
        d.arrived += 1;
        if d.arrived == CPUS {
            d.arrived = 0;
            d.next();
            d.step += 1;
        }
        mine
    };
    while DRIVER.lock().as_ref().is_some_and(|d| d.step == mine) {
        core::hint::spin_loop();
    }
    enter_stage2(cpu);
    if let Some(d) = DRIVER.lock().as_ref() {
        frame.x[..5].copy_from_slice(&d.work[cpu]);
    }
}

impl Driver {
    /// Sends `op` through the command block at the start of the shared
    /// area, as the host would.
    fn cmd(&mut self, op: Op, args: &[u64]) -> Result<[u64; 4], HypError> {
        let block = SHARED.base as *mut Command;
        // SAFETY: the block lies at the start of the shared area, mapped
        // and aligned; volatile, as memory the host writes.
        let mut c = unsafe {
            block.write_volatile(Command::new(op, args));
            block.read_volatile()
        };
        hyp().dispatch(&mut c);
        // SAFETY: as above.
        unsafe { block.write_volatile(c) };
        if c.status == 0 {
            Ok(c.ret)
        } else {
            Err(code_error(c.status))
        }
    }

    fn must(&mut self, op: Op, args: &[u64]) -> [u64; 4] {
        match self.cmd(op, args) {
            Ok(r) => r,
            Err(e) => fail(format_args!("{op:?} {args:x?} refused: {e:?}")),
        }
    }

    /// A VM in `mode` with the code slot and the data slot (backing pages
    /// of `page` bytes); every CPU loads its stage 2 before it next enters
    /// the guest ([`enter_stage2`]).
    fn new_vm(&mut self, mode: LogMode, entries: u64, page: u64) {
        self.new_vm_flags(mode, entries, page, 0);
    }

    /// [`Driver::new_vm`] with the data slot's `MEMSLOT_SET` flags.
    fn new_vm_flags(&mut self, mode: LogMode, entries: u64, page: u64, flags: u64) {
        let root = self.must(Op::VmInit, &[mode as u64, entries, CPUS as u64])[0];
        if let Some(table) = hyp().with_mmu(|m| m.bbm_id()) {
            self.tlb.set_table(table);
        }
        self.must(
            Op::MemslotSet,
            &[0, 0, CODE_IPA, 64 << 10, CODE_BACKING, 4096],
        );
        self.must(
            Op::MemslotSet,
            &[1, flags, DATA_IPA, PAGES * 4096, DATA_BACKING, page],
        );
        // VTCR_EL2: T0SZ 24 (40-bit IPA), SL0 1 (start at level 1), WB,
        // inner shareable, 4K, PS 40 bits, RES1 bit 31 (the engine's
        // Arm64Stage2 for 40 bits: level 1, two concatenated root pages);
        // HA and HD (bits 21, 22) for hardware dirty state.
        let hw = if mode == LogMode::Hw { 3 << 21 } else { 0 };
        self.stage2 = Stage2Regs {
            vtcr: 0x8002_3558 | hw,
            vttbr: root | 1 << 48,
            generation: self.stage2.generation + 1,
        };
        // Whatever the old VM left in VMID 1, on every CPU.
        self.tlb.flush_vmid();
    }

    /// Tells the guests to write every `stride`-th page (value `value`),
    /// alternate pages of the pass to each CPU, and remembers which.
    fn write_pass(&mut self, stride: u64, value: u64) {
        self.expect = (0..PAGES).step_by(stride as usize).collect();
        let n = self.expect.len() as u64;
        let cpus = CPUS as u64;
        for (c, w) in self.work.iter_mut().enumerate() {
            let c = c as u64;
            let count = (n + cpus - 1 - c) / cpus;
            *w = [
                1,
                DATA_IPA + c * stride * 4096,
                count,
                value,
                cpus * stride * 4096,
            ];
            if count == 0 {
                *w = [0; 5];
            }
        }
    }

    fn counters(&mut self) -> Counters {
        let bytes = core::mem::size_of::<Counters>() as u64;
        self.must(Op::Counters, &[SHARED.base + OFF_COUNTERS, bytes]);
        hyp().counters()
    }

    /// Runs the step after the pass every CPU just finished and sets each
    /// CPU's next request.
    fn next(&mut self) {
        self.work = [[0; 5]; CPUS];
        match self.step + 1 {
            1 => self.write_pass(1, 1),
            2 => {
                let c = self.counters();
                crate::semihosting::println(format_args!(
                    "el2: first_touch pages={} translation_faults={}",
                    PAGES, c.translation
                ));
                self.must(Op::LogSet, &[1, 1, LogMode::Manual as u64]);
                self.mark_faults();
                MEASURE.store(true, Ordering::Relaxed);
                self.write_pass(3, 2);
            }
            3 => {
                self.check_bitmap("wp_a");
                let words = PAGES / 64;
                let bm = SHARED.base + OFF_BITMAP;
                self.must(Op::ClearDirty, &[1, 0, PAGES, bm, words * 8]);
                self.write_pass(5, 3);
            }
            4 => {
                self.check_bitmap("wp_b");
                MEASURE.store(false, Ordering::Relaxed);
                self.report_fault_cost();
                // CPU 0 probes the carve-out; the others wait.
                self.work[0] = [2, CARVE_PROBE, 0, 7, 0];
            }
            5 => {
                self.check_isolation();
                self.must(Op::VmDestroy, &[]);
                self.new_vm(LogMode::Hw, 0, 4096);
                self.write_pass(1, 5);
            }
            6 => {
                self.must(Op::LogSet, &[1, 1, LogMode::Hw as u64]);
                self.mark_faults();
                self.write_pass(11, 6);
            }
            7 => {
                self.check_bitmap("hw");
                self.must(Op::VmDestroy, &[]);
                self.new_vm(LogMode::Ring, RING_ENTRIES, 4096);
                self.must(Op::LogSet, &[1, 1, LogMode::Ring as u64]);
                self.write_pass(1, 4);
            }
            8 => {
                self.check_ring();
                self.postcopy_start();
            }
            9 => {
                self.postcopy_check();
                self.inject_start();
            }
            10 => self.inject_withhold(),
            _ => self.inject_end(),
        }
    }
}

fn code_error(status: i32) -> HypError {
    HypError::from_status(status).unwrap_or(HypError::Engine)
}

mod checks;
mod inject;
mod postcopy;
