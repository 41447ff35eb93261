//! A hypervisor's vCPU loop on the engine, with dirty logging and a harvest
//! thread: what a live migration's source does.
//!
//! Two vCPU threads run a guest that writes pseudo-random words all over
//! 64 MiB of guest RAM. A vCPU "runs" by translating each guest-physical
//! address through the stage-2 table (the lockless `TableReader`, as the
//! hardware walks it) and storing into the host page it maps; a missing
//! or read-only mapping is a stage-2 fault, which the loop hands to
//! `Mmu::handle_fault` before it retries the access, as KVM's
//! `kvm_handle_guest_abort` does.
//!
//! The harvest thread copies the whole RAM once logging is on (pre-copy's
//! round 0), then every few milliseconds takes the dirty log (GET, then
//! CLEAR, which write-protects the harvested pages) and copies the pages
//! it names. When the vCPUs stop, a last round copies what is left, and
//! the copy must equal the guest's RAM byte for byte: a write the log
//! missed would leave a stale page behind. The example exits nonzero then.
//!
//! The TLB: a vCPU's translation can outlive a CLEAR that protects its
//! page, as a TLB entry outlives a descriptor write. `GuestTlb` is the
//! hypervisor's invalidation: it waits until every vCPU that was inside
//! the guest when the flush started has left it (a TLBI with its DSB), so
//! once CLEAR returns, no vCPU writes through a stale writable entry.
//!
//! Run: `cargo run -p s2mmu --example vcpu_loop`. With `--lose-marks N`
//! the MMU drops N dirty marks on purpose (`Mmu::inject_lost_marks`), and
//! the check must then fail: it is how CI shows that it can.

use s2mmu::format::arm64::{Arm64Stage2, Granule};
use s2mmu::memslot::{SlotFlags, TreeMemslots, UserMemoryRegion};
use s2mmu::mmu::{Mmu, MmuPolicy};
use s2mmu::tlb::TlbInvalidate;
use s2mmu::{Gpa, HostMmOps, Hva, Prot};
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::process::ExitCode;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const GPA_BASE: u64 = 1 << 30;
const RAM: usize = 64 << 20;
const PAGE: usize = 4096;
const NPAGES: usize = RAM / PAGE;
const VCPUS: usize = 2;
const WRITES_PER_VCPU: u64 = 400_000;

/// Guest RAM: host memory, 2 MiB aligned so the slot can be mapped with
/// blocks before logging starts, read and written as words so that a vCPU
/// and the harvest thread may touch it at once.
struct Ram {
    ptr: *mut AtomicU64,
    layout: Layout,
}

// SAFETY: the memory is only ever accessed through `AtomicU64`s.
unsafe impl Send for Ram {}
// SAFETY: as above.
unsafe impl Sync for Ram {}

impl Ram {
    fn new(bytes: usize) -> Ram {
        let layout = Layout::from_size_align(bytes, 2 << 20).expect("layout");
        // SAFETY: the layout has a nonzero size.
        let ptr = unsafe { alloc_zeroed(layout) } as *mut AtomicU64;
        assert!(!ptr.is_null(), "out of memory for guest RAM");
        Ram { ptr, layout }
    }
    fn words(&self) -> &[AtomicU64] {
        // SAFETY: `ptr` holds `layout.size()` zeroed bytes, 8-aligned, alive
        // as long as `self`; AtomicU64 has u64's layout.
        unsafe { std::slice::from_raw_parts(self.ptr, self.layout.size() / 8) }
    }
    fn hva(&self) -> u64 {
        self.ptr as u64
    }
}

impl Drop for Ram {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr as *mut u8, self.layout) }
    }
}

/// The hypervisor's TLB invalidation: each vCPU's `in_guest` counter is odd
/// while it runs guest code; a flush waits for every odd one to move on.
struct GuestTlb {
    in_guest: Vec<AtomicU64>,
    flushes: AtomicU64,
}

impl GuestTlb {
    fn wait_for_vcpus(&self) {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        // Orders the engine's descriptor writes before the reads below; the
        // vCPU's fence orders its entry before its walk.
        fence(Ordering::SeqCst);
        for c in &self.in_guest {
            let seen = c.load(Ordering::SeqCst);
            if seen % 2 == 1 {
                while c.load(Ordering::SeqCst) == seen {
                    std::hint::spin_loop();
                }
            }
        }
    }
}

impl TlbInvalidate for GuestTlb {
    fn flush_ipa(&self, _ipa: u64, _level: Option<u32>) {
        self.wait_for_vcpus();
    }
    fn flush_range(&self, _ipa: u64, _size: u64) {
        self.wait_for_vcpus();
    }
    fn flush_vmid(&self) {
        self.wait_for_vcpus();
    }
}

type Vm = Mmu<Arm64Stage2, HostMmOps, TreeMemslots>;

/// One vCPU: the guest's writes, each through the stage-2 table, faults
/// handed to the MMU. Returns the number of stage-2 faults it took. It
/// starts writing once logging is on (or after 10 s), so its writes always
/// race with the harvests however the threads are scheduled: on a loaded
/// machine they could otherwise all finish before the harvest thread ran.
fn run_vcpu(
    mmu: &Vm,
    tlb: &GuestTlb,
    ram: &Ram,
    id: usize,
    logging: &AtomicBool,
) -> Result<u64, s2mmu::Error> {
    let waited = Instant::now();
    while !logging.load(Ordering::Acquire) && waited.elapsed() < Duration::from_secs(10) {
        std::thread::yield_now();
    }
    let mut vcpu = mmu.new_vcpu()?;
    let reader = mmu.reader();
    let mut faults = 0;
    let mut x = 0x9e37_79b9_7f4a_7c15_u64 ^ ((id as u64) << 32);
    for n in 0..WRITES_PER_VCPU {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let gpa = GPA_BASE + (x % (RAM as u64 / 8)) * 8;
        let value = ((id as u64) << 56) | n;
        loop {
            let in_guest = &tlb.in_guest[id];
            in_guest.fetch_add(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            let hit = reader
                .translate(gpa)
                .filter(|t| t.prot.contains(Prot::W))
                .map(|t| {
                    let word = (t.pa - ram.hva()) as usize / 8;
                    ram.words()[word].store(value, Ordering::Relaxed);
                });
            in_guest.fetch_add(1, Ordering::SeqCst);
            if hit.is_some() {
                break;
            }
            // A stage-2 permission or translation fault: exit to the host.
            faults += 1;
            mmu.handle_fault(&mut vcpu, Gpa::new(gpa), true)?;
        }
    }
    Ok(faults)
}

/// Copies the pages set in `log` from the guest's RAM into `copy`.
fn copy_pages(ram: &Ram, copy: &mut [u64], log: &[u64]) -> u64 {
    let words = ram.words();
    let mut n = 0;
    for page in (0..NPAGES).filter(|p| log[p / 64] & (1 << (p % 64)) != 0) {
        let r = page * PAGE / 8..(page + 1) * PAGE / 8;
        for (dst, src) in copy[r.clone()].iter_mut().zip(&words[r]) {
            *dst = src.load(Ordering::Relaxed);
        }
        n += 1;
    }
    n
}

/// One harvest: GET, CLEAR (protects the pages, the TLB waits for the
/// vCPUs), then the copy. Returns the pages copied.
fn harvest(mmu: &Vm, ram: &Ram, copy: &mut [u64]) -> Result<u64, s2mmu::Error> {
    let mut log = vec![0u64; NPAGES / 64];
    mmu.get_dirty_log(0, &mut log)?;
    mmu.clear_dirty_log(0, 0, NPAGES as u64, &log)?;
    Ok(copy_pages(ram, copy, &log))
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vcpu_loop: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--lose-marks N`: dirty marks to drop on purpose (the run must then
/// fail); no argument: none.
fn lose_marks_flag() -> Result<Option<u64>, String> {
    let args: Vec<String> = std::env::args().collect();
    match &args[..] {
        [_] => Ok(None),
        [_, flag, n] if flag == "--lose-marks" => n
            .parse::<u64>()
            .map(Some)
            .map_err(|e| format!("{flag} {n}: {e}")),
        [_, flag, ..] => Err(format!("unknown argument {flag} (only --lose-marks N)")),
        [] => Ok(None),
    }
}

/// The pages whose copy differs from the guest's RAM.
fn stale_pages(ram: &Ram, copy: &[u64]) -> std::collections::BTreeSet<usize> {
    ram.words()
        .iter()
        .zip(copy)
        .enumerate()
        .filter(|(_, (r, c))| r.load(Ordering::Relaxed) != **c)
        .map(|(i, _)| i * 8 / PAGE)
        .collect()
}

/// The engine over 4 KiB stage-2 pages in host memory, with the example's
/// TLB, and `--lose-marks` applied.
fn new_mmu(tlb: Arc<GuestTlb>) -> Result<Vm, String> {
    let mmu = Mmu::new(
        Arm64Stage2::new(Granule::K4, 40).map_err(|e| e.to_string())?,
        HostMmOps::new(PAGE).map_err(|e| e.to_string())?,
        tlb,
        TreeMemslots::new(),
        MmuPolicy::default(), // GET + CLEAR (manual protect), eager split
    )
    .map_err(|e| e.to_string())?;
    if let Some(n) = lose_marks_flag()? {
        mmu.inject_lost_marks(n);
    }
    Ok(mmu)
}

/// The one memslot: all of the guest's RAM at `GPA_BASE`.
fn slot_region(ram: &Ram, flags: SlotFlags) -> UserMemoryRegion {
    UserMemoryRegion::new(
        0,
        flags,
        Gpa::new(GPA_BASE),
        RAM as u64,
        Hva::new(ram.hva()),
    )
}

fn run() -> Result<(), String> {
    let ram = Ram::new(RAM);
    let tlb = Arc::new(GuestTlb {
        in_guest: (0..VCPUS).map(|_| AtomicU64::new(0)).collect(),
        flushes: AtomicU64::new(0),
    });
    let mmu = new_mmu(tlb.clone())?;
    let region = |flags| slot_region(&ram, flags);
    // The host backs the slot with 2 MiB pages: faults map blocks.
    mmu.set_memory_region(&region(SlotFlags::NONE), 2 << 20)
        .map_err(|e| e.to_string())?;
    let stop = AtomicBool::new(false);
    let logging = AtomicBool::new(false);
    let mut copy = vec![0u64; RAM / 8];
    let started = Instant::now();
    let (faults, harvested) = std::thread::scope(|s| {
        let vcpus: Vec<_> = (0..VCPUS)
            .map(|id| {
                s.spawn({
                    let (mmu, tlb, ram, logging) = (&mmu, &*tlb, &ram, &logging);
                    move || run_vcpu(mmu, tlb, ram, id, logging)
                })
            })
            .collect();
        // The harvest thread: logging on (the eager split breaks the
        // blocks), round 0 copies everything, then a round every 2 ms.
        let harvester = s.spawn(|| -> Result<(u64, u64), s2mmu::Error> {
            mmu.set_memory_region(&region(SlotFlags::LOG_DIRTY_PAGES), 2 << 20)?;
            logging.store(true, Ordering::Release);
            let mut copied = copy_pages(&ram, &mut copy, &[u64::MAX; NPAGES / 64]);
            let mut rounds = 0;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(2));
                copied += harvest(&mmu, &ram, &mut copy)?;
                rounds += 1;
            }
            // The vCPUs have stopped: the last round.
            copied += harvest(&mmu, &ram, &mut copy)?;
            Ok((rounds + 1, copied))
        });
        let faults: Vec<_> = vcpus
            .into_iter()
            .map(|v| v.join().expect("vCPU thread"))
            .collect();
        stop.store(true, Ordering::Relaxed);
        (faults, harvester.join().expect("harvest thread"))
    });
    let faults: Vec<u64> = faults
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(|e| format!("vCPU: {e}"))?;
    let (rounds, copied) = harvested.map_err(|e| format!("harvest: {e}"))?;
    let stale = stale_pages(&ram, &copy);
    println!(
        "vcpu_loop: {VCPUS} vCPUs x {WRITES_PER_VCPU} writes over {} MiB in {:.2?}: \
         stage-2 faults per vCPU {faults:?}, {rounds} harvests, {copied} pages copied, \
         {} TLB flushes",
        RAM >> 20,
        started.elapsed(),
        tlb.flushes.load(Ordering::Relaxed)
    );
    if !stale.is_empty() {
        return Err(format!(
            "{} pages of the copy differ from the guest's RAM (first: page {})",
            stale.len(),
            stale.first().unwrap()
        ));
    }
    if faults.contains(&0) || rounds < 2 {
        return Err("every vCPU should fault and the harvest should run".into());
    }
    println!("vcpu_loop: the copy equals the guest's RAM");
    Ok(())
}
