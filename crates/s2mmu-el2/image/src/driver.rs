//! The program's script, played from the guest's HVCs: the host's side
//! (commands through blocks in the shared area) and the checks.
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
//! 6. Rings: a new VM in ring mode, the guest writes every 7th page,
//!    RING_HARVEST checks the entries, RING_RESET re-protects.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::arch::asm;
use s2mmu::TlbInvalidate;
use s2mmu_el2::abi::{Command, Counters, HypError, LogMode, Op};
use s2mmu_el2::tlb::cpu::Cpu;
use s2mmu_el2::{AbortOutcome, El2Tlb, Hyp, Refusal, Stage2Abort};
use spin::mutex::SpinMutex;

use crate::{semihosting, sysreg, Frame, SHARED};

const CODE_IPA: u64 = 0x1000_0000;
const CODE_BACKING: u64 = 0x4320_0000;
const DATA_IPA: u64 = 0x8000_0000;
const DATA_BACKING: u64 = 0x4400_0000;
/// Pages of the data slot.
const PAGES: u64 = 1024;
const RING_ENTRIES: u64 = 1024;
/// Offsets in the shared area: the command block, bitmaps, ring entries,
/// counters.
const OFF_BITMAP: u64 = 0x1000;
const OFF_RING: u64 = 0x2000;
const OFF_COUNTERS: u64 = 0x3_0000;
/// The guest's load from the carve-out.
const CARVE_PROBE: u64 = 0x4010_0000;

struct Driver {
    hyp: Hyp,
    tlb: Arc<El2Tlb<Cpu>>,
    step: u32,
    /// Pages the current pass writes.
    expect: Vec<u64>,
    /// Time write-protection faults while set.
    measure: bool,
    /// The entry counter of the write-protection fault whose ERET is next.
    pending: Option<u64>,
    samples: Vec<u64>,
    /// Refused aborts: why, the IPA, whether a write.
    refusals: Vec<(Refusal, u64, bool)>,
    /// Faults (translation and permission) counted up to the last harvest or mark.
    fault_mark: u64,
    failures: u32,
}

static DRIVER: SpinMutex<Option<Driver>> = SpinMutex::new(None);

/// Prints `what` and ends QEMU with exit code 1.
pub fn fail(what: core::fmt::Arguments) -> ! {
    semihosting::println(format_args!("el2: FAILED: {what}"));
    semihosting::exit(1)
}

extern "C" {
    static guest_start: u8;
    static guest_end: u8;
}

/// Sets up EL2 for the guest (stage 2 on, its VM and slots) and returns
/// the guest's entry address.
pub fn start(hyp: Hyp, tlb: Arc<El2Tlb<Cpu>>) -> u64 {
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
        asm!("dsb ish", "ic iallu", "dsb ish", "isb", options(nostack));
        // SCTLR_EL1: the guest's stage 1 off, RES1 bits.
        asm!("msr sctlr_el1, {}", in(reg) 0x30d0_0800u64, options(nostack));
        // HCR_EL2: VM (stage 2 on), RW (EL1 is AArch64).
        asm!("msr hcr_el2, {}", "isb", in(reg) (1u64 | 1 << 31), options(nostack));
    }
    let mut d = Driver {
        hyp,
        tlb,
        step: 0,
        expect: Vec::new(),
        measure: false,
        pending: None,
        samples: Vec::new(),
        refusals: Vec::new(),
        fault_mark: 0,
        failures: 0,
    };
    d.new_vm(LogMode::Manual, 0, 2 << 20);
    *DRIVER.lock() = Some(d);
    CODE_IPA
}

/// A trap from the guest: an HVC asks for the next step, an abort goes to
/// the engine.
pub fn trap(frame: &mut Frame, last_exit: u64) {
    let mut g = DRIVER.lock();
    let Some(d) = g.as_mut() else {
        fail(format_args!("a trap before the driver started"))
    };
    if let Some(entry) = d.pending.take() {
        d.samples.push(last_exit.wrapping_sub(entry));
    }
    let esr = sysreg!("esr_el2");
    match (esr >> 26) & 0x3f {
        0x16 => d.next(frame),
        0x20 | 0x24 => d.abort(frame, esr),
        ec => fail(format_args!(
            "guest exit class {ec:#x} ESR {esr:#x} ELR {:#x}",
            sysreg!("elr_el2")
        )),
    }
}

impl Driver {
    fn abort(&mut self, frame: &Frame, esr: u64) {
        let a = Stage2Abort {
            esr,
            far: sysreg!("far_el2"),
            hpfar: sysreg!("hpfar_el2"),
        };
        match self.hyp.handle_abort(0, &a) {
            AbortOutcome::Handled { permission } => {
                if permission && self.measure {
                    self.pending = Some(frame.entry_ticks);
                }
            }
            AbortOutcome::Refused(r) => {
                self.refusals.push((r, a.ipa(), a.is_write()));
                // The guest goes on past the refused access.
                let elr = sysreg!("elr_el2") + 4;
                // SAFETY: the next instruction of the guest's code.
                unsafe { asm!("msr elr_el2, {}", in(reg) elr, options(nostack)) };
            }
            AbortOutcome::ToHost => fail(format_args!("abort at {:#x} needs a host", a.ipa())),
        }
    }

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
        self.hyp.dispatch(&mut c);
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
    /// of `page` bytes), stage 2 pointed at its root.
    fn new_vm(&mut self, mode: LogMode, entries: u64, page: u64) {
        let root = self.must(Op::VmInit, &[mode as u64, entries, 1])[0];
        // VTCR_EL2: T0SZ 24 (40-bit IPA), SL0 1 (start at level 1), WB,
        // inner shareable, 4K, PS 40 bits, RES1 bit 31 (the engine's
        // Arm64Stage2 for 40 bits: level 1, two concatenated root pages);
        // HA and HD (bits 21, 22) for hardware dirty state.
        let hw = if mode == LogMode::Hw { 3 << 21 } else { 0 };
        // SAFETY: stage 2's configuration for the tables the engine makes;
        // no guest instruction runs until the ERET.
        unsafe { asm!("msr vtcr_el2, {}", "isb", in(reg) 0x8002_3558u64 | hw, options(nostack)) };
        self.must(
            Op::MemslotSet,
            &[0, 0, CODE_IPA, 64 << 10, CODE_BACKING, 4096],
        );
        self.must(
            Op::MemslotSet,
            &[1, 0, DATA_IPA, PAGES * 4096, DATA_BACKING, page],
        );
        // SAFETY: the engine's root table for a 40-bit IPA space (VTCR_EL2),
        // VMID 1; the old VM's entries are flushed next.
        unsafe { crate::set_sysreg_vttbr(root | 1 << 48) };
        self.tlb.flush_vmid();
    }

    /// Tells the guest to write every `stride`-th page (value `value`) and
    /// remembers which.
    fn write_pass(&mut self, frame: &mut Frame, stride: u64, value: u64) {
        self.expect = (0..PAGES).step_by(stride as usize).collect();
        frame.x[0] = 1;
        frame.x[1] = DATA_IPA;
        frame.x[2] = self.expect.len() as u64;
        frame.x[3] = value;
        frame.x[4] = stride * 4096;
    }

    fn counters(&mut self) -> Counters {
        self.must(Op::Counters, &[SHARED.base + OFF_COUNTERS, 80]);
        self.hyp.counters()
    }

    fn next(&mut self, frame: &mut Frame) {
        self.step += 1;
        match self.step {
            1 => self.write_pass(frame, 1, 1),
            2 => {
                let c = self.counters();
                crate::semihosting::println(format_args!(
                    "el2: first_touch pages={} translation_faults={}",
                    PAGES, c.translation
                ));
                self.must(Op::LogSet, &[1, 1, LogMode::Manual as u64]);
                self.mark_faults();
                self.measure = true;
                self.write_pass(frame, 3, 2);
            }
            3 => {
                self.check_bitmap("wp_a");
                let words = PAGES / 64;
                let bm = SHARED.base + OFF_BITMAP;
                self.must(Op::ClearDirty, &[1, 0, PAGES, bm, words * 8]);
                self.write_pass(frame, 5, 3);
            }
            4 => {
                self.check_bitmap("wp_b");
                self.measure = false;
                self.report_fault_cost();
                frame.x[0] = 2;
                frame.x[1] = CARVE_PROBE;
            }
            5 => {
                self.check_isolation();
                self.must(Op::VmDestroy, &[]);
                self.new_vm(LogMode::Hw, 0, 4096);
                self.write_pass(frame, 1, 5);
            }
            6 => {
                self.must(Op::LogSet, &[1, 1, LogMode::Hw as u64]);
                self.mark_faults();
                self.write_pass(frame, 11, 6);
            }
            7 => {
                self.check_bitmap("hw");
                self.must(Op::VmDestroy, &[]);
                self.new_vm(LogMode::Ring, RING_ENTRIES, 4096);
                self.must(Op::LogSet, &[1, 1, LogMode::Ring as u64]);
                self.write_pass(frame, 7, 4);
            }
            _ => self.finish(),
        }
    }
}

fn code_error(status: i32) -> HypError {
    HypError::from_status(status).unwrap_or(HypError::Engine)
}

mod checks;
