//! A VMM's incremental snapshots through a dirty view.
//!
//! A guest thread keeps writing its 16 MiB of RAM. The VMM opens a dirty
//! view of the slot (its own bitmap over the slot's one write protection,
//! so a migration's log or another consumer would not see its clears) and
//! takes a snapshot every 20 ms: it pauses the vCPU, takes the view's
//! dirty pages (GET, then CLEAR, which write-protects them again), writes
//! them to a file in the snapshot directory, records a hash of the whole
//! RAM as the guest left it, and resumes the guest. Snapshot 0 is full:
//! a view starts with every page dirty. A second view, a working-set
//! estimator, counts the pages written per 60 ms beside it without
//! disturbing the snapshots.
//!
//! Then it restores: snapshot 0, then each increment in order, onto fresh
//! memory, and after each one the memory's hash must be the one recorded
//! when that snapshot was taken. Any page the view missed makes a hash
//! differ and the example exit nonzero. The snapshot files are removed at
//! the end.
//!
//! Run: `cargo run -p s2mmu --example incremental_snapshots`. With
//! `--lose-marks N` the MMU drops N dirty marks on purpose
//! (`Mmu::inject_lost_marks`), and the check must then fail.

use s2mmu::format::arm64::{Arm64Stage2, Granule};
use s2mmu::memslot::{SlotFlags, TreeMemslots, UserMemoryRegion};
use s2mmu::mmu::{DirtyView, Mmu, MmuPolicy};
use s2mmu::{Gpa, HostMmOps, Hva, NoTlb, Prot};
use std::collections::hash_map::DefaultHasher;
use std::hash::Hasher;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

const GPA_BASE: u64 = 4 << 30;
const RAM: usize = 16 << 20;
const PAGE: usize = 4096;
const NPAGES: usize = RAM / PAGE;
const SNAPSHOTS: usize = 8;

type Vm = Mmu<Arm64Stage2, HostMmOps, TreeMemslots>;
type Error = Box<dyn std::error::Error>;

/// The guest's RAM as words (the guest thread and the VMM touch it at
/// once), page aligned.
struct Ram(Vec<AtomicU64>);

impl Ram {
    fn new() -> Ram {
        // One page more than needed, so that a page-aligned start fits.
        Ram((0..(RAM + PAGE) / 8).map(|_| AtomicU64::new(0)).collect())
    }
    fn words(&self) -> &[AtomicU64] {
        let skip = (PAGE - (self.0.as_ptr() as usize % PAGE)) % PAGE / 8;
        &self.0[skip..skip + RAM / 8]
    }
    fn hva(&self) -> u64 {
        self.words().as_ptr() as u64
    }
    fn hash(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.words()
            .iter()
            .for_each(|w| h.write_u64(w.load(Ordering::Relaxed)));
        h.finish()
    }
}

/// The guest: writes a counter into pseudo-random words, a batch of 100 per
/// hold of `run` (the VMM pauses it by taking `run`) and a batch about
/// every millisecond, counting its batches in `batches`; a write to a page
/// the stage-2 table does not let it write is a fault.
fn guest(
    mmu: &Vm,
    ram: &Ram,
    run: &Mutex<()>,
    stop: &AtomicBool,
    batches: &AtomicU64,
) -> Result<u64, Error> {
    let mut vcpu = mmu.new_vcpu()?;
    let reader = mmu.reader();
    let (mut x, mut n, mut faults) = (0x2545_f491_4f6c_dd1d_u64, 0u64, 0);
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(1));
        let _running = run.lock().unwrap();
        for _ in 0..100 {
            // Skewed toward the first quarter of RAM, as a working set is.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let span = if x % 4 == 0 { RAM } else { RAM / 4 } as u64;
            let gpa = GPA_BASE + (x >> 8) % (span / 8) * 8;
            n += 1;
            loop {
                match reader.translate(gpa).filter(|t| t.prot.contains(Prot::W)) {
                    Some(t) => {
                        ram.words()[(t.pa - ram.hva()) as usize / 8].store(n, Ordering::Relaxed);
                        break;
                    }
                    None => {
                        faults += 1;
                        mmu.handle_fault(&mut vcpu, Gpa::new(gpa), true)?;
                    }
                }
            }
        }
        batches.fetch_add(1, Ordering::Release);
    }
    Ok(faults)
}

/// Waits until the guest has written a batch after `seen` batches, so that
/// every increment has pages however long a loaded host leaves the guest
/// thread unscheduled; a guest that writes nothing for 30 s is an error.
fn await_guest_batch(batches: &AtomicU64, seen: u64) -> Result<(), Error> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if batches.load(Ordering::Acquire) > seen {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err("the guest thread wrote nothing for 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Takes `view`'s dirty pages (GET, then CLEAR) and returns them.
fn take(mmu: &Vm, view: DirtyView) -> Result<Vec<usize>, Error> {
    let mut bits = vec![0u64; NPAGES / 64];
    mmu.get_dirty_view(view, &mut bits)?;
    mmu.clear_dirty_view(view, 0, NPAGES as u64, &bits)?;
    Ok((0..NPAGES)
        .filter(|p| bits[p / 64] & (1 << (p % 64)) != 0)
        .collect())
}

/// Writes `pages` of `ram` to `path`: per page its number (u64 LE) and
/// its 4096 bytes.
fn write_snapshot(path: &Path, ram: &Ram, pages: &[usize]) -> Result<(), Error> {
    let mut f = BufWriter::new(std::fs::File::create(path)?);
    for &p in pages {
        f.write_all(&(p as u64).to_le_bytes())?;
        for w in &ram.words()[p * PAGE / 8..(p + 1) * PAGE / 8] {
            f.write_all(&w.load(Ordering::Relaxed).to_le_bytes())?;
        }
    }
    f.flush()?;
    Ok(())
}

/// Applies the snapshot file at `path` to `ram`.
fn apply_snapshot(path: &Path, ram: &Ram) -> Result<(), Error> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.read_to_end(&mut bytes)?;
    for rec in bytes.chunks(8 + PAGE) {
        let word = |i: usize| u64::from_le_bytes(rec[i * 8..i * 8 + 8].try_into().unwrap());
        let page = usize::try_from(word(0))?;
        if rec.len() != 8 + PAGE || page >= NPAGES {
            return Err(format!("{}: damaged record", path.display()).into());
        }
        for (i, w) in ram.words()[page * PAGE / 8..(page + 1) * PAGE / 8]
            .iter()
            .enumerate()
        {
            w.store(word(i + 1), Ordering::Relaxed);
        }
    }
    Ok(())
}

/// What the VMM shares with the running guest thread.
struct Guest<'a> {
    ram: &'a Ram,
    run: &'a Mutex<()>,
    batches: &'a AtomicU64,
}

/// Snapshots taken: per snapshot its file, its page count and the RAM's
/// hash; and the working set's page counts.
type Taken = (Vec<(PathBuf, usize, u64)>, Vec<usize>);

/// Takes [`SNAPSHOTS`] snapshots of the running guest through the view
/// `snapshots`, one every 20 ms, and the working set through the view
/// `working_set` every third one.
fn take_snapshots(
    mmu: &Vm,
    guest: &Guest,
    dir: &Path,
    [snapshots, working_set]: [DirtyView; 2],
) -> Result<Taken, Error> {
    let (mut taken, mut working_sets) = (Vec::new(), Vec::new());
    let mut seen = 0;
    for k in 0..SNAPSHOTS {
        std::thread::sleep(Duration::from_millis(20));
        // Every snapshot after the first must hold some pages: the guest
        // has written since the last one was taken.
        await_guest_batch(guest.batches, seen)?;
        let paused = guest.run.lock().unwrap();
        seen = guest.batches.load(Ordering::Acquire);
        let pages = take(mmu, snapshots)?;
        let path = dir.join(format!("snapshot-{k}.bin"));
        write_snapshot(&path, guest.ram, &pages)?;
        taken.push((path, pages.len(), guest.ram.hash()));
        if k % 3 == 2 {
            working_sets.push(take(mmu, working_set)?.len());
        }
        drop(paused);
    }
    Ok((taken, working_sets))
}

fn main() -> ExitCode {
    let dir = std::env::temp_dir().join(format!("s2mmu-snapshots-{}", std::process::id()));
    let result = std::fs::create_dir_all(&dir)
        .map_err(Error::from)
        .and_then(|()| run(&dir));
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("incremental_snapshots: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(dir: &Path) -> Result<(), Error> {
    let ram = Ram::new();
    let mmu: Vm = Mmu::new(
        Arm64Stage2::new(Granule::K4, 48)?,
        HostMmOps::new(PAGE)?,
        // The guest is paused while a CLEAR protects pages and translates
        // every access anew: no stale translation to invalidate.
        std::sync::Arc::new(NoTlb),
        TreeMemslots::new(),
        MmuPolicy::default(),
    )?;
    let logged = UserMemoryRegion::new(
        0,
        SlotFlags::LOG_DIRTY_PAGES,
        Gpa::new(GPA_BASE),
        RAM as u64,
        Hva::new(ram.hva()),
    );
    mmu.set_memory_region(&logged, PAGE as u64)?;
    let args: Vec<String> = std::env::args().collect();
    match &args[1..] {
        [] => {}
        [flag, n] if flag == "--lose-marks" => mmu.inject_lost_marks(n.parse()?),
        other => return Err(format!("unknown arguments {other:?} (only --lose-marks N)").into()),
    }
    let snapshots = mmu.open_dirty_view(0)?;
    let working_set = mmu.open_dirty_view(0)?;
    take(&mmu, working_set)?; // starts all dirty: not a measurement
    let run = Mutex::new(());
    let (stop, batches) = (AtomicBool::new(false), AtomicU64::new(0));
    let ((taken, working_sets), faults) = std::thread::scope(|s| -> Result<_, Error> {
        let g = s.spawn(|| guest(&mmu, &ram, &run, &stop, &batches).map_err(|e| e.to_string()));
        let guest = Guest {
            ram: &ram,
            run: &run,
            batches: &batches,
        };
        let snapshotting = take_snapshots(&mmu, &guest, dir, [snapshots, working_set]);
        // The guest stops whether or not every snapshot was taken, so that
        // an error ends the run instead of leaving the guest thread going.
        stop.store(true, Ordering::Relaxed);
        let faults = g.join().expect("guest thread")?;
        Ok((snapshotting?, faults))
    })?;
    let sizes: Vec<usize> = taken.iter().map(|t| t.1).collect();
    println!(
        "incremental_snapshots: {SNAPSHOTS} snapshots of {} MiB, pages per snapshot {sizes:?}, \
         working set per 60 ms {working_sets:?} pages, {faults} guest faults",
        RAM >> 20
    );
    // Restore onto fresh memory, checking each prefix against its hash.
    let restored = Ram::new();
    for (k, (path, _, hash)) in taken.iter().enumerate() {
        apply_snapshot(path, &restored)?;
        if restored.hash() != *hash {
            return Err(format!(
                "restoring snapshots 0..={k} does not give the RAM of snapshot {k}"
            )
            .into());
        }
    }
    if sizes[0] != NPAGES || sizes[1..].iter().any(|&n| n == 0 || n >= NPAGES) {
        return Err(format!("snapshot 0 must be full and the others partial: {sizes:?}").into());
    }
    println!("incremental_snapshots: every restored prefix matches its snapshot's RAM");
    Ok(())
}
