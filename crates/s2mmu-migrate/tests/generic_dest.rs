//! The session's destination into a VM that is not the simulated one: a
//! plain array of words built from the HEADER by the test's own factory,
//! its own STATE check and a writer thread as the resumed guest. The
//! simulated source migrates into it over loopback TCP: the memory the
//! guest starts from must be the source's (by digest, computed over the
//! test VM's own RAM), and a factory that maps guest memory at the wrong
//! address must make the migration fail by name (so the check can fail).

mod common;

use common::{over_loopback, Digests, Words};
use s2mmu::format::arm64::Arm64Stage2;
use s2mmu_migrate::session::dest::{DestConfig, DestFactory, DestGuest, DestOutcome, ResumedGuest};
use s2mmu_migrate::session::digests::source_digests;
use s2mmu_migrate::session::source::SourceOutcome;
use s2mmu_migrate::sim::source::{SimGuestConfig, SimRun, SimSource};
use s2mmu_migrate::sim::state::{encode_vcpus, GuestState};
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::vm::{GuestCounters, GuestRam, GuestRun, RamSlot, SessionVm, VmError};
use s2mmu_migrate::wire::{Header, PAGE_SIZE};
use s2mmu_vm::{Backing, VcpuState};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const MEM: u64 = 8 << 20;

/// The destination VM: its RAM and one slot; it logs nothing.
struct PlainVm {
    ram: Arc<Words>,
    slots: Vec<RamSlot>,
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
        Ok(())
    }
    fn disable_dirty_logging(&self) -> Result<(), VmError> {
        Ok(())
    }
    fn get_dirty_log(&self, _: u16, _: &mut [u64]) -> Result<(), VmError> {
        Err(VmError::new("the destination logs nothing"))
    }
    fn clear_dirty_log(&self, _: u16, _: u64, _: u64, _: &[u64]) -> Result<(), VmError> {
        Err(VmError::new("the destination logs nothing"))
    }
}

/// Builds a [`PlainGuest`] from the header; `gpa_shift` moves its slot
/// away from the header's address (a broken factory).
struct PlainFactory {
    gpa_shift: u64,
    /// The digests of the memory the guest started from.
    started_from: Arc<Mutex<Option<Digests>>>,
}

struct PlainGuest {
    vm: Arc<PlainVm>,
    started_from: Arc<Mutex<Option<Digests>>>,
}

impl DestFactory for PlainFactory {
    type Guest = PlainGuest;
    fn build(&self, h: &Header) -> Result<PlainGuest, MigrateError> {
        if h.slots != 1 || !h.mem_size.is_multiple_of(PAGE_SIZE as u64) {
            return Err(MigrateError::Setup("one slot of whole pages only".into()));
        }
        let slot = RamSlot {
            id: 0,
            gpa: h.gpa_base + self.gpa_shift,
            size: h.mem_size,
            mem_offset: 0,
        };
        Ok(PlainGuest {
            vm: Arc::new(PlainVm {
                ram: Arc::new(Words::filled(h.mem_size, |_| 0)),
                slots: vec![slot],
            }),
            started_from: self.started_from.clone(),
        })
    }
}

impl DestGuest for PlainGuest {
    type Vm = PlainVm;
    type State = GuestState;
    type Running = Writer;
    fn vm(&self) -> &Arc<PlainVm> {
        &self.vm
    }
    fn decode_state(&self, body: &[u8], h: &Header, at: u64) -> Result<GuestState, MigrateError> {
        let s = GuestState::decode(body, at)?;
        if s.vcpus.len() as u64 != u64::from(h.vcpus) {
            return Err(MigrateError::BadState {
                why: format!("{} vCPUs, the header says {}", s.vcpus.len(), h.vcpus),
            });
        }
        Ok(s)
    }
    fn start(&self, s: &GuestState) -> Result<Writer, MigrateError> {
        *self.started_from.lock().unwrap() = Some(source_digests(&*self.vm));
        Ok(Writer::start(self.vm.clone(), s.vcpus.clone()))
    }
}

/// The resumed guest: a thread writing a counter into page after page.
struct Writer {
    vcpus: Vec<VcpuState>,
    paused: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    writes: Arc<AtomicU64>,
}

impl Writer {
    fn start(vm: Arc<PlainVm>, vcpus: Vec<VcpuState>) -> Writer {
        let w = Writer {
            vcpus,
            paused: Arc::default(),
            stop: Arc::default(),
            writes: Arc::default(),
        };
        let (paused, stop, writes) = (w.paused.clone(), w.stop.clone(), w.writes.clone());
        std::thread::spawn(move || {
            let pages = vm.ram.size() / PAGE_SIZE as u64;
            while !stop.load(Ordering::SeqCst) {
                if !paused.load(Ordering::SeqCst) {
                    let n = writes.fetch_add(1, Ordering::SeqCst);
                    let off = (n % pages) * PAGE_SIZE as u64;
                    vm.ram.write_from(off, &n.to_le_bytes());
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        w
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl GuestRun for Writer {
    fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
    }
    fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
    }
    fn counters(&self) -> GuestCounters {
        GuestCounters {
            writes: self.writes.load(Ordering::SeqCst),
            guest_ns: 0,
        }
    }
    fn set_throttle_ns(&self, _: u64) {}
    fn pace(&self) -> u64 {
        0
    }
    fn set_pace(&self, _: u64) {}
}

impl ResumedGuest for Writer {
    fn final_state(&self) -> Vec<u8> {
        encode_vcpus(&self.vcpus)
    }
    fn progress(&self) -> Vec<u64> {
        self.vcpus.iter().map(|v| v.pass).collect()
    }
}

/// Migrates a small simulated guest into the factory's guest.
fn migrate(factory: PlainFactory) -> Result<(SourceOutcome, DestOutcome), MigrateError> {
    // 500 ms of the resumed guest (50 before): its writer thread, waking
    // every 200 µs, must run within it for "the resumed guest ran".
    let dest_cfg = DestConfig::with_run_after(Duration::from_millis(500));
    let run = SimRun::default().with(|g, s| {
        *g = SimGuestConfig {
            mem_size: MEM,
            vcpus: 1,
            backing: Backing::Anonymous,
            dirty_rate: 4 << 20,
            ..SimGuestConfig::default()
        };
        s.warmup = Duration::from_millis(50);
        s.max_downtime = Duration::from_millis(300);
    });
    let guest = SimSource::<Arm64Stage2>::start(&run.guest, &run.session)?;
    let (dst, src) = over_loopback(&dest_cfg, factory, &guest, &run.session);
    // The destination's error first: it names what broke.
    let d = dst?;
    Ok((src?, d))
}

#[test]
fn the_destination_resumes_a_vm_that_is_not_the_simulated_one() {
    let started_from = Arc::new(Mutex::new(None));
    let (s, d) = migrate(PlainFactory {
        gpa_shift: 0,
        started_from: started_from.clone(),
    })
    .expect("the migration succeeds");
    assert_eq!(s.slot_digests.len(), 1);
    assert_eq!(s.slot_digests, d.slot_digests, "the stream's digests agree");
    let own = started_from.lock().unwrap().clone();
    assert_eq!(
        own.as_ref(),
        Some(&s.slot_digests),
        "the test VM's own RAM held the source's memory when it started"
    );
    assert_eq!(d.resumed_progress.len(), 1, "one vCPU resumed");
    assert!(d.resumed_write_rate > 0.0, "the resumed guest ran");
}

#[test]
fn a_factory_that_maps_memory_elsewhere_fails_the_migration_by_name() {
    let started_from = Arc::new(Mutex::new(None));
    let r = migrate(PlainFactory {
        gpa_shift: 1 << 40,
        started_from: started_from.clone(),
    });
    match r {
        Err(MigrateError::PageOutOfRange { .. }) => {}
        Err(e) => panic!("expected a page out of range, got {e}"),
        Ok(_) => panic!("expected a page out of range, the migration succeeded"),
    }
    assert!(started_from.lock().unwrap().is_none(), "never started");
}
