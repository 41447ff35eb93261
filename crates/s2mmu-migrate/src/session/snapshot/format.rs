//! The snapshot file: a checked header, the guest's slot table, page
//! records, and a checksum of the whole file.
//!
//! ```text
//! header   magic "S2MMUSNP", version u32, kind u32 (0 base, 1 incremental),
//!          seq u64, parent u64 (u64::MAX for a base), page size u32,
//!          slots u32, pages u64, XXH3-64 of the 48 bytes before   (56 bytes)
//! slots    per slot: id u16, 0u16, 0u32, gpa u64, size u64       (24 bytes each)
//! pages    per page: slot index u32, 0u32, page u64, data          (16 + page size)
//! trailer  XXH3-64 of every byte before it                         (8 bytes)
//! ```
//!
//! All integers little-endian. A reader checks the header's checksum and
//! limits before it allocates anything, the file's length against what the
//! header announces (a truncated file is refused as such), every record
//! against the slot table, and the trailer; pages go into a caller's
//! memory image, which it must drop on any error.

use crate::host::available_memory;
use std::fmt;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

/// The file's magic.
pub const MAGIC: [u8; 8] = *b"S2MMUSNP";
/// The format version this build writes and reads.
pub const VERSION: u32 = 1;
/// Bytes of the header, its checksum included.
pub const HEADER_BYTES: u64 = 56;
/// Bytes of a slot-table entry.
pub const SLOT_BYTES: u64 = 24;
/// Bytes of a page record before its data.
pub const RECORD_HEAD_BYTES: u64 = 16;
/// The page size of the guests it stores.
pub const PAGE: u64 = 4096;
/// The most slots a snapshot may describe.
pub const MAX_SLOTS: u32 = 4096;
/// The most guest memory a snapshot may describe (all slots together).
pub const MAX_MEM: u64 = 64 << 30;

/// A snapshot file that could not be written or read, naming the file and
/// what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotError {
    /// A file operation failed.
    Io { path: PathBuf, error: String },
    /// Not a snapshot file.
    BadMagic { path: PathBuf },
    /// A format version this build does not read.
    Version { path: PathBuf, found: u32 },
    /// The header's checksum does not match it: a damaged header.
    HeaderChecksum { path: PathBuf },
    /// A header field or the slot table out of the limits or malformed.
    Malformed { path: PathBuf, why: String },
    /// The file is shorter or longer than its header announces.
    Truncated {
        path: PathBuf,
        expected: u64,
        found: u64,
    },
    /// The trailer does not match the file's contents: damaged data.
    Checksum { path: PathBuf },
    /// The files do not form one chain (a base, then each incremental's
    /// parent the one before it, all of one guest's geometry).
    Chain { why: String },
    /// Too many snapshots for one run.
    TooMany { limit: u64 },
    /// The engine refused a dirty-view call.
    Engine(String),
    /// The guest refuses what the snapshot holds, or the snapshot does not
    /// fit the guest built for it (`path`: the state file).
    Guest { path: PathBuf, why: String },
    /// Restoring the guest the file describes needs more memory than this
    /// host has available (checked, and allocated fallibly, before any).
    NoMemory {
        path: PathBuf,
        bytes: u64,
        available: u64,
    },
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotError::Io { path, error } => write!(f, "{}: {error}", path.display()),
            SnapshotError::BadMagic { path } => {
                write!(f, "{}: not a snapshot file (bad magic)", path.display())
            }
            SnapshotError::Version { path, found } => write!(
                f,
                "{}: snapshot format version {found}, this build reads {VERSION}",
                path.display()
            ),
            SnapshotError::HeaderChecksum { path } => {
                write!(f, "{}: header checksum mismatch (damaged)", path.display())
            }
            SnapshotError::Malformed { path, why } => write!(f, "{}: {why}", path.display()),
            SnapshotError::Truncated {
                path,
                expected,
                found,
            } => write!(
                f,
                "{}: {found} bytes, the header announces {expected} (truncated or padded)",
                path.display()
            ),
            SnapshotError::Checksum { path } => write!(
                f,
                "{}: checksum mismatch over the file (damaged data)",
                path.display()
            ),
            SnapshotError::Chain { why } => write!(f, "snapshot chain: {why}"),
            SnapshotError::TooMany { limit } => {
                write!(f, "more than {limit} snapshots in one run")
            }
            SnapshotError::Engine(e) => write!(f, "dirty view: {e}"),
            SnapshotError::Guest { path, why } => write!(f, "{}: {why}", path.display()),
            SnapshotError::NoMemory {
                path,
                bytes,
                available,
            } => write!(
                f,
                "{}: restoring its guest needs {bytes} bytes of memory, this host has {available} available",
                path.display()
            ),
        }
    }
}

impl std::error::Error for SnapshotError {}

pub(crate) fn io(path: &Path, e: std::io::Error) -> SnapshotError {
    SnapshotError::Io {
        path: path.to_path_buf(),
        error: e.to_string(),
    }
}

/// A slot of the guest a snapshot belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotGeom {
    /// Slot id.
    pub id: u16,
    /// Guest-physical base.
    pub gpa: u64,
    /// Bytes.
    pub size: u64,
}

impl From<&crate::vm::RamSlot> for SlotGeom {
    /// A guest's slot in a snapshot's slot table (its place in the
    /// guest's memory is the restorer's business).
    fn from(s: &crate::vm::RamSlot) -> Self {
        SlotGeom {
            id: s.id,
            gpa: s.gpa,
            size: s.size,
        }
    }
}

/// What a snapshot file's header says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// A base (every page) rather than an incremental (changed pages).
    pub base: bool,
    /// Its place in the chain, from 0 (the base).
    pub seq: u64,
    /// The snapshot it applies on (`None` for a base).
    pub parent: Option<u64>,
    /// The guest's slots.
    pub slots: Vec<SlotGeom>,
    /// Page records it holds.
    pub pages: u64,
}

impl Header {
    /// Bytes of a file with this header.
    pub fn file_len(&self) -> u64 {
        HEADER_BYTES
            + SLOT_BYTES * self.slots.len() as u64
            + (RECORD_HEAD_BYTES + PAGE) * self.pages
            + 8
    }

    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_BYTES as usize);
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&u32::from(!self.base).to_le_bytes());
        b.extend_from_slice(&self.seq.to_le_bytes());
        b.extend_from_slice(&self.parent.unwrap_or(u64::MAX).to_le_bytes());
        b.extend_from_slice(&(PAGE as u32).to_le_bytes());
        b.extend_from_slice(&(self.slots.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.pages.to_le_bytes());
        let sum = xxh3_64(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        for s in &self.slots {
            b.extend_from_slice(&s.id.to_le_bytes());
            b.extend_from_slice(&[0; 6]);
            b.extend_from_slice(&s.gpa.to_le_bytes());
            b.extend_from_slice(&s.size.to_le_bytes());
        }
        b
    }
}

/// Checks a slot table: ids distinct, sizes non-zero multiples of a page,
/// at most [`MAX_SLOTS`] slots and [`MAX_MEM`] bytes in all.
pub fn check_slots(slots: &[SlotGeom]) -> Result<(), String> {
    if slots.is_empty() || slots.len() > MAX_SLOTS as usize {
        return Err(format!("{} slots: must be 1 to {MAX_SLOTS}", slots.len()));
    }
    let mut total = 0u64;
    for (i, s) in slots.iter().enumerate() {
        if s.size == 0 || !s.size.is_multiple_of(PAGE) {
            return Err(format!("slot {}: size {} is not whole pages", s.id, s.size));
        }
        if slots[..i].iter().any(|o| o.id == s.id) {
            return Err(format!("slot {} appears twice", s.id));
        }
        total = total.saturating_add(s.size);
    }
    if total > MAX_MEM {
        return Err(format!("{total} bytes of guest memory: at most {MAX_MEM}"));
    }
    Ok(())
}

/// Writes one snapshot file, page by page: to `path` with a `.tmp`
/// suffix first, renamed when complete, so a reader never sees a half
/// written file under the final name.
pub struct SnapshotWriter {
    out: BufWriter<File>,
    hash: Xxh3,
    path: PathBuf,
    tmp: PathBuf,
    header: Header,
    written: u64,
}

impl SnapshotWriter {
    /// Starts the file `path` for `header` (whose `pages` the caller must
    /// then write exactly).
    ///
    /// # Errors
    /// [`SnapshotError::Malformed`] for a bad slot table,
    /// [`SnapshotError::Io`].
    pub fn create(path: &Path, header: Header) -> Result<Self, SnapshotError> {
        check_slots(&header.slots).map_err(|why| SnapshotError::Malformed {
            path: path.to_path_buf(),
            why,
        })?;
        let tmp = path.with_extension("tmp");
        let file = File::create(&tmp).map_err(|e| io(&tmp, e))?;
        let mut w = SnapshotWriter {
            out: BufWriter::with_capacity(1 << 20, file),
            hash: Xxh3::new(),
            path: path.to_path_buf(),
            tmp,
            header,
            written: 0,
        };
        let head = w.header.encode();
        w.put(&head)?;
        Ok(w)
    }

    fn put(&mut self, b: &[u8]) -> Result<(), SnapshotError> {
        self.hash.update(b);
        self.out.write_all(b).map_err(|e| io(&self.tmp, e))
    }

    /// Writes page `page` of slot number `slot` (an index in the table).
    ///
    /// # Errors
    /// [`SnapshotError::Malformed`] for a page outside its slot, a slot
    /// index outside the table, data that is not one page, or more pages
    /// than the header announced; [`SnapshotError::Io`].
    pub fn page(&mut self, slot: u32, page: u64, data: &[u8]) -> Result<(), SnapshotError> {
        let inside = self
            .header
            .slots
            .get(slot as usize)
            .is_some_and(|s| page < s.size / PAGE);
        if !inside || data.len() as u64 != PAGE || self.written >= self.header.pages {
            return Err(SnapshotError::Malformed {
                path: self.path.clone(),
                why: format!(
                    "page record {} (slot {slot}, page {page}) does not fit the header",
                    self.written
                ),
            });
        }
        let mut head = [0u8; RECORD_HEAD_BYTES as usize];
        head[..4].copy_from_slice(&slot.to_le_bytes());
        head[8..].copy_from_slice(&page.to_le_bytes());
        self.put(&head)?;
        self.put(data)?;
        self.written += 1;
        Ok(())
    }

    /// Writes the trailer and gives the file its name; returns its length.
    ///
    /// # Errors
    /// [`SnapshotError::Malformed`] if fewer pages than announced were
    /// written; [`SnapshotError::Io`].
    pub fn finish(mut self) -> Result<u64, SnapshotError> {
        if self.written != self.header.pages {
            return Err(SnapshotError::Malformed {
                path: self.path.clone(),
                why: format!(
                    "{} page records written, the header announces {}",
                    self.written, self.header.pages
                ),
            });
        }
        let sum = self.hash.digest();
        self.out
            .write_all(&sum.to_le_bytes())
            .and_then(|()| self.out.flush())
            .map_err(|e| io(&self.tmp, e))?;
        std::fs::rename(&self.tmp, &self.path).map_err(|e| io(&self.path, e))?;
        Ok(self.header.file_len())
    }
}

/// Reads a little-endian integer field.
fn le<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

/// Reads and checks a snapshot's header and slot table.
fn read_header(
    path: &Path,
    r: &mut impl Read,
    hash: &mut Xxh3,
    len: u64,
) -> Result<Header, SnapshotError> {
    let bad = |why: String| SnapshotError::Malformed {
        path: path.to_path_buf(),
        why,
    };
    let mut h = [0u8; HEADER_BYTES as usize];
    if len < HEADER_BYTES + 8 {
        return Err(SnapshotError::Truncated {
            path: path.to_path_buf(),
            expected: HEADER_BYTES + 8,
            found: len,
        });
    }
    r.read_exact(&mut h).map_err(|e| io(path, e))?;
    hash.update(&h);
    if h[..8] != MAGIC {
        return Err(SnapshotError::BadMagic {
            path: path.to_path_buf(),
        });
    }
    if u64::from_le_bytes(le(&h, 48)) != xxh3_64(&h[..48]) {
        return Err(SnapshotError::HeaderChecksum {
            path: path.to_path_buf(),
        });
    }
    let version = u32::from_le_bytes(le(&h, 8));
    if version != VERSION {
        return Err(SnapshotError::Version {
            path: path.to_path_buf(),
            found: version,
        });
    }
    let kind = u32::from_le_bytes(le(&h, 12));
    let seq = u64::from_le_bytes(le(&h, 16));
    let parent = u64::from_le_bytes(le(&h, 24));
    let page = u32::from_le_bytes(le(&h, 32));
    let nslots = u32::from_le_bytes(le(&h, 36));
    let pages = u64::from_le_bytes(le(&h, 40));
    if kind > 1 || u64::from(page) != PAGE || nslots == 0 || nslots > MAX_SLOTS {
        return Err(bad(format!(
            "kind {kind}, page size {page}, {nslots} slots: not a snapshot this build reads"
        )));
    }
    if (kind == 0) != (parent == u64::MAX) || (kind == 1 && parent >= seq) {
        return Err(bad(format!("seq {seq} with parent {parent} (kind {kind})")));
    }
    if pages > MAX_MEM / PAGE {
        return Err(bad(format!(
            "{pages} page records: at most {}",
            MAX_MEM / PAGE
        )));
    }
    let mut t = vec![0u8; (SLOT_BYTES * u64::from(nslots)) as usize];
    r.read_exact(&mut t).map_err(|e| io(path, e))?;
    hash.update(&t);
    let slots: Vec<SlotGeom> = t
        .chunks_exact(SLOT_BYTES as usize)
        .map(|c| SlotGeom {
            id: u16::from_le_bytes(le(c, 0)),
            gpa: u64::from_le_bytes(le(c, 8)),
            size: u64::from_le_bytes(le(c, 16)),
        })
        .collect();
    check_slots(&slots).map_err(bad)?;
    Ok(Header {
        base: kind == 0,
        seq,
        parent: (kind == 1).then_some(parent),
        slots,
        pages,
    })
}

/// Opens `path` for reading only if it is a regular file: a FIFO, a
/// device or a socket named like a snapshot is refused without blocking
/// (it is opened non-blocking, and checked on the open descriptor, so it
/// cannot be swapped in between).
pub(crate) fn open_regular(path: &Path) -> Result<File, SnapshotError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| io(path, e))?;
    let kind = file.metadata().map_err(|e| io(path, e))?.file_type();
    if !kind.is_file() {
        use std::os::unix::fs::FileTypeExt;
        let what = if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_socket() {
            "a socket"
        } else if kind.is_dir() {
            "a directory"
        } else {
            "a device"
        };
        return Err(SnapshotError::Io {
            path: path.to_path_buf(),
            error: format!("not a regular file ({what}); refusing to read it"),
        });
    }
    Ok(file)
}

/// One zeroed buffer per slot, after checking their total against the
/// memory available; each allocated fallibly.
fn zeroed_image(path: &Path, slots: &[SlotGeom]) -> Result<Vec<Vec<u8>>, SnapshotError> {
    let bytes = slots.iter().map(|s| s.size).sum::<u64>();
    let no_memory = |available| SnapshotError::NoMemory {
        path: path.to_path_buf(),
        bytes,
        available,
    };
    if let Some(available) = available_memory() {
        if bytes > available {
            return Err(no_memory(available));
        }
    }
    let mut image = Vec::new();
    image
        .try_reserve_exact(slots.len())
        .map_err(|_| no_memory(0))?;
    for s in slots {
        let size = usize::try_from(s.size).map_err(|_| no_memory(0))?;
        let mut m = Vec::new();
        m.try_reserve_exact(size)
            .map_err(|_| no_memory(available_memory().unwrap_or(0)))?;
        m.resize(size, 0);
        image.push(m);
    }
    Ok(image)
}

/// Reads the snapshot `path` into `image` (one buffer per slot of the
/// header's table, which the caller has checked the image matches through
/// `check`): checks everything [`SnapshotError`] names. On an error,
/// `image` holds part of the file's pages: the caller must drop it.
///
/// # Errors
/// Every [`SnapshotError`] but `Chain`, `TooMany` and `Engine`, and
/// whatever `check` returns for the header.
pub fn read_into(
    path: &Path,
    image: &mut Vec<Vec<u8>>,
    check: impl FnOnce(&Header) -> Result<(), SnapshotError>,
) -> Result<Header, SnapshotError> {
    let file = open_regular(path)?;
    let len = file.metadata().map_err(|e| io(path, e))?.len();
    let mut r = BufReader::with_capacity(1 << 20, file);
    let mut hash = Xxh3::new();
    let header = read_header(path, &mut r, &mut hash, len)?;
    if header.file_len() != len {
        return Err(SnapshotError::Truncated {
            path: path.to_path_buf(),
            expected: header.file_len(),
            found: len,
        });
    }
    check(&header)?;
    if image.is_empty() {
        *image = zeroed_image(path, &header.slots)?;
    }
    let mut rec = vec![0u8; (RECORD_HEAD_BYTES + PAGE) as usize];
    for i in 0..header.pages {
        r.read_exact(&mut rec).map_err(|e| io(path, e))?;
        hash.update(&rec);
        let slot = u32::from_le_bytes(le(&rec, 0)) as usize;
        let page = u64::from_le_bytes(le(&rec, 8));
        let dst = image
            .get_mut(slot)
            .filter(|m| page < m.len() as u64 / PAGE)
            .map(|m| &mut m[(page * PAGE) as usize..((page + 1) * PAGE) as usize])
            .ok_or_else(|| SnapshotError::Malformed {
                path: path.to_path_buf(),
                why: format!("page record {i}: slot {slot} page {page} is outside the slot table"),
            })?;
        dst.copy_from_slice(&rec[RECORD_HEAD_BYTES as usize..]);
    }
    let mut sum = [0u8; 8];
    r.read_exact(&mut sum).map_err(|e| io(path, e))?;
    if u64::from_le_bytes(sum) != hash.digest() {
        return Err(SnapshotError::Checksum {
            path: path.to_path_buf(),
        });
    }
    Ok(header)
}
