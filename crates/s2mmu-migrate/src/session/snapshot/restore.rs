//! Restoring a snapshot chain: the base, then every incremental in order,
//! into a memory image, each file checked ([`super::format`](mod@super::format)) and the
//! chain checked (one base, each incremental's parent the one before it,
//! one guest geometry).

use super::format::{io, read_into, SlotGeom, SnapshotError};
use std::path::{Path, PathBuf};

/// The most snapshot files one chain may have.
pub const MAX_SNAPSHOTS: u64 = 100_000;

/// The name of snapshot `seq` in its directory.
pub fn file_name(seq: u64) -> String {
    format!("snap-{seq:08}.s2snap")
}

/// The snapshot files of `dir`, in chain order (by name).
///
/// # Errors
/// [`SnapshotError::Io`], [`SnapshotError::TooMany`].
pub fn snapshot_files(dir: &Path) -> Result<Vec<PathBuf>, SnapshotError> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| io(dir, e))? {
        let e = e.map_err(|e| io(dir, e))?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap-") && name.ends_with(".s2snap") {
            if files.len() as u64 >= MAX_SNAPSHOTS {
                return Err(SnapshotError::TooMany {
                    limit: MAX_SNAPSHOTS,
                });
            }
            files.push(e.path());
        }
    }
    files.sort();
    Ok(files)
}

/// Guest memory rebuilt from a chain.
#[derive(Debug)]
pub struct Restored {
    /// The guest's slots.
    pub slots: Vec<SlotGeom>,
    /// Each slot's memory, in the order of `slots`.
    pub memory: Vec<Vec<u8>>,
    /// Files applied.
    pub snapshots: u64,
    /// Page records applied, all files together.
    pub pages: u64,
}

/// Rebuilds guest memory from the chain in `dir`, refusing a guest of more
/// than `max_mem` bytes before allocating it.
///
/// # Errors
/// Any [`SnapshotError`] of a file, [`SnapshotError::Chain`] for no base,
/// a gap or a mixed geometry.
pub fn restore(dir: &Path, max_mem: u64) -> Result<Restored, SnapshotError> {
    let files = snapshot_files(dir)?;
    if files.is_empty() {
        return Err(SnapshotError::Chain {
            why: format!("{} holds no snapshot file", dir.display()),
        });
    }
    let mut memory = Vec::new();
    let mut slots: Vec<SlotGeom> = Vec::new();
    let mut pages = 0;
    for (i, path) in files.iter().enumerate() {
        let i = i as u64;
        let h = read_into(path, &mut memory, |h| {
            let why = if i == 0 && !(h.base && h.seq == 0) {
                Some("the first file is not a base of seq 0".to_string())
            } else if i > 0 && (h.base || h.seq != i || h.parent != Some(i - 1)) {
                Some(format!(
                    "{}: seq {} with parent {:?}, expected seq {i} on {}",
                    path.display(),
                    h.seq,
                    h.parent,
                    i - 1
                ))
            } else if i > 0 && h.slots != slots {
                Some(format!("{}: another guest's slot table", path.display()))
            } else if h.slots.iter().map(|s| s.size).sum::<u64>() > max_mem {
                Some(format!(
                    "{}: a guest larger than {max_mem} bytes",
                    path.display()
                ))
            } else {
                None
            };
            why.map_or(Ok(()), |why| Err(SnapshotError::Chain { why }))
        })?;
        if i == 0 {
            slots = h.slots;
        }
        pages += h.pages;
    }
    Ok(Restored {
        slots,
        memory,
        snapshots: files.len() as u64,
        pages,
    })
}
