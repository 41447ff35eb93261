//! The session's source over a VM that is not the simulated one: a plain
//! array of words with a dirty log of its own and a writer thread as its
//! guest, migrated to the (simulated) destination over loopback TCP. The
//! memories must agree by digest; a write the log does not report must
//! make the migration fail by name (so the check can fail). A migration
//! that fails before the switch (its STATE unreadable here, or refused
//! there) must leave the guest running here with dirty logging off.

mod common;

use common::{over_loopback, Digests, Words};
use s2mmu::format::arm64::Arm64Stage2;
use s2mmu::format::FormatId;
use s2mmu::mmu::MmuPolicy;
use s2mmu_migrate::session::dest::DestOutcome;
use s2mmu_migrate::session::guest::{GuestShape, NoHook, SourceGuest};
use s2mmu_migrate::session::source::{SourceConfig, SourceOutcome};
use s2mmu_migrate::sim::dest::SimDestConfig;
use s2mmu_migrate::sim::state::GuestState;
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::vm::{GuestCounters, GuestRun, RamSlot, SessionVm, VmError};
use s2mmu_vm::VcpuState;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const MEM: u64 = 4 << 20;
const PAGE: u64 = 4096;

/// The VM: its RAM, one slot, a dirty bitmap the writer sets and GET
/// takes. Each GET also writes a page itself, as a write racing with the
/// harvest (a device's, say), and logs it unless `lose_writes`.
struct PlainVm {
    ram: Arc<Words>,
    slots: Vec<RamSlot>,
    dirty: Vec<AtomicU64>,
    logging: AtomicBool,
    lose_writes: bool,
    gets: AtomicU64,
}

impl SessionVm for PlainVm {
    type Ram = Words;
    fn ram(&self) -> &Arc<Words> {
        &self.ram
    }
    fn slots(&self) -> &[RamSlot] {
        &self.slots
    }
    fn enable_dirty_logging(&self) -> Result<(), VmError> {
        self.logging.store(true, Ordering::SeqCst);
        Ok(())
    }
    fn disable_dirty_logging(&self) -> Result<(), VmError> {
        self.logging.store(false, Ordering::SeqCst);
        Ok(())
    }
    fn get_dirty_log(&self, slot: u16, bitmap: &mut [u64]) -> Result<(), VmError> {
        if slot != 0 || bitmap.len() < self.dirty.len() {
            return Err(VmError::new("no such slot, or a short bitmap"));
        }
        let n = self.gets.fetch_add(1, Ordering::SeqCst);
        let page = (n * 13 + 5) % (MEM / PAGE);
        self.ram.0[(page * PAGE / 8) as usize].store(!n, Ordering::Relaxed);
        if !self.lose_writes {
            self.dirty[(page / 64) as usize].fetch_or(1 << (page % 64), Ordering::SeqCst);
        }
        for (w, d) in bitmap.iter_mut().zip(&self.dirty) {
            *w |= d.swap(0, Ordering::SeqCst);
        }
        Ok(())
    }
    fn clear_dirty_log(&self, _: u16, _: u64, _: u64, _: &[u64]) -> Result<(), VmError> {
        // GET took the bits already: nothing to re-arm.
        Ok(())
    }
}

/// The guest: a thread writing a counter into page after page.
struct Guest {
    vm: Arc<PlainVm>,
    paused: Arc<Mutex<bool>>,
    writes: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    fault: StateFault,
}

/// A fault in the guest's STATE, to fail a migration before the switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StateFault {
    /// None: the state the destination resumes.
    None,
    /// Reading it fails here (the source's own error).
    Unreadable,
    /// Bytes the destination cannot decode (its refusal).
    Garbage,
}

impl Guest {
    fn start(lose_writes: bool) -> Guest {
        let vm = Arc::new(PlainVm {
            ram: Arc::new(Words::filled(MEM, |i| i)),
            slots: vec![RamSlot {
                id: 0,
                gpa: 1 << 32,
                size: MEM,
                mem_offset: 0,
            }],
            dirty: (0..(MEM / PAGE).div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            logging: AtomicBool::new(false),
            lose_writes,
            gets: AtomicU64::new(0),
        });
        let g = Guest {
            vm,
            paused: Arc::new(Mutex::new(false)),
            writes: Arc::new(AtomicU64::new(0)),
            stop: Arc::new(AtomicBool::new(false)),
            fault: StateFault::None,
        };
        let (vm, paused, writes, stop) = (
            g.vm.clone(),
            g.paused.clone(),
            g.writes.clone(),
            g.stop.clone(),
        );
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                {
                    let p = paused.lock().unwrap();
                    if !*p {
                        let page = (n * 7) % (MEM / PAGE);
                        vm.ram.0[(page * PAGE / 8) as usize].store(n, Ordering::Relaxed);
                        vm.dirty[(page / 64) as usize].fetch_or(1 << (page % 64), Ordering::SeqCst);
                        writes.fetch_add(1, Ordering::Relaxed);
                        n += 1;
                    }
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        g
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl GuestRun for Guest {
    fn pause(&self) {
        // Taking the lock waits out a write in flight.
        *self.paused.lock().unwrap() = true;
    }
    fn resume(&self) {
        *self.paused.lock().unwrap() = false;
    }
    fn counters(&self) -> GuestCounters {
        GuestCounters {
            writes: self.writes.load(Ordering::Relaxed),
            guest_ns: 0,
        }
    }
    fn set_throttle_ns(&self, _: u64) {}
    fn pace(&self) -> u64 {
        0
    }
    fn set_pace(&self, _: u64) {}
}

impl SourceGuest for Guest {
    type Vm = PlainVm;
    type Hook = NoHook;
    fn vm(&self) -> &Arc<PlainVm> {
        &self.vm
    }
    fn shape(&self) -> GuestShape {
        GuestShape {
            mem_size: MEM,
            slots: 1,
            vcpus: 1,
            backing: "anonymous".into(),
            format: FormatId::of::<s2mmu::format::arm64::Arm64Stage2>(),
        }
    }
    fn counter_source(&self) -> Arc<dyn Fn() -> GuestCounters + Send + Sync> {
        let w = self.writes.clone();
        Arc::new(move || GuestCounters {
            writes: w.load(Ordering::Relaxed),
            guest_ns: 0,
        })
    }
    fn state(&self, _pace: u64) -> Result<Vec<u8>, MigrateError> {
        match self.fault {
            StateFault::None => {}
            StateFault::Unreadable => {
                return Err(MigrateError::Setup("vCPU 0's state cannot be read".into()))
            }
            StateFault::Garbage => return Ok(vec![0xa5; 64]),
        }
        // What the simulated destination resumes: one vCPU at the start
        // of its region (it runs on there for the test's 50 ms).
        Ok(GuestState {
            bytes_per_vcpu: MEM,
            write_percent: 100,
            pattern: 0,
            pace_pages_per_sec: 1000,
            vcpus: vec![VcpuState {
                pass: 1,
                next_page: 0,
                rng: 1,
                writes: 0,
            }],
        }
        .encode())
    }
    fn begin_hook(&self) -> Result<NoHook, MigrateError> {
        Ok(NoHook)
    }
}

type Ends = (
    Result<SourceOutcome, MigrateError>,
    Result<DestOutcome, MigrateError>,
);

/// Migrates `guest` to a simulated destination over loopback TCP.
fn run_pair(guest: &Guest) -> Ends {
    let mut dest_cfg = SimDestConfig::new(MmuPolicy::default(), Duration::from_millis(50));
    dest_cfg.dest.prefault = false;
    let cfg = SourceConfig {
        warmup: Duration::from_millis(50),
        clear_chunk: 1 << 20,
        max_downtime: Duration::from_millis(300),
        ..SourceConfig::default()
    };
    let factory = dest_cfg.factory::<Arm64Stage2>();
    let (dst, src) = over_loopback(&dest_cfg.dest, factory, guest, &cfg);
    (src, dst)
}

/// The source's and the destination's digests at the switch.
fn migrate(lose_writes: bool) -> Result<(Digests, Digests), MigrateError> {
    let guest = Guest::start(lose_writes);
    let (src, dst) = run_pair(&guest);
    let s = src?;
    let d = dst?;
    assert!(s.rounds.len() >= 2, "round 0 and the stop-and-copy");
    assert!(d.resumed_at.is_some());
    assert!(
        !guest.vm.logging.load(Ordering::SeqCst),
        "logging ended with the migration"
    );
    Ok((s.slot_digests, d.slot_digests))
}

#[test]
fn a_vm_that_is_not_the_simulated_one_migrates_through_the_session() {
    let (src, dst) = migrate(false).expect("the migration succeeds");
    assert_eq!(src.len(), 1);
    assert_eq!(src, dst, "the memories agree at the switch");
}

#[test]
fn a_write_its_dirty_log_loses_fails_the_migration_by_name() {
    match migrate(true) {
        Err(MigrateError::MemoryMismatch { slot: 0, .. }) => {}
        other => panic!("expected the digests to differ, got {other:?}"),
    }
}

/// A migration that fails after pre-copy, with the vCPUs paused for the
/// stop-and-copy (the STATE unreadable here, or refused by the
/// destination), leaves the guest running here, unlogged.
#[test]
fn a_migration_failed_before_the_switch_stops_dirty_logging() {
    for fault in [StateFault::Unreadable, StateFault::Garbage] {
        let mut guest = Guest::start(false);
        guest.fault = fault;
        let (src, dst) = run_pair(&guest);
        let e = src.expect_err("the migration fails");
        eprintln!("{fault:?}: source {e}; destination {dst:?}");
        assert!(dst.is_err(), "{fault:?}: the destination did not resume");
        assert!(
            !guest.vm.logging.load(Ordering::SeqCst),
            "{fault:?}: dirty logging left on after the failed migration ({e})"
        );
        // Until the guest writes again (a fixed 50 ms needed its thread
        // scheduled within it); a guest left paused fails after 60 s.
        let w0 = guest.writes.load(Ordering::Relaxed);
        let t0 = std::time::Instant::now();
        while guest.writes.load(Ordering::Relaxed) <= w0 {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{fault:?}: the guest runs on here"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
