//! The s2mmu engine at EL2 for the Linux guest's stub (`asm/hyp.S` built
//! with `EL2_ENGINE`): a static library the build script links into the
//! stub's image (`asm/hyp_el2.ld`).
//!
//! The stub calls two functions, both with EL2's stage-1 MMU on (RAM
//! Normal write-back, devices Device) and interrupts masked:
//!
//! - [`s2mmu_el2_abort`] from its exception vector, for every stage-2
//!   abort a vCPU takes: the engine answers it here ([`Hyp::handle_abort`])
//!   and the stub returns to the guest without the host, or says why the
//!   host must see it;
//! - [`s2mmu_el2_command`] from its command loop (the `EL2` command on
//!   the service CPU): one [`s2mmu_el2::Command`] block the host wrote in
//!   the mailbox's argument words, checked and run by
//!   [`Hyp::dispatch`]; the first command sets EL2 up ([`OP_SETUP`]).
//!   Two more are this image's own: [`OP_TRACE`] records the engine's
//!   descriptor stores and EL2's invalidations into a ring in the shared
//!   area for the host's break-before-make checker, and [`OP_WITHHOLD`]
//!   withholds the invalidations (fault injection for that checker).
//!
//! Memory (mirrored in `src/hyp/layout.rs`): EL2's carve-out is all RAM
//! below the guest data (`0x4000_0000..0x6000_0000`: the stub, the
//! mailboxes, the stacks, this library at `0x4100_0000`, its heap and its
//! stage-2 table pool); no memslot may be backed by any of it.
#![no_std]
#![warn(missing_docs)]

extern crate alloc;

use alloc::boxed::Box;
use alloc::sync::Arc;
use core::sync::atomic::{AtomicPtr, Ordering};
use s2mmu_el2::heap::{self, El2Heap};
use s2mmu_el2::tlb::cpu::{self, Cpu};
use s2mmu_el2::trace::{self, TracedTlb};
use s2mmu_el2::{
    AbortOutcome, Command, El2Tlb, El2Tlbi, Hyp, HypError, Layout, PagePool, Refusal, Region,
    Stage2Abort,
};

#[global_allocator]
static HEAP: El2Heap = El2Heap::empty();

/// EL2's carve-out: the stub, mailboxes, stacks, this library, its heap
/// and its table pool.
const CARVE_OUT: Region = Region::new(0x4000_0000, 0x2000_0000);
/// The heap (the engine's memslots, bitmaps, rings).
const HEAP_BASE: usize = 0x4200_0000;
const HEAP_BYTES: usize = 16 << 20;
/// The stage-2 table pool.
const POOL_BASE: u64 = 0x4300_0000;
const POOL_PAGES: usize = 16384;

/// The set-up command: args RAM base and bytes (what slots may be backed
/// by), shared area base and bytes (where the host's buffers lie).
pub const OP_SETUP: u32 = 0x100;
/// Starts the break-before-make trace: args ring PA (8-aligned, inside the
/// shared area) and records ([`trace::WORDS`] words each, at least one).
/// With both 0, stops it: ret\[0\] the records written, ret\[1\] those
/// dropped because the ring was full.
pub const OP_TRACE: u32 = 0x101;
/// Fault injection: arg 1 withholds every invalidation EL2 would issue
/// for the VM from now on (marked in the trace), 0 issues them again and
/// flushes the whole VMID.
pub const OP_WITHHOLD: u32 = 0x102;

/// EL2's TLB backend: the CPU's instructions, traced.
type Tlb = TracedTlb<El2Tlbi<Cpu>>;

/// The mailbox's argument words (`layout::mb::ARG0`), as words.
const ARG0_WORD: usize = 0x20 / 8;

static HYP: AtomicPtr<Hyp> = AtomicPtr::new(core::ptr::null_mut());
static TLB: AtomicPtr<Tlb> = AtomicPtr::new(core::ptr::null_mut());

fn hyp() -> Option<&'static Hyp> {
    let p = HYP.load(Ordering::Acquire);
    // SAFETY: a non-null pointer was leaked by `setup` and is never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// What [`s2mmu_el2_abort`] answers: the guest resumes.
pub const ABORT_HANDLED: u64 = 0;
/// No slot covers the IPA (MMIO): the host's devices.
pub const ABORT_NO_SLOT: u64 = 1;
/// The vCPU's dirty ring is soft-full.
pub const ABORT_RING_FULL: u64 = 2;
/// A post-copy page has not arrived.
pub const ABORT_PAGE_MISSING: u64 = 3;
/// Anything else (a write to a read-only slot, an engine error, no VM).
pub const ABORT_OTHER: u64 = 4;
/// Answered, and the vCPU owes a wait for the pages it dirtied: the host
/// waits the throttle and pace the mailbox's words [`MB_THROTTLE_NS`] and
/// [`MB_PACE_NS`] hold before it resumes the guest.
pub const ABORT_PACED: u64 = 5;
/// The mailbox's word (`layout::mb::EL2_THROTTLE_NS`) for a paced abort's
/// throttle, in nanoseconds.
const MB_THROTTLE_NS: usize = 0x3e8 / 8;
/// The mailbox's word (`layout::mb::EL2_PACE_NS`) for its pace's lead.
const MB_PACE_NS: usize = 0x3f0 / 8;

/// A stage-2 abort vCPU `cpu` took: [`ABORT_HANDLED`] or why the host
/// must see it.
///
/// # Safety
/// Called by the stub at EL2 on the faulting CPU, with its MMU on and the
/// abort's `ESR_EL2`, `FAR_EL2`, `HPFAR_EL2`; `mbox` is the CPU's mailbox,
/// mapped.
#[no_mangle]
pub unsafe extern "C" fn s2mmu_el2_abort(
    cpu: u64,
    esr: u64,
    far: u64,
    hpfar: u64,
    mbox: *mut u64,
) -> u64 {
    let Some(h) = hyp() else {
        return ABORT_OTHER;
    };
    match h.handle_abort(cpu as usize, &Stage2Abort { esr, far, hpfar }) {
        AbortOutcome::Handled { .. } => ABORT_HANDLED,
        AbortOutcome::Paced {
            throttle_ns,
            pace_ns,
        } => {
            // SAFETY: both words lie inside this CPU's mailbox (the
            // caller's contract), which the host reads only once the
            // abort is posted.
            unsafe {
                mbox.add(MB_THROTTLE_NS).write_volatile(throttle_ns);
                mbox.add(MB_PACE_NS).write_volatile(pace_ns);
            }
            ABORT_PACED
        }
        AbortOutcome::Refused(Refusal::NoSlot | Refusal::CarveOut) => ABORT_NO_SLOT,
        AbortOutcome::RingFull => ABORT_RING_FULL,
        AbortOutcome::PageMissing { .. } => ABORT_PAGE_MISSING,
        _ => ABORT_OTHER,
    }
}

/// Runs the command block in mailbox `mbox`'s argument words: word 2 the
/// op code, words 3..9 its six arguments (words 0 and 1 are VTCR_EL2 and
/// VTTBR_EL2, which the stub loaded). The results go to words 2..6; the
/// status (0 or a negative [`HypError`] code) is returned.
///
/// # Safety
/// `mbox` is this CPU's mailbox, mapped, the host not writing it until the
/// command is done.
#[no_mangle]
pub unsafe extern "C" fn s2mmu_el2_command(mbox: *mut u64) -> i64 {
    // SAFETY: the argument words lie inside the mailbox (the caller's
    // contract); volatile, as the host wrote them.
    let word = |i: usize| unsafe { mbox.add(ARG0_WORD + i).read_volatile() };
    let mut cmd = Command {
        op: word(2) as u32,
        status: 0,
        args: core::array::from_fn(|i| word(3 + i)),
        ret: [0; 4],
    };
    let own = match cmd.op {
        OP_SETUP => Some(setup(&cmd.args).map(|()| [0; 4])),
        OP_TRACE => Some(trace_command(&cmd.args)),
        OP_WITHHOLD => Some(withhold(&cmd.args)),
        _ => None,
    };
    if let Some(r) = own {
        (cmd.status, cmd.ret) = match r {
            Ok(ret) => (0, ret),
            Err(e) => (e.status(), [0; 4]),
        };
    } else if let Some(h) = hyp() {
        h.dispatch(&mut cmd);
    } else {
        cmd.status = HypError::NoVm.status();
    }
    for (i, r) in cmd.ret.iter().enumerate() {
        // SAFETY: as above.
        unsafe { mbox.add(ARG0_WORD + 2 + i).write_volatile(*r) };
    }
    i64::from(cmd.status)
}

/// The first command: the heap, the pool, EL2's state over the layout the
/// host names (checked by [`Hyp::new`]).
fn setup(args: &[u64; 6]) -> Result<(), HypError> {
    if hyp().is_some() {
        return Err(HypError::VmExists);
    }
    if args[4..] != [0, 0] {
        return Err(HypError::BadArgument);
    }
    let ram = Region::new(args[0], args[1]);
    let shared = Region::new(args[2], args[3]);
    if ram.overlaps(CARVE_OUT.base, CARVE_OUT.size) {
        return Err(HypError::CarveOut);
    }
    // SAFETY: the heap lies in the carve-out, mapped Normal by the stub,
    // and nothing else uses it; `hyp()` was null, so this runs once (the
    // host sends commands to one CPU, one at a time).
    unsafe { heap::init(&HEAP, HEAP_BASE as *mut u8, HEAP_BYTES) };
    // SAFETY: the pool's pages are carve-out memory nothing else uses,
    // identity-mapped by the stub.
    let pool = unsafe { PagePool::new(POOL_BASE, POOL_BASE as *mut u8, POOL_PAGES) };
    // SAFETY: we run at EL2; every invalidation runs on a CPU whose
    // VTTBR_EL2 holds the VM's VMID (a vCPU's, or the service CPU's, which
    // the stub loads for each command).
    let tlb = Arc::new(TracedTlb::new(El2Tlb::backend(
        unsafe { Cpu::new() },
        cpu::features(),
    )));
    TLB.store(Arc::into_raw(tlb.clone()).cast_mut(), Ordering::Release);
    let layout = Layout {
        carve_out: CARVE_OUT,
        ram,
        shared,
        shared_va: shared.base as *mut u8,
        ram_va: ram.base as *mut u8,
    };
    // SAFETY: the shared area and the RAM slots may be backed by are RAM
    // the stub maps identically (Normal) for as long as the machine runs;
    // the pool is in the carve-out.
    let h = unsafe { Hyp::new(layout, pool, tlb) }?;
    HYP.store(Box::into_raw(Box::new(h)), Ordering::Release);
    Ok(())
}

fn tlb() -> Option<&'static Tlb> {
    let p = TLB.load(Ordering::Acquire);
    // SAFETY: a non-null pointer is an `Arc` `setup` leaked, never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// [`OP_TRACE`]: the ring checked against the shared area EL2 was given
/// ([`trace::check_ring`]).
fn trace_command(args: &[u64; 6]) -> Result<[u64; 4], HypError> {
    let (h, t) = hyp().zip(tlb()).ok_or(HypError::NoVm)?;
    let Some((_, records)) = trace::check_ring(h.layout(), args)? else {
        let n = trace::stop();
        return Ok([n as u64, trace::dropped(), 0, 0]);
    };
    let table = h.with_mmu(|m| m.bbm_id()).ok_or(HypError::NoVm)?;
    // Stopped first: no CPU writes the old ring while the new one starts.
    trace::stop();
    t.set_table(table);
    // SAFETY: the ring lies inside the shared area (checked above), which
    // the stub maps identically for as long as the machine runs; EL2
    // writes it only here, until the next start or stop.
    unsafe { trace::install(args[0] as *mut u64, records) };
    Ok([0; 4])
}

/// [`OP_WITHHOLD`] ([`trace::withhold_arg`]).
fn withhold(args: &[u64; 6]) -> Result<[u64; 4], HypError> {
    let t = tlb().ok_or(HypError::NoVm)?;
    let on = trace::withhold_arg(args)?;
    t.withhold(on);
    if !on {
        s2mmu::TlbInvalidate::flush_vmid(t);
    }
    Ok([0; 4])
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    extern "C" {
        fn hyp_panic() -> !;
    }
    // SAFETY: the stub's panic path reports on the console and stops this
    // CPU; it returns never.
    unsafe { hyp_panic() }
}
