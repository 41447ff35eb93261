//! Snapshots of a whole guest over the session's VM traits, whatever VM
//! runs it: its memory as a base snapshot in the file format of
//! [`super::format`] (the one the simulated guest's snapshots use), and
//! beside it a state file with the guest's shape and its STATE body (what
//! a migration's STATE record carries). [`save_paused`] writes both from
//! a paused [`SourceGuest`]; [`restore_guest`] checks both files in full,
//! then builds a fresh guest through a [`DestFactory`] (as a migration's
//! destination does), lets the guest check the state, writes the memory
//! and starts the vCPUs: a damaged or foreign snapshot is refused by name
//! before any vCPU runs.
//!
//! ```text
//! state file  magic "S2MMUGST", version u32, vcpus u32, mem_size u64,
//!             slots u32, format code u32, backing length u32,
//!             body length u64                                   (44 bytes)
//!             backing (UTF-8), body, XXH3-64 of every byte before (8 bytes)
//! ```

use super::format::{io, open_regular, Header, SlotGeom, SnapshotError, SnapshotWriter, PAGE};
use super::restore::{file_name, restore, snapshot_files, Restored};
use crate::session::dest::{DestFactory, DestGuest, Limits};
use crate::session::digests::source_digests;
use crate::session::guest::{GuestShape, SourceGuest};
use crate::vm::{GuestRam, SessionVm};
use crate::wire;
use s2mmu::format::FormatId;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_64;

/// The name of the state file in a snapshot's directory.
pub const STATE_FILE: &str = "guest.s2state";
/// The state file's magic.
pub const STATE_MAGIC: [u8; 8] = *b"S2MMUGST";
/// The state file's format version this build writes and reads.
pub const STATE_VERSION: u32 = 1;
/// Bytes of the state file's fixed head.
const STATE_HEAD: usize = 44;
/// The longest backing name a state file may carry.
pub const MAX_BACKING: u32 = 64;
/// The largest STATE body a state file may carry.
pub const MAX_STATE_BODY: u64 = 16 << 20;

/// What [`save_paused`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedGuest {
    /// Pages of the memory file.
    pub pages: u64,
    /// Bytes of both files.
    pub bytes: u64,
    /// Per-slot digests of the memory saved (those of the session's
    /// switch: the same on the restored guest).
    pub slot_digests: Vec<(u16, u64)>,
}

/// The guest's shape and STATE body, as the state file holds them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedState {
    /// The guest's shape.
    pub shape: GuestShape,
    /// The STATE body.
    pub body: Vec<u8>,
}

/// Saves `guest`, whose vCPUs the caller has paused (a running guest's
/// memory would be fuzzy): its memory as the base snapshot of `dir`
/// (created if missing; it must hold no snapshot yet) and its shape and
/// STATE body in [`STATE_FILE`] there. The guest stays paused.
///
/// # Errors
/// [`SnapshotError::Chain`] if `dir` holds snapshots already,
/// [`SnapshotError::Guest`] when the guest's state cannot be read,
/// [`SnapshotError::Malformed`] for a slot table the format cannot hold,
/// [`SnapshotError::Io`].
pub fn save_paused<G: SourceGuest>(guest: &G, dir: &Path) -> Result<SavedGuest, SnapshotError> {
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    if !snapshot_files(dir)?.is_empty() || dir.join(STATE_FILE).exists() {
        return Err(SnapshotError::Chain {
            why: format!("{} holds a snapshot already", dir.display()),
        });
    }
    let state_path = dir.join(STATE_FILE);
    let body = guest
        .state(guest.pace())
        .map_err(|e| SnapshotError::Guest {
            path: state_path.clone(),
            why: format!("the guest's state: {e}"),
        })?;
    let saved = SavedState {
        shape: guest.shape(),
        body,
    };
    let vm = guest.vm();
    let (pages, mem_bytes) = write_memory(&**vm, &dir.join(file_name(0)))?;
    let state_bytes = write_state(&state_path, &saved)?;
    Ok(SavedGuest {
        pages,
        bytes: mem_bytes + state_bytes,
        slot_digests: source_digests(&**vm),
    })
}

/// Writes every page of `vm` as a base snapshot at `path`; returns its
/// pages and bytes.
fn write_memory<V: SessionVm>(vm: &V, path: &Path) -> Result<(u64, u64), SnapshotError> {
    let slots: Vec<SlotGeom> = vm.slots().iter().map(SlotGeom::from).collect();
    let pages = slots.iter().map(|s| s.size / PAGE).sum();
    let header = Header {
        base: true,
        seq: 0,
        parent: None,
        slots,
        pages,
    };
    let mut w = SnapshotWriter::create(path, header)?;
    let mut buf = vec![0u8; PAGE as usize];
    for (i, s) in vm.slots().iter().enumerate() {
        for p in 0..s.size / PAGE {
            if !vm.ram().read_into(s.mem_offset + p * PAGE, &mut buf) {
                return Err(SnapshotError::Malformed {
                    path: path.to_path_buf(),
                    why: format!("slot {} page {p} is outside guest RAM", s.id),
                });
            }
            w.page(i as u32, p, &buf)?;
        }
    }
    Ok((pages, w.finish()?))
}

/// The state file's bytes for `s`.
fn encode_state(s: &SavedState) -> Vec<u8> {
    let mut b = Vec::with_capacity(STATE_HEAD + s.shape.backing.len() + s.body.len() + 8);
    b.extend_from_slice(&STATE_MAGIC);
    b.extend_from_slice(&STATE_VERSION.to_le_bytes());
    b.extend_from_slice(&s.shape.vcpus.to_le_bytes());
    b.extend_from_slice(&s.shape.mem_size.to_le_bytes());
    b.extend_from_slice(&s.shape.slots.to_le_bytes());
    b.extend_from_slice(&u32::from(s.shape.format.code()).to_le_bytes());
    b.extend_from_slice(&(s.shape.backing.len() as u32).to_le_bytes());
    b.extend_from_slice(&(s.body.len() as u64).to_le_bytes());
    b.extend_from_slice(s.shape.backing.as_bytes());
    b.extend_from_slice(&s.body);
    let sum = xxh3_64(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    b
}

/// Writes the state file `path` for `s` (under a `.tmp` name first,
/// renamed when complete); returns its bytes.
///
/// # Errors
/// [`SnapshotError::Malformed`] for a backing name or body over the
/// limits, [`SnapshotError::Io`].
pub fn write_state(path: &Path, s: &SavedState) -> Result<u64, SnapshotError> {
    let too_big =
        s.shape.backing.len() > MAX_BACKING as usize || s.body.len() as u64 > MAX_STATE_BODY;
    if too_big {
        return Err(SnapshotError::Malformed {
            path: path.to_path_buf(),
            why: format!(
                "a backing name of {} bytes or a state of {} bytes: at most {MAX_BACKING} and {MAX_STATE_BODY}",
                s.shape.backing.len(),
                s.body.len()
            ),
        });
    }
    let bytes = encode_state(s);
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(|e| io(&tmp, e))?;
    f.write_all(&bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| io(path, e))?;
    Ok(bytes.len() as u64)
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Reads and checks the state file `path`: its magic, version, limits,
/// length and checksum, before its body is used.
///
/// # Errors
/// [`SnapshotError::BadMagic`], [`SnapshotError::Version`],
/// [`SnapshotError::Malformed`], [`SnapshotError::Truncated`],
/// [`SnapshotError::Checksum`], [`SnapshotError::Io`].
pub fn read_state(path: &Path) -> Result<SavedState, SnapshotError> {
    let p = || path.to_path_buf();
    let most = (STATE_HEAD as u64) + u64::from(MAX_BACKING) + MAX_STATE_BODY + 8;
    // At most one byte past the largest state file is read: a longer
    // file is refused without reading it all.
    let mut b = Vec::new();
    open_regular(path)?
        .take(most + 1)
        .read_to_end(&mut b)
        .map_err(|e| io(path, e))?;
    if b.len() < 8 || b[..8] != STATE_MAGIC {
        return Err(SnapshotError::BadMagic { path: p() });
    }
    if b.len() as u64 > most {
        return Err(SnapshotError::Malformed {
            path: p(),
            why: format!("over {most} bytes: longer than a state file may be"),
        });
    }
    if b.len() < STATE_HEAD + 8 {
        return Err(SnapshotError::Truncated {
            path: p(),
            expected: STATE_HEAD as u64 + 8,
            found: b.len() as u64,
        });
    }
    let version = le_u32(&b, 8);
    if version != STATE_VERSION {
        return Err(SnapshotError::Version {
            path: p(),
            found: version,
        });
    }
    let (backing_len, body_len) = (le_u32(&b, 32), le_u64(&b, 36));
    if backing_len > MAX_BACKING || body_len > MAX_STATE_BODY {
        return Err(SnapshotError::Malformed {
            path: p(),
            why: format!("a backing name of {backing_len} bytes or a state of {body_len} bytes"),
        });
    }
    let expected = STATE_HEAD as u64 + u64::from(backing_len) + body_len + 8;
    if expected != b.len() as u64 {
        return Err(SnapshotError::Truncated {
            path: p(),
            expected,
            found: b.len() as u64,
        });
    }
    let end = b.len() - 8;
    if le_u64(&b, end) != xxh3_64(&b[..end]) {
        return Err(SnapshotError::Checksum { path: p() });
    }
    decode_state(path, &b[..end], backing_len as usize)
}

/// The checked state file's fields.
fn decode_state(path: &Path, b: &[u8], backing_len: usize) -> Result<SavedState, SnapshotError> {
    let bad = |why: String| SnapshotError::Malformed {
        path: path.to_path_buf(),
        why,
    };
    let code = le_u32(b, 28);
    let format = u8::try_from(code)
        .ok()
        .and_then(FormatId::from_code)
        .ok_or_else(|| {
            bad(format!(
                "stage-2 format code {code}: not one this build knows"
            ))
        })?;
    let backing = std::str::from_utf8(&b[STATE_HEAD..STATE_HEAD + backing_len])
        .map_err(|_| bad("the backing name is not UTF-8".into()))?
        .to_string();
    Ok(SavedState {
        shape: GuestShape {
            mem_size: le_u64(b, 16),
            slots: le_u32(b, 24),
            vcpus: le_u32(b, 12),
            backing,
            format,
        },
        body: b[STATE_HEAD + backing_len..].to_vec(),
    })
}

/// What [`restore_guest`] restored.
pub struct RestoredGuest<G: DestGuest> {
    /// The guest built for it (its VM).
    pub guest: G,
    /// The guest, running from the snapshot's state.
    pub running: G::Running,
    /// Per-slot digests of its memory before its vCPUs started (those
    /// [`SavedGuest::slot_digests`] names for a faithful restore).
    pub slot_digests: Vec<(u16, u64)>,
    /// Pages applied from the memory files.
    pub pages: u64,
}

/// Restores the snapshot in `dir` into a guest `factory` builds, refusing
/// a guest of more than `max_mem` bytes. Both files are read and checked
/// in full before the guest is built; the guest checks the state before
/// its memory is written; its vCPUs start only after all of it.
///
/// # Errors
/// Any [`SnapshotError`] of the files (naming the file and what is
/// wrong), [`SnapshotError::Guest`] when the memory files do not fit the
/// state's shape, the guest cannot be built, or it refuses the state.
pub fn restore_guest<F: DestFactory>(
    factory: &F,
    dir: &Path,
    max_mem: u64,
) -> Result<RestoredGuest<F::Guest>, SnapshotError> {
    let state_path = dir.join(STATE_FILE);
    let saved = read_state(&state_path)?;
    let memory = restore(dir, max_mem)?;
    let refuse = |why: String| SnapshotError::Guest {
        path: state_path.clone(),
        why,
    };
    let total: u64 = memory.slots.iter().map(|s| s.size).sum();
    if total != saved.shape.mem_size || memory.slots.len() as u64 != u64::from(saved.shape.slots) {
        return Err(refuse(format!(
            "the memory files hold {} slots of {total} bytes, the state a guest of {} slots of {} bytes",
            memory.slots.len(),
            saved.shape.slots,
            saved.shape.mem_size
        )));
    }
    let header = wire::Header {
        mem_size: saved.shape.mem_size,
        slots: saved.shape.slots,
        gpa_base: memory.slots.first().map_or(0, |s| s.gpa),
        vcpus: saved.shape.vcpus,
        channels: 1,
        backing: saved.shape.backing.clone(),
        verify_full: false,
        postcopy: false,
        format: saved.shape.format,
        image: None,
    };
    // What a migration's destination checks before it builds anything.
    Limits::of_build()
        .check(&header)
        .map_err(|e| refuse(format!("the snapshot's guest: {e}")))?;
    let guest = factory
        .build(&header)
        .map_err(|e| refuse(format!("building the guest: {e}")))?;
    let state = guest
        .decode_state(&saved.body, &header, 0)
        .map_err(|e| refuse(format!("the guest refuses the state: {e}")))?;
    let slot_digests = write_image(guest.vm(), &memory).map_err(refuse)?;
    let running = guest
        .start(&state)
        .map_err(|e| refuse(format!("starting the guest: {e}")))?;
    Ok(RestoredGuest {
        guest,
        running,
        slot_digests,
        pages: memory.pages,
    })
}

/// Writes the restored memory into the guest's RAM (slot by slot, each
/// of the same id, address and size); returns its per-slot digests.
fn write_image<V: SessionVm>(vm: &Arc<V>, memory: &Restored) -> Result<Vec<(u16, u64)>, String> {
    for (geom, mem) in memory.slots.iter().zip(&memory.memory) {
        let slot = vm
            .slots()
            .iter()
            .find(|s| s.id == geom.id && s.gpa == geom.gpa && s.size == geom.size)
            .ok_or_else(|| {
                format!(
                    "the guest built has no slot {} of {} bytes at {:#x}",
                    geom.id, geom.size, geom.gpa
                )
            })?;
        if !vm.ram().write_from(slot.mem_offset, mem) {
            return Err(format!("slot {} does not fit the guest's RAM", geom.id));
        }
    }
    Ok(source_digests(&**vm))
}

/// The path of the state file of the snapshot in `dir`.
pub fn state_path(dir: &Path) -> PathBuf {
    dir.join(STATE_FILE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved() -> SavedState {
        SavedState {
            shape: GuestShape {
                mem_size: 64 << 20,
                slots: 1,
                vcpus: 2,
                backing: "qemu-shared".into(),
                format: FormatId::of::<s2mmu::format::arm64::Arm64Stage2>(),
            },
            body: (0..1000u32).map(|i| (i * 7) as u8).collect(),
        }
    }

    /// Writes `bytes` as a state file in a fresh directory; reads it back.
    fn read_back(name: &str, bytes: &[u8]) -> Result<SavedState, SnapshotError> {
        let dir = std::env::temp_dir().join(format!("s2mmu-gst-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = state_path(&dir);
        std::fs::write(&path, bytes).unwrap();
        let r = read_state(&path);
        std::fs::remove_dir_all(&dir).unwrap();
        r
    }

    #[test]
    fn a_state_file_reads_back_as_written() {
        let s = saved();
        let dir = std::env::temp_dir().join(format!("s2mmu-gst-{}-rt", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let n = write_state(&state_path(&dir), &s).unwrap();
        assert_eq!(n, std::fs::metadata(state_path(&dir)).unwrap().len());
        assert_eq!(read_state(&state_path(&dir)).unwrap(), s);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn damaged_and_foreign_state_files_are_refused_by_name() {
        let good = encode_state(&saved());
        let mut flipped = good.clone();
        flipped[good.len() / 2] ^= 1;
        assert!(matches!(
            read_back("flip", &flipped),
            Err(SnapshotError::Checksum { .. })
        ));
        assert!(matches!(
            read_back("short", &good[..good.len() - 1]),
            Err(SnapshotError::Truncated { .. })
        ));
        let mut magic = good.clone();
        magic[..8].copy_from_slice(b"S2MMUSNP");
        assert!(matches!(
            read_back("magic", &magic),
            Err(SnapshotError::BadMagic { .. })
        ));
        let mut version = good.clone();
        version[8] = 9;
        assert!(matches!(
            read_back("version", &version),
            Err(SnapshotError::Version { found: 9, .. })
        ));
        let mut huge = good.clone();
        huge[36..44].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            read_back("huge", &huge),
            Err(SnapshotError::Malformed { .. })
        ));
    }

    /// A snapshot whose state asks for more vCPUs than this build takes is
    /// refused by the limits before the guest is built.
    #[cfg(feature = "sim")]
    #[test]
    fn a_guest_over_the_limits_is_refused_before_it_is_built() {
        use s2mmu::format::arm64::Arm64Stage2;
        let dir = std::env::temp_dir().join(format!("s2mmu-gst-{}-lim", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let slots = vec![SlotGeom {
            id: 0,
            gpa: 1 << 30,
            size: PAGE,
        }];
        let h = Header {
            base: true,
            seq: 0,
            parent: None,
            slots,
            pages: 1,
        };
        let mut w = SnapshotWriter::create(&dir.join(file_name(0)), h).unwrap();
        w.page(0, 0, &[7u8; PAGE as usize]).unwrap();
        w.finish().unwrap();
        let mut s = saved();
        s.shape.mem_size = PAGE;
        s.shape.vcpus = u32::MAX;
        write_state(&state_path(&dir), &s).unwrap();
        let f = crate::sim::dest::SimDest::<Arm64Stage2>::new(
            s2mmu::mmu::MmuPolicy::default(),
            FormatId::of::<Arm64Stage2>(),
        );
        match restore_guest(&f, &dir, 1 << 30) {
            Err(SnapshotError::Guest { why, .. }) => {
                assert!(why.contains("accepts at most"), "{why}")
            }
            Err(e) => panic!("refused otherwise: {e}"),
            Ok(_) => panic!("restored a guest of {} vCPUs", u32::MAX),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_state_over_the_limit_is_not_written() {
        let mut s = saved();
        s.shape.backing = "x".repeat(MAX_BACKING as usize + 1);
        let dir = std::env::temp_dir().join(format!("s2mmu-gst-{}-big", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(matches!(
            write_state(&state_path(&dir), &s),
            Err(SnapshotError::Malformed { .. })
        ));
        assert!(!state_path(&dir).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
