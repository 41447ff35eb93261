//! Snapshots of a [`MigratableVm`] in a file, and their restore into a VM
//! that has not run.
//!
//! Layout (little endian): magic `S2MMUSNP` (8), version (4), pages (8),
//! state length (4); then each non-zero page as its number (8) and its
//! bytes ([`PAGE_SIZE`]), numbers rising, ended by `u64::MAX`; then the
//! state ([`crate::state`]); then the XXH3-64 of everything before (8).
//!
//! Restore reads the file twice: once to check its checksum, sizes and
//! page numbers against the VM, and only then to write the VM, so a
//! damaged or foreign file leaves the VM as it was.

use crate::error::MigrateError;
use crate::state::{StateError, MAX_STATE_LEN};
use crate::vm::{MigratableVm, PAGE_SIZE};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

/// The first 8 bytes of a snapshot file.
pub const SNAPSHOT_MAGIC: [u8; 8] = *b"S2MMUSNP";
/// The snapshot layout's version.
pub const SNAPSHOT_VERSION: u32 = 1;
const END: u64 = u64::MAX;

/// What a snapshot held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Guest pages.
    pub pages: u64,
    /// Non-zero pages stored.
    pub stored_pages: u64,
    /// State bytes.
    pub state_bytes: usize,
    /// The memory's digest.
    pub digest: u64,
}

fn io(path: &Path, e: impl std::fmt::Display) -> MigrateError {
    MigrateError::Io(format!("{}: {e}", path.display()))
}

/// Pauses `vm` and writes its memory and state to `path` (created or
/// truncated). The VM stays paused; resume it to let it run on.
///
/// # Errors
/// The VM's errors, [`MigrateError::Io`].
pub fn save<V: MigratableVm>(vm: &mut V, path: &Path) -> Result<SnapshotInfo, MigrateError> {
    let vmerr = |step| move |err| MigrateError::Source { step, err };
    vm.pause().map_err(vmerr("pausing"))?;
    let state = vm.save_state().map_err(vmerr("saving the state"))?;
    let f = File::create(path).map_err(|e| io(path, e))?;
    let mut w = HashWriter {
        inner: BufWriter::new(f),
        hash: xxhash_rust::xxh3::Xxh3::new(),
    };
    let pages = vm.page_count();
    let mut head = Vec::with_capacity(24);
    head.extend_from_slice(&SNAPSHOT_MAGIC);
    head.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
    head.extend_from_slice(&pages.to_le_bytes());
    head.extend_from_slice(&(state.len() as u32).to_le_bytes());
    w.put(&head).map_err(|e| io(path, e))?;
    let mut buf = [0u8; PAGE_SIZE];
    let mut stored = 0;
    for p in 0..pages {
        vm.read_page(p, &mut buf).map_err(vmerr("reading a page"))?;
        if buf.iter().any(|&b| b != 0) {
            w.put(&p.to_le_bytes()).map_err(|e| io(path, e))?;
            w.put(&buf).map_err(|e| io(path, e))?;
            stored += 1;
        }
    }
    w.put(&END.to_le_bytes()).map_err(|e| io(path, e))?;
    w.put(&state).map_err(|e| io(path, e))?;
    let sum = w.hash.digest();
    w.inner
        .write_all(&sum.to_le_bytes())
        .and_then(|_| w.inner.flush())
        .map_err(|e| io(path, e))?;
    Ok(SnapshotInfo {
        pages,
        stored_pages: stored,
        state_bytes: state.len(),
        digest: vm.memory_digest().map_err(vmerr("digest"))?,
    })
}

struct HashWriter<W: Write> {
    inner: W,
    hash: xxhash_rust::xxh3::Xxh3,
}

impl<W: Write> HashWriter<W> {
    fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.hash.update(b);
        self.inner.write_all(b)
    }
}

struct HashReader<R: Read> {
    inner: R,
    hash: xxhash_rust::xxh3::Xxh3,
}

impl<R: Read> HashReader<R> {
    fn take(&mut self, b: &mut [u8], what: &str) -> Result<(), MigrateError> {
        self.inner.read_exact(b).map_err(|_| {
            MigrateError::State(StateError::Truncated {
                what: format!("{what} (snapshot)"),
            })
        })?;
        self.hash.update(b);
        Ok(())
    }

    fn u64(&mut self, what: &str) -> Result<u64, MigrateError> {
        let mut b = [0u8; 8];
        self.take(&mut b, what)?;
        Ok(u64::from_le_bytes(b))
    }
}

fn open(path: &Path) -> Result<HashReader<BufReader<File>>, MigrateError> {
    let meta = std::fs::metadata(path).map_err(|e| io(path, e))?;
    if !meta.is_file() {
        return Err(io(path, "not a regular file"));
    }
    let f = File::open(path).map_err(|e| io(path, e))?;
    Ok(HashReader {
        inner: BufReader::new(f),
        hash: xxhash_rust::xxh3::Xxh3::new(),
    })
}

/// Opens the file and checks its header against a VM of `pages` pages;
/// returns the reader after the header and the state's length.
fn header(path: &Path, pages: u64) -> Result<(HashReader<BufReader<File>>, usize), MigrateError> {
    let mut r = open(path)?;
    let mut magic = [0u8; 8];
    r.take(&mut magic, "the magic")?;
    if magic != SNAPSHOT_MAGIC {
        return Err(StateError::BadMagic { found: magic }.into());
    }
    let mut v = [0u8; 4];
    r.take(&mut v, "the version")?;
    let version = u32::from_le_bytes(v);
    if version != SNAPSHOT_VERSION {
        return Err(StateError::Version {
            found: version,
            supported: SNAPSHOT_VERSION,
        }
        .into());
    }
    let file_pages = r.u64("the page count")?;
    if file_pages != pages {
        return Err(MigrateError::SizeMismatch {
            source: file_pages,
            destination: pages,
        });
    }
    r.take(&mut v, "the state length")?;
    let state_len = u32::from_le_bytes(v) as usize;
    if state_len > MAX_STATE_LEN {
        return Err(StateError::TooLarge {
            what: "snapshot's state length".into(),
            value: state_len as u64,
            max: MAX_STATE_LEN as u64,
        }
        .into());
    }
    Ok((r, state_len))
}

/// One pass over the file: checks everything; with `vm`, also writes the
/// pages into it. Returns the state bytes and the pages stored.
fn pass<V: MigratableVm>(
    path: &Path,
    pages: u64,
    mut vm: Option<&mut V>,
) -> Result<(Vec<u8>, u64), MigrateError> {
    let (mut r, state_len) = header(path, pages)?;
    let (mut buf, zero) = ([0u8; PAGE_SIZE], [0u8; PAGE_SIZE]);
    let (mut next, mut stored) = (0u64, 0u64);
    loop {
        let p = r.u64("a page number")?;
        let end = p == END;
        if !end && (p < next || p >= pages) {
            return Err(StateError::BadSection {
                tag: 0,
                what: format!("page number {p} after {next} of {pages} pages"),
            }
            .into());
        }
        let upto = if end { pages } else { p };
        if let Some(vm) = vm.as_deref_mut() {
            for z in next..upto {
                vm.write_page(z, &zero).map_err(restore_err)?;
            }
        }
        if end {
            break;
        }
        r.take(&mut buf, "a page")?;
        if let Some(vm) = vm.as_deref_mut() {
            vm.write_page(p, &buf).map_err(restore_err)?;
        }
        next = p + 1;
        stored += 1;
    }
    let mut state = Vec::new();
    state
        .try_reserve_exact(state_len)
        .map_err(|e| io(path, e))?;
    state.resize(state_len, 0);
    r.take(&mut state, "the state")?;
    let computed = r.hash.digest();
    let mut s = [0u8; 8];
    r.inner
        .read_exact(&mut s)
        .map_err(|_| StateError::Truncated {
            what: "the checksum (snapshot)".into(),
        })?;
    let stored_sum = u64::from_le_bytes(s);
    if stored_sum != computed {
        return Err(StateError::Checksum {
            stored: stored_sum,
            computed,
        }
        .into());
    }
    let mut extra = [0u8; 1];
    if r.inner.read(&mut extra).map_err(|e| io(path, e))? != 0 {
        return Err(StateError::TrailingBytes { extra: 1 }.into());
    }
    Ok((state, stored))
}

fn restore_err(err: crate::VmError) -> MigrateError {
    MigrateError::Destination {
        step: "restoring the snapshot",
        err,
    }
}

/// Checks the snapshot at `path` against `vm` (which must not have run),
/// then loads its memory and state. The caller resumes the VM.
///
/// # Errors
/// [`MigrateError::Io`] for a file that is not a regular file or cannot
/// be read; [`MigrateError::State`] for a damaged or foreign file;
/// [`MigrateError::SizeMismatch`]; the VM's refusal of the state; in
/// each case before the VM is changed (except a VM error while writing).
pub fn restore<V: MigratableVm>(vm: &mut V, path: &Path) -> Result<SnapshotInfo, MigrateError> {
    let pages = vm.page_count();
    let (state, stored) = pass::<V>(path, pages, None)?;
    // The state first: the VM checks it and refuses it unchanged.
    vm.restore_state(&state).map_err(restore_err)?;
    pass(path, pages, Some(&mut *vm))?;
    Ok(SnapshotInfo {
        pages,
        stored_pages: stored,
        state_bytes: state.len(),
        digest: vm.memory_digest().map_err(restore_err)?,
    })
}
