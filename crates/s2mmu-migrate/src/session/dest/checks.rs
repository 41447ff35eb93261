//! What the destination checks before it resumes and after: complete
//! memory, each channel's END, and the
//! byte comparison of verify-full.

use super::receive::{check_end, page_offset, ReceiveState};
use crate::hash::page_hash;
use crate::stream_error::MigrateError;
use crate::vm::SessionVm;
use crate::wire::{record_name, tag, Header, Record, WireReader, PAGE_SIZE};
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};

/// With verify-full: room for a copy of guest memory, allocated only if
/// the host has it.
pub(super) fn snapshot_for(header: &Header) -> Result<Option<Vec<AtomicU64>>, MigrateError> {
    if !header.verify_full {
        return Ok(None);
    }
    let n = (header.mem_size / 8) as usize;
    let mut v: Vec<AtomicU64> = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        MigrateError::Setup(format!(
            "no memory for a {}-byte copy of the guest (verify_full)",
            header.mem_size
        ))
    })?;
    v.resize_with(n, || AtomicU64::new(0));
    Ok(Some(v))
}

/// Refuses to resume from incomplete memory: every page must have
/// arrived, or (post-copy) be among the missing ones that come after the
/// resume.
pub(super) fn check_complete<V: SessionVm>(
    sh: &ReceiveState<'_, V>,
    postcopy_missing: Option<&[u64]>,
    vm: &V,
) -> Result<(), MigrateError> {
    let page_count = sh.hashes.len() as u64;
    let received: Vec<u64> = sh
        .received
        .iter()
        .enumerate()
        .map(|(w, x)| {
            x.load(Ordering::Relaxed)
                | postcopy_missing.map_or(0, |m| m.get(w).copied().unwrap_or(0))
        })
        .collect();
    let missing: u64 = received
        .iter()
        .enumerate()
        .map(|(w, &m)| {
            let valid = (page_count - w as u64 * 64).min(64);
            let mask = if valid == 64 {
                u64::MAX
            } else {
                (1u64 << valid) - 1
            };
            u64::from((!m & mask).count_ones())
        })
        .sum();
    if missing > 0 {
        let first = (0..page_count)
            .find(|&i| received[(i / 64) as usize] & (1 << (i % 64)) == 0)
            .unwrap_or(0);
        return Err(MigrateError::Incomplete {
            missing_pages: missing,
            first_missing_gpa: gpa_of(vm, first * PAGE_SIZE as u64),
        });
    }
    Ok(())
}

/// Reads the VERIFY that opens the verification pass.
///
/// # Errors
/// ABORT (the source's reason), anything else malformed.
fn expect_verify<R: Read>(rd: &mut WireReader<R>) -> Result<(), MigrateError> {
    match rd.next_record()? {
        Record::Control {
            tag: tag::VERIFY, ..
        } => {}
        Record::Control {
            tag: tag::ABORT,
            body,
            ..
        } => return Err(MigrateError::aborted(&body)),
        other => {
            return Err(MigrateError::Malformed {
                record: "VERIFY",
                at_byte: rd.pos,
                why: format!(
                    "expected the verification pass, got {}",
                    record_name(&other)
                ),
            })
        }
    }
    Ok(())
}

/// The verification pass: VERIFY, all of the source's memory as PAGES
/// records on the main channel, END; each page is compared byte for byte
/// with the memory the guest resumed from. Returns the number of differing
/// pages and the first one's address.
pub(super) fn compare_with_snapshot<R: Read, V: SessionVm>(
    rd: &mut WireReader<R>,
    vm: &V,
    snapshot: &[AtomicU64],
) -> Result<(u64, u64), MigrateError> {
    expect_verify(rd)?;
    let page_count = snapshot.len() as u64 * 8 / PAGE_SIZE as u64;
    let mut seen = vec![false; page_count as usize];
    let (mut bad, mut first) = (0u64, 0u64);
    let mut buf = vec![0u8; PAGE_SIZE];
    loop {
        let at_byte = rd.pos;
        match rd.next_record()? {
            Record::Pages { .. } => {
                for k in 0..rd.entries().len() {
                    let e = rd.entries()[k];
                    let off = page_offset(vm, e.gpa, at_byte)?;
                    if e.zero {
                        buf.fill(0);
                    } else {
                        rd.read_page(&mut buf)?;
                        if page_hash(&buf, e.gpa) != e.hash {
                            return Err(MigrateError::PageChecksum {
                                gpa: e.gpa,
                                at_byte,
                            });
                        }
                    }
                    seen[(off / PAGE_SIZE as u64) as usize] = true;
                    let w0 = (off / 8) as usize;
                    let differs = buf.chunks_exact(8).enumerate().any(|(j, w)| {
                        snapshot[w0 + j].load(Ordering::Relaxed)
                            != u64::from_le_bytes(w.try_into().expect("8 bytes"))
                    });
                    if differs {
                        if bad == 0 {
                            first = e.gpa;
                        }
                        bad += 1;
                    }
                }
            }
            Record::Control {
                tag: tag::END,
                body,
                at_byte,
            } => {
                check_end(&body, at_byte, rd.pages)?;
                break;
            }
            other => {
                return Err(MigrateError::Malformed {
                    record: "verification pass",
                    at_byte,
                    why: format!("{} is not expected in it", record_name(&other)),
                })
            }
        }
    }
    if let Some(i) = seen.iter().position(|s| !s) {
        return Err(MigrateError::Incomplete {
            missing_pages: seen.iter().filter(|s| !**s).count() as u64,
            first_missing_gpa: gpa_of(vm, i as u64 * PAGE_SIZE as u64),
        });
    }
    Ok((bad, first))
}

pub(super) fn gpa_of<V: SessionVm>(vm: &V, offset: u64) -> u64 {
    vm.slots()
        .iter()
        .find(|s| offset >= s.mem_offset && offset - s.mem_offset < s.size)
        .map(|s| s.gpa + offset - s.mem_offset)
        .unwrap_or(offset)
}
