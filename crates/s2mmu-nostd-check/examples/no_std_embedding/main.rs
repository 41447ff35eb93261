//! The engine embedded as a `no_std` hypervisor embeds it: table pages from
//! a static arena, its own `lock_api` lock, its own clock, and the engine's
//! lock-protected snapshot cells, bundled as a `s2mmu::sync::Platform`
//! (below). The arena and the lock are this crate's library
//! (`crates/s2mmu-nostd-check/src/{arena,ticket}.rs`, whose test drives
//! the same facade under a global allocator of its own); they use only
//! `core`, `alloc` and `lock_api`: copy them into a kernel as they are
//! (the arena's allocation budget is the test's fault injection, unused
//! here).
//!
//! This `main` is an ordinary host program so that the example runs: it
//! drives the facade through that platform (a stage-2 fault that maps a
//! block, logging on with an eager split, guest writes logged, GET and
//! CLEAR, the slot deleted), checks each result, and exits nonzero on a
//! wrong one. Run it with the engine built without `std` (it is this
//! crate's example, not the engine's: the engine's examples build with its
//! dev-dependencies, whose `bbm-trace` feature turns `std` on):
//!
//! `cargo run -p s2mmu-nostd-check --example no_std_embedding`
//!
//! (with `std` on it runs the same, and says so; `S2MMU_REQUIRE_NOSTD=1`
//! makes that a failure, as CI sets it).

use core::sync::atomic::{AtomicU64, Ordering};
use s2mmu::format::arm64::{Arm64Stage2, Granule};
use s2mmu::memslot::{MemslotConfig, MemslotStore, SlotFlags, TreeMemslots, UserMemoryRegion};
use s2mmu::mmu::{FaultOutcome, Mmu, MmuPolicy};
use s2mmu::sync::{Clock, LockedPlatform, RawSpinRwLock};
use s2mmu::{Gpa, Hva, NoTlb, Prot};
use s2mmu_nostd_check::{Arena, ArenaMmOps, RawTicketLock};
use std::process::ExitCode;
use std::sync::Arc;

/// The embedding's platform: ticket-lock mutexes, the engine's spin
/// reader-writer lock, [`TickClock`], cells locked by ticket locks.
type KernelPlatform = LockedPlatform<RawTicketLock, RawSpinRwLock, TickClock>;

/// A clock that advances one nanosecond per reading, standing in for a
/// hypervisor's counter register (CNTPCT_EL0, the TSC).
#[derive(Debug, Clone, Copy)]
enum TickClock {}

static TICKS: AtomicU64 = AtomicU64::new(0);

impl Clock for TickClock {
    fn now_ns() -> Option<u64> {
        Some(TICKS.fetch_add(1, Ordering::Relaxed))
    }
}

/// Table pages for the stage 2: 512 pages (2 MiB), enough for a 40-bit
/// IPA space's tables over a few slots.
const PAGES: usize = 512;
static ARENA: Arena<PAGES> = Arena::new();

type KernelMmu = Mmu<Arm64Stage2, ArenaMmOps<PAGES>, TreeMemslots<KernelPlatform>, KernelPlatform>;

const GPA: u64 = 1 << 30;
/// Host (physical) addresses of the guest's RAM, recorded in the table and
/// never touched here.
const HPA: u64 = 0x8000_0000;

/// Why the example failed: the engine refused a call, or a result was
/// wrong. (Without `std` the engine's error is `core::fmt::Display`, not
/// `std::error::Error`.)
#[derive(Debug)]
enum Failure {
    Engine(s2mmu::Error),
    Wrong(&'static str),
}

impl From<s2mmu::Error> for Failure {
    fn from(e: s2mmu::Error) -> Self {
        Failure::Engine(e)
    }
}

impl core::fmt::Display for Failure {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Failure::Engine(e) => write!(f, "the engine refused: {e}"),
            Failure::Wrong(what) => write!(f, "wrong result: expected {what}"),
        }
    }
}

/// Fails the example with `what` unless `ok`.
fn check(ok: bool, what: &'static str) -> Result<(), Failure> {
    if ok {
        Ok(())
    } else {
        Err(Failure::Wrong(what))
    }
}

/// GET reports the two pages written (5 and 700) and CLEAR write-protects
/// them again.
fn check_harvest(m: &KernelMmu) -> Result<(), Failure> {
    let mut log = vec![0u64; 16];
    check(
        m.get_dirty_log(0, &mut log)? == 2,
        "GET reports the two pages",
    )?;
    check(
        log[0] == 1 << 5 && log[700 / 64] == 1 << (700 % 64),
        "the right two",
    )?;
    check(
        m.clear_dirty_log(0, 0, 1024, &log)? == 2,
        "CLEAR clears them",
    )?;
    let p5 = m
        .reader()
        .translate(GPA + 5 * 4096)
        .ok_or(Failure::Wrong("page 5 mapped"))?;
    check(!p5.prot.contains(Prot::W), "CLEAR write-protected page 5")?;
    Ok(())
}

fn run() -> Result<(), Failure> {
    let locks_before = RawTicketLock::taken_total();
    let slots = <TreeMemslots<KernelPlatform> as MemslotStore>::with_config(MemslotConfig {
        max_user_slots: 8,
        ..MemslotConfig::default()
    });
    let m: KernelMmu = Mmu::for_platform(
        Arm64Stage2::new(Granule::K4, 40)?,
        ArenaMmOps::new(&ARENA),
        Arc::new(NoTlb), // a kernel plugs its TLBI here (s2mmu::tlb::arm64)
        slots,
        MmuPolicy::default(),
    )?;
    let root_pages = ARENA.used_pages();

    // A 4 MiB slot backed by 2 MiB host pages: a write fault maps a block.
    let slot = |flags, size| UserMemoryRegion::new(0, flags, Gpa::new(GPA), size, Hva::new(HPA));
    m.set_memory_region(&slot(SlotFlags::NONE, 4 << 20), 2 << 20)?;
    let mut vcpu = m.new_vcpu()?;
    check(
        m.handle_fault(&mut vcpu, Gpa::new(GPA + 0x5000), true)? == FaultOutcome::Slow,
        "the first fault maps under the write lock",
    )?;
    let t = m
        .reader()
        .translate(GPA + 0x5000)
        .ok_or(Failure::Wrong("mapped"))?;
    check((t.pa, t.size) == (HPA + 0x5000, 2 << 20), "a 2 MiB block")?;
    check(
        ARENA.used_pages() > root_pages,
        "tables came from the arena",
    )?;

    // Logging on: the eager split breaks the block into write-protected
    // pages; two writes are logged (a relaxation and a new mapping).
    m.set_memory_region(&slot(SlotFlags::LOG_DIRTY_PAGES, 4 << 20), 2 << 20)?;
    let leaves = m.with_table(|pt| pt.leaves(GPA, 2 << 20))?;
    check(
        leaves.len() == 512 && leaves.iter().all(|l| l.size == 4096),
        "split into pages",
    )?;
    m.handle_fault(&mut vcpu, Gpa::new(GPA + 5 * 4096), true)?;
    m.handle_fault(&mut vcpu, Gpa::new(GPA + 700 * 4096), true)?;
    check_harvest(&m)?;

    // Deleting the slot unmaps it; dropping the MMU gives the tables back.
    m.set_memory_region(&slot(SlotFlags::NONE, 0), 2 << 20)?;
    check(m.reader().translate(GPA + 5 * 4096).is_none(), "unmapped")?;
    drop(vcpu);
    drop(m);
    check(
        ARENA.used_pages() == 0,
        "every table page went back to the arena",
    )?;
    check(
        RawTicketLock::taken_total() > locks_before,
        "the facade took the ticket locks",
    )?;
    check(
        TICKS.load(Ordering::Relaxed) > 0,
        "the facade read the clock",
    )?;
    Ok(())
}

fn main() -> ExitCode {
    if s2mmu::STD {
        println!("no_std_embedding: note: the engine was built with `std` (run with --no-default-features)");
        if std::env::var_os("S2MMU_REQUIRE_NOSTD").is_some() {
            eprintln!("no_std_embedding: FAILED: S2MMU_REQUIRE_NOSTD is set and s2mmu has `std`");
            return ExitCode::FAILURE;
        }
    }
    match run() {
        Ok(()) => {
            println!(
                "no_std_embedding: faults, split, GET, CLEAR and delete through the no_std platform: \
                 {} ticket locks taken, {} clock readings, every table page back in the arena",
                RawTicketLock::taken_total(),
                TICKS.load(Ordering::Relaxed)
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("no_std_embedding: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
