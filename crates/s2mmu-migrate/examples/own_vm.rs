//! A VMM's own VM live-migrated over TCP through the library's public API:
//! 16 MiB of guest RAM and a vCPU thread writing a counter into it and
//! marking its writes in a dirty bitmap (KVM's dirty log, for a real VMM).
//! The two ends share only the socket, as two processes would. It exits
//! nonzero unless every page the destination starts from hashes as the
//! paused source's and the vCPU goes on from its counter. `cargo run -p
//! s2mmu-migrate --example own_vm [-- --lose-writes]` (page 0's dirty marks
//! dropped: the migration must fail).

#![allow(unsafe_code)] // GuestRam is an unsafe trait: the library reads and writes it

use s2mmu::format::arm64::Arm64Stage2;
use s2mmu::format::FormatId;
use s2mmu_migrate::session::dest::{serve_with, DestConfig, DestFactory, DestGuest, ResumedGuest};
use s2mmu_migrate::session::guest::{GuestShape, NoHook, SourceGuest};
use s2mmu_migrate::session::source::{run_source, SourceConfig};
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::transport::{self, NetConfig};
use s2mmu_migrate::vm::{GuestCounters, GuestRam, GuestRun, RamSlot, SessionVm, VmError};
use s2mmu_migrate::wire::Header;
use std::hash::{DefaultHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const MEM: u64 = 16 << 20;
const PAGE: u64 = 4096;

/// Guest RAM: one allocation of 8-byte words, only ever accessed atomically.
struct Ram(Box<[AtomicU64]>);

// SAFETY: `host_span` names the rest of one live allocation of `size()`
// bytes (a multiple of the page size), 8-byte aligned, owned by the value,
// and every access (the library's and the vCPU thread's) is an atomic word
// access. (A VMM with several mappings answers with `RamRegions`; the
// library's word copies `read_into`/`write_from` are the trait's own.)
unsafe impl GuestRam for Ram {
    fn size(&self) -> u64 {
        self.0.len() as u64 * 8
    }
    fn host_span(&self, offset: u64) -> Option<(u64, u64)> {
        (offset < self.size()).then(|| (self.0.as_ptr() as u64 + offset, self.size() - offset))
    }
}

/// The VM: its RAM as one memslot, and the slot's dirty bitmap.
struct Vm {
    ram: Arc<Ram>,
    slots: Vec<RamSlot>,
    dirty: Box<[AtomicU64]>,
    /// Drop page 0's marks (`--lose-writes`).
    lose: bool,
}

impl Vm {
    fn new(size: u64, gpa: u64, lose: bool) -> Arc<Vm> {
        let words = |n: u64| (0..n).map(|_| AtomicU64::new(0)).collect();
        Arc::new(Vm {
            ram: Arc::new(Ram(words(size / 8))),
            slots: vec![RamSlot {
                id: 0,
                gpa,
                size,
                mem_offset: 0,
            }],
            dirty: words((size / PAGE).div_ceil(64)),
            lose,
        })
    }

    /// The vCPU's store into `page`, and its dirty mark.
    fn write(&self, page: u64, value: u64) {
        self.ram.0[(page * PAGE / 8) as usize].store(value, SeqCst);
        if !(self.lose && page == 0) {
            self.dirty[(page / 64) as usize].fetch_or(1 << (page % 64), SeqCst);
        }
    }

    /// A hash of every page, in order.
    fn page_hashes(&self) -> Vec<u64> {
        let hash = |page: &[AtomicU64]| {
            let mut h = DefaultHasher::new();
            page.iter().for_each(|w| h.write_u64(w.load(SeqCst)));
            h.finish()
        };
        self.ram.0.chunks(PAGE as usize / 8).map(hash).collect()
    }
}

impl SessionVm for Vm {
    type Ram = Ram;
    fn ram(&self) -> &Arc<Ram> {
        &self.ram
    }
    fn slots(&self) -> &[RamSlot] {
        &self.slots
    }
    fn enable_dirty_logging(&self) -> Result<(), VmError> {
        self.dirty.iter().for_each(|w| w.store(0, SeqCst)); // round 0 sends all
        Ok(())
    }
    fn disable_dirty_logging(&self) -> Result<(), VmError> {
        Ok(())
    }
    fn get_dirty_log(&self, slot: u16, bitmap: &mut [u64]) -> Result<(), VmError> {
        if slot != 0 || bitmap.len() < self.dirty.len() {
            return Err(VmError::new(format!("slot {slot}, or a short bitmap")));
        }
        for (w, d) in bitmap.iter_mut().zip(&self.dirty) {
            *w |= d.swap(0, SeqCst); // GET takes the marks: CLEAR has nothing to do
        }
        Ok(())
    }
    fn clear_dirty_log(&self, _: u16, _: u64, _: u64, _: &[u64]) -> Result<(), VmError> {
        Ok(())
    }
}

/// The vCPU: a thread writing counter `n` to pages 0 and `n * 7 % pages`.
struct Vcpu {
    vm: Arc<Vm>,
    paused: Arc<Mutex<bool>>,
    counter: Arc<AtomicU64>,
}

fn start_vcpu(vm: Arc<Vm>, from: u64) -> Vcpu {
    let (paused, counter) = (Arc::new(Mutex::new(false)), Arc::new(AtomicU64::new(from)));
    let (vm2, p2, c2) = (vm.clone(), paused.clone(), counter.clone());
    std::thread::spawn(move || {
        // Runs while a handle (`counter`) lives.
        while Arc::strong_count(&c2) > 1 {
            let p = p2.lock().expect("not poisoned");
            if !*p {
                let n = c2.load(SeqCst) + 1;
                vm2.write(0, n); // the last value, as a kernel's clock page
                vm2.write(n * 7 % (vm2.ram.size() / PAGE), n);
                c2.store(n, SeqCst);
            }
            drop(p);
            std::thread::sleep(Duration::from_micros(100));
        }
    });
    Vcpu {
        vm,
        paused,
        counter,
    }
}

impl GuestRun for Vcpu {
    fn pause(&self) {
        *self.paused.lock().expect("not poisoned") = true; // waits out a store in flight
    }
    fn resume(&self) {
        *self.paused.lock().expect("not poisoned") = false;
    }
    fn counters(&self) -> GuestCounters {
        GuestCounters::default() // writes and time in guest code: 0, unknown here
    }
    fn set_throttle_ns(&self, _: u64) {}
    fn pace(&self) -> u64 {
        0
    }
    fn set_pace(&self, _: u64) {}
}

impl SourceGuest for Vcpu {
    type Vm = Vm;
    type Hook = NoHook;
    fn vm(&self) -> &Arc<Vm> {
        &self.vm
    }
    fn shape(&self) -> GuestShape {
        let (format, backing) = (FormatId::of::<Arm64Stage2>(), "anonymous".into());
        GuestShape {
            mem_size: MEM,
            slots: 1,
            vcpus: 1,
            backing,
            format,
        }
    }
    fn counter_source(&self) -> Arc<dyn Fn() -> GuestCounters + Send + Sync> {
        Arc::new(GuestCounters::default)
    }
    fn state(&self, _pace: u64) -> Result<Vec<u8>, MigrateError> {
        Ok(self.final_state()) // the vCPU's state: its counter
    }
    fn begin_hook(&self) -> Result<NoHook, MigrateError> {
        Ok(NoHook)
    }
}

impl ResumedGuest for Vcpu {
    fn final_state(&self) -> Vec<u8> {
        self.counter.load(SeqCst).to_le_bytes().to_vec()
    }
    fn progress(&self) -> Vec<u64> {
        vec![self.counter.load(SeqCst)]
    }
}

/// What the destination's vCPU started from: the page hashes, the counter.
type Started = Arc<Mutex<Option<(Vec<u64>, u64)>>>;
/// The destination's side: a VM as the header describes, filled by the stream.
struct Factory(Started);
struct Blank(Arc<Vm>, Started);

impl DestFactory for Factory {
    type Guest = Blank;
    fn build(&self, h: &Header) -> Result<Blank, MigrateError> {
        if h.slots != 1 || h.vcpus != 1 || h.mem_size != MEM {
            return Err(MigrateError::Setup(format!("not this VM's shape: {h:?}")));
        }
        let vm = Vm::new(h.mem_size, h.gpa_base, false);
        Ok(Blank(vm, self.0.clone()))
    }
}

impl DestGuest for Blank {
    type Vm = Vm;
    type State = u64;
    type Running = Vcpu;
    fn vm(&self) -> &Arc<Vm> {
        &self.0
    }
    fn decode_state(&self, body: &[u8], _: &Header, _: u64) -> Result<u64, MigrateError> {
        let why = format!("{} bytes, not 8", body.len());
        let b = <[u8; 8]>::try_from(body).map_err(|_| MigrateError::BadState { why });
        Ok(u64::from_le_bytes(b?))
    }
    fn start(&self, counter: &u64) -> Result<Vcpu, MigrateError> {
        *self.1.lock().expect("not poisoned") = Some((self.0.page_hashes(), *counter));
        Ok(start_vcpu(self.0.clone(), *counter))
    }
}

fn main() -> Result<(), String> {
    let lose = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--lose-writes") => true,
        Some(a) => return Err(format!("{a}: the only option is --lose-writes")),
    };
    let guest = start_vcpu(Vm::new(MEM, 1 << 30, lose), 0);
    std::thread::sleep(Duration::from_millis(100)); // the guest runs before the migration
    let net = NetConfig::plain(Duration::from_secs(10));
    let listener = transport::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = listener.local();
    let started: Started = Arc::default();
    let (dest_net, factory) = (net.clone(), Factory(started.clone()));
    let cfg = DestConfig::with_run_after(Duration::from_millis(200));
    let dest = std::thread::spawn(move || serve_with(&*listener, &factory, &cfg, &dest_net));
    let src = run_source(&guest, &SourceConfig::default(), &mut |_| {
        transport::client(transport::connect(&addr, &net)?, &net)
    });
    let dst = dest.join().map_err(|_| "the destination thread panicked")?;
    let dst = dst.map_err(|e| format!("destination: {e}"))?;
    let src = src.map_err(|e| format!("source: {e}"))?;
    guest.pause(); // it stays paused after a migration; hashed as it stopped
    let started = started.lock().expect("not poisoned").take();
    let (hashes, from) = started.ok_or("the destination never started")?;
    let here = guest.vm.page_hashes();
    let differ = here.iter().zip(&hashes).filter(|(a, b)| a != b).count();
    let (stopped_at, went_on) = (
        guest.counter.load(SeqCst),
        dst.resumed_progress.first().copied().unwrap_or(0),
    );
    let (rounds, ms) = (src.rounds.len(), src.downtime.as_secs_f64() * 1e3);
    println!(
        "own_vm: {rounds} rounds, downtime {ms:.2} ms; {} pages, {differ} differ; counter \
         {stopped_at} on the source, resumed at {from}, {went_on} when the destination stopped",
        hashes.len()
    );
    if differ != 0 || from != stopped_at || went_on <= from {
        return Err("the destination is not where the source stopped, or did not go on".into());
    }
    Ok(())
}
