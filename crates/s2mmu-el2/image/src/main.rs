//! A bare-metal EL2 program for QEMU's `virt` machine
//! (`-M virt,virtualization=on -cpu max -smp 2 -semihosting`): the s2mmu
//! engine, built for `aarch64-unknown-none`, owns a small guest's stage 2
//! and answers its aborts here, at EL2, on both CPUs at once (one vCPU
//! each; CPU 1 is started with PSCI `CPU_ON`).
//!
//! Memory (RAM from 0x4000_0000): EL2's carve-out 0x4000_0000-0x4200_0000
//! (this image at 0x4008_0000, its heap at 0x4100_0000, its stage-2 table
//! pool at 0x4180_0000); the area shared with the host (here the driver in
//! `driver.rs` plays the host and sends its commands through blocks there)
//! at 0x4300_0000; the guest's code backing at 0x4320_0000 and its data
//! backing at 0x4400_0000.
//!
//! `boot.S` turns EL2's stage-1 MMU on and installs the vectors before
//! `el2_main` runs; the results are printed by semihosting, and the exit
//! code says whether every check passed.
#![no_std]
#![no_main]

extern crate alloc;

mod board;
mod driver;
mod semihosting;

use alloc::sync::Arc;
use board::{sysreg, Frame, CARVE_OUT, HEAP_BASE, HEAP_BYTES, POOL_BASE, POOL_PAGES, RAM, SHARED};
use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicU64, Ordering};
use s2mmu_el2::heap::{self, El2Heap};
use s2mmu_el2::tlb::cpu::{self, Cpu};
use s2mmu_el2::trace::{self, TracedTlb};
use s2mmu_el2::{El2Tlb, Hyp, Layout, PagePool};

global_asm!(
    include_str!("../../asm/el2_macros.S"),
    include_str!("boot.S")
);

#[global_allocator]
static HEAP: El2Heap = El2Heap::empty();

/// Records of the break-before-make trace ring (in the heap).
const TRACE_RECORDS: usize = 32768;

/// Per CPU, the counter just before its last ERET to the guest (`boot.S`).
#[no_mangle]
static EL2_EXIT_TICKS: [AtomicU64; driver::CPUS] = [const { AtomicU64::new(0) }; driver::CPUS];

extern "C" {
    fn el2_enter_guest(entry: u64, stack_top: u64) -> !;
    fn el2_secondary_entry();
    static __stack_top: u8;
}

/// CPU `cpu`'s stack top (`boot.S`: 64 KiB each, CPU 0's highest).
fn stack_top(cpu: usize) -> u64 {
    (&raw const __stack_top as u64) - ((cpu as u64) << 16)
}

/// PSCI `CPU_ON` through the SMC conduit (QEMU's firmware with
/// virtualization on): CPU `cpu` (MPIDR Aff0) starts at EL2 at
/// `el2_secondary_entry` with x0 = `cpu`.
fn cpu_on(cpu: usize) -> i64 {
    let r: i64;
    // SAFETY: a firmware call that starts a powered-off CPU at the entry
    // given; it touches no memory of ours.
    unsafe {
        asm!(
            "smc #0",
            inout("x0") 0xc400_0003u64 as i64 => r,
            in("x1") cpu as u64,
            in("x2") el2_secondary_entry as *const () as u64,
            in("x3") cpu as u64,
            options(nostack)
        )
    };
    r
}

#[no_mangle]
extern "C" fn el2_main() -> ! {
    // SAFETY: the heap region lies in the carve-out, is mapped Normal by
    // boot.S, and nothing else uses it.
    unsafe { heap::init(&HEAP, HEAP_BASE as *mut u8, HEAP_BYTES) };
    let features = cpu::features();
    // SAFETY: the pool's pages are carve-out memory nothing else uses,
    // identity-mapped, so their physical address is their address.
    let pool = unsafe { PagePool::new(POOL_BASE, POOL_BASE as *mut u8, POOL_PAGES) };
    // SAFETY: we run at EL2; VTTBR_EL2 holds the VM's VMID before the
    // guest runs or any invalidation is issued for it.
    let tlb = Arc::new(TracedTlb::new(El2Tlb::backend(
        unsafe { Cpu::new() },
        features,
    )));
    let ring = alloc::vec![0u64; TRACE_RECORDS * trace::WORDS].leak();
    // SAFETY: the ring is leaked, so it lives for the rest of the program,
    // and only the trace writes it.
    unsafe { trace::install(ring.as_mut_ptr(), TRACE_RECORDS) };
    let layout = Layout {
        carve_out: CARVE_OUT,
        ram: RAM,
        shared: SHARED,
        shared_va: SHARED.base as *mut u8,
        ram_va: RAM.base as *mut u8,
    };
    // SAFETY: the shared area is RAM outside the carve-out, identity
    // mapped for as long as the program runs; the pool is in the carve-out.
    let hyp = match unsafe { Hyp::new(layout, pool, tlb.clone()) } {
        Ok(h) => h,
        Err(e) => driver::fail(format_args!("Hyp::new refused the layout: {e:?}")),
    };
    semihosting::println(format_args!(
        "el2: tlb range={} ttl={} counter_hz={}",
        u8::from(features.range),
        u8::from(features.ttl),
        s2mmu_el2::GenericTimer::frequency().unwrap_or(0)
    ));
    let entry = driver::start(hyp, tlb);
    for cpu in 1..driver::CPUS {
        let r = cpu_on(cpu);
        if r != 0 {
            driver::fail(format_args!("PSCI CPU_ON of CPU {cpu}: {r}"));
        }
    }
    driver::enter_stage2(0);
    // SAFETY: `entry` is the guest's code, mapped by its slot on first
    // fetch; the stack top is boot.S's, which no Rust frame needs now.
    unsafe { el2_enter_guest(entry, stack_top(0)) }
}

/// A secondary CPU, its EL2 set up by `boot.S`: enters the guest as the
/// VM's vCPU `cpu`.
#[no_mangle]
extern "C" fn el2_secondary_main(cpu: usize) -> ! {
    if cpu >= driver::CPUS {
        driver::fail(format_args!("CPU {cpu} started"));
    }
    let entry = driver::enter_stage2(cpu);
    // SAFETY: as for CPU 0; this CPU's own stack.
    unsafe { el2_enter_guest(entry, stack_top(cpu)) }
}

/// A trap from the guest (`boot.S`).
#[no_mangle]
extern "C" fn el2_trap(frame: &mut Frame) {
    let cpu = (sysreg!("tpidr_el2") as usize).min(driver::CPUS - 1);
    driver::trap(cpu, frame, EL2_EXIT_TICKS[cpu].load(Ordering::Relaxed));
}

/// A trap EL2 does not expect (from EL2 itself, an interrupt).
#[no_mangle]
extern "C" fn el2_unexpected(frame: &mut Frame) -> ! {
    let _ = frame;
    driver::fail(format_args!(
        "unexpected exception: ESR_EL2={:#x} ELR_EL2={:#x} FAR_EL2={:#x}",
        sysreg!("esr_el2"),
        sysreg!("elr_el2"),
        sysreg!("far_el2")
    ))
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    driver::fail(format_args!("panic: {info}"))
}
