//! Taking incremental snapshots of a running guest from a dirty view of
//! its own: the first snapshot is the base (a view starts with every page
//! dirty), each later one holds the pages the view reported since.
//!
//! Each take gets and clears the view's bitmap of every slot, then reads
//! the pages: a write after the clear is logged again and lands in the
//! next snapshot. A snapshot of a running guest is therefore fuzzy (pages
//! from a span of time); one taken with the vCPUs paused completes the
//! chain to exactly the guest's memory at that point.

use crate::session::snapshot::format::{io, Header, SlotGeom, SnapshotError, SnapshotWriter, PAGE};
use crate::session::snapshot::restore::{file_name, snapshot_files, Restored, MAX_SNAPSHOTS};
use crate::vm::RamSlot;
use s2mmu::format::arm64::Arm64Stage2;
use s2mmu::memslot::MemslotStore;
use s2mmu::mmu::DirtyView;
use s2mmu_vm::{KnownFormat, Vm};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What one take wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TakeStat {
    /// Its place in the chain.
    pub seq: u64,
    /// Pages it holds.
    pub pages: u64,
    /// Bytes of its file.
    pub bytes: u64,
    /// Time of the take: harvest, reads and writing.
    pub time: Duration,
}

/// A guest's snapshot taker: one dirty view per slot, a directory, the
/// chain so far. Dropping it closes its views.
pub struct Snapshotter<S: MemslotStore, F: KnownFormat = Arm64Stage2> {
    vm: Arc<Vm<S, F>>,
    views: Vec<DirtyView>,
    dir: PathBuf,
    geoms: Vec<SlotGeom>,
    /// Every take so far.
    pub taken: Vec<TakeStat>,
}

impl<S: MemslotStore, F: KnownFormat> Snapshotter<S, F> {
    /// Opens a dirty view of every slot of `vm` (which must log) and
    /// takes `dir` (created if missing) for its files.
    ///
    /// # Errors
    /// [`SnapshotError::Chain`] if `dir` holds snapshots already (a chain
    /// must not mix runs), [`SnapshotError::Io`], [`SnapshotError::Engine`]
    /// (a slot not logging, too many views).
    pub fn open(vm: Arc<Vm<S, F>>, dir: &Path) -> Result<Self, SnapshotError> {
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        if !snapshot_files(dir)?.is_empty() {
            return Err(SnapshotError::Chain {
                why: format!("{} holds snapshots already", dir.display()),
            });
        }
        let geoms = vm
            .slots()
            .iter()
            .map(|s| SlotGeom::from(&RamSlot::from(s)))
            .collect();
        let mut s = Snapshotter {
            vm: vm.clone(),
            views: Vec::new(),
            dir: dir.to_path_buf(),
            geoms,
            taken: Vec::new(),
        };
        for slot in vm.slots() {
            // On an error, dropping `s` closes the views opened so far.
            let v = vm
                .mmu()
                .open_dirty_view(slot.id)
                .map_err(|e| SnapshotError::Engine(e.to_string()))?;
            s.views.push(v);
        }
        Ok(s)
    }

    /// Takes the next snapshot (the base first).
    ///
    /// # Errors
    /// [`SnapshotError::TooMany`] past [`MAX_SNAPSHOTS`],
    /// [`SnapshotError::Io`], [`SnapshotError::Engine`].
    pub fn take(&mut self) -> Result<TakeStat, SnapshotError> {
        let seq = self.taken.len() as u64;
        if seq >= MAX_SNAPSHOTS {
            return Err(SnapshotError::TooMany {
                limit: MAX_SNAPSHOTS,
            });
        }
        let t0 = Instant::now();
        let engine = |e: s2mmu::Error| SnapshotError::Engine(e.to_string());
        let mmu = self.vm.mmu();
        let mut maps = Vec::with_capacity(self.views.len());
        for (v, g) in self.views.iter().zip(&self.geoms) {
            let pages = g.size / PAGE;
            let mut bm = vec![0u64; pages.div_ceil(64) as usize];
            mmu.get_dirty_view(*v, &mut bm).map_err(engine)?;
            mmu.clear_dirty_view(*v, 0, pages, &bm).map_err(engine)?;
            if seq == 0 {
                // The base holds every page, whatever the view said.
                bm.iter_mut().for_each(|w| *w = u64::MAX);
                if !pages.is_multiple_of(64) {
                    *bm.last_mut().expect("a slot has pages") = (1 << (pages % 64)) - 1;
                }
            }
            maps.push(bm);
        }
        let count: u64 = maps
            .iter()
            .flatten()
            .map(|w| u64::from(w.count_ones()))
            .sum();
        let header = Header {
            base: seq == 0,
            seq,
            parent: seq.checked_sub(1),
            slots: self.geoms.clone(),
            pages: count,
        };
        let path = self.dir.join(file_name(seq));
        let mut w = SnapshotWriter::create(&path, header)?;
        let mut buf = vec![0u8; PAGE as usize];
        for (i, bm) in maps.iter().enumerate() {
            let off = self.vm.slots()[i].mem_offset;
            for (k, &word) in bm.iter().enumerate() {
                let mut m = word;
                while m != 0 {
                    let p = k as u64 * 64 + u64::from(m.trailing_zeros());
                    m &= m - 1;
                    if !self.vm.memory().read_into(off + p * PAGE, &mut buf) {
                        return Err(SnapshotError::Engine(format!(
                            "slot {} page {p} is outside guest memory",
                            self.geoms[i].id
                        )));
                    }
                    w.page(i as u32, p, &buf)?;
                }
            }
        }
        let bytes = w.finish()?;
        let stat = TakeStat {
            seq,
            pages: count,
            bytes,
            time: t0.elapsed(),
        };
        self.taken.push(stat);
        Ok(stat)
    }

    /// The directory of its files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl<S: MemslotStore, F: KnownFormat> Drop for Snapshotter<S, F> {
    fn drop(&mut self) {
        for v in self.views.drain(..) {
            // Unknown already if the slot stopped logging: nothing to free.
            let _ = self.vm.mmu().close_dirty_view(v);
        }
    }
}

/// A thread taking a snapshot every period while the guest runs.
pub struct SnapshotLoop<S: MemslotStore + 'static, F: KnownFormat = Arm64Stage2> {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<Result<Snapshotter<S, F>, SnapshotError>>,
}

impl<S: MemslotStore + 'static, F: KnownFormat> SnapshotLoop<S, F> {
    /// Takes the base now, then a snapshot every `every` on a thread of
    /// its own.
    ///
    /// # Errors
    /// The base's [`SnapshotError`].
    pub fn start(mut s: Snapshotter<S, F>, every: Duration) -> Result<Self, SnapshotError>
    where
        Vm<S, F>: Send + Sync,
    {
        s.take()?;
        let (stop, rx) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("snapshots".into())
            .spawn(move || loop {
                match rx.recv_timeout(every) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        s.take()?;
                    }
                    _ => return Ok(s),
                }
            })
            .map_err(|e| io(Path::new("snapshot thread"), e))?;
        Ok(SnapshotLoop { stop, thread })
    }

    /// Stops the thread and hands the taker back (for the last snapshot,
    /// with the guest paused).
    ///
    /// # Errors
    /// The first [`SnapshotError`] a take on the thread met.
    pub fn finish(self) -> Result<Snapshotter<S, F>, SnapshotError> {
        let _ = self.stop.send(());
        self.thread
            .join()
            .unwrap_or_else(|_| Err(SnapshotError::Engine("the snapshot thread panicked".into())))
    }
}

/// Pages of `r` that differ from `vm`'s memory now, and the guest address
/// of the first; a slot of one missing from the other counts all its pages.
pub fn differing_pages<S: MemslotStore, F: KnownFormat>(
    r: &Restored,
    vm: &Vm<S, F>,
) -> (u64, Option<u64>) {
    let page = PAGE;
    let mut buf = vec![0u8; page as usize];
    let (mut n, mut first) = (0, None);
    for (geom, mem) in r.slots.iter().zip(&r.memory) {
        let info = vm
            .slots()
            .iter()
            .find(|s| s.id == geom.id && s.gpa == geom.gpa && s.size == geom.size);
        for p in 0..geom.size / page {
            let at = (p * page) as usize;
            let same = info.is_some_and(|s| {
                vm.memory().read_into(s.mem_offset + p * page, &mut buf)
                    && buf[..] == mem[at..at + page as usize]
            });
            if !same {
                n += 1;
                first.get_or_insert(geom.gpa + p * page);
            }
        }
    }
    (n, first)
}
