//! Verification of the destination's memory against the source's frozen
//! memory: the optional byte-for-byte pass, then per-slot digests.

use super::super::digests::source_digests;
use super::super::replies::{read_reply, unexpected_reply};
use super::Sender;
use crate::bandwidth::TokenBucket;
use crate::stream_error::MigrateError;
use crate::vm::SessionVm;
use crate::wire::{tag, Dec, Record};

pub(super) fn parse_digests(body: &[u8], at_byte: u64) -> Result<Vec<(u16, u64)>, MigrateError> {
    let mut d = Dec::new(body, "RESUMED", at_byte);
    let n = d.u32()?;
    let mut v = Vec::new();
    for _ in 0..n {
        v.push((d.u16()?, d.u64()?));
    }
    d.finish()?;
    Ok(v)
}

/// The byte-for-byte pass: all memory again, unpaced, on the main
/// connection; the destination compares and answers how many pages
/// differ.
///
/// # Errors
/// Sending or the reply failed, or [`MigrateError::MemoryMismatch`].
pub(super) fn verify_full<V: SessionVm>(s: &mut Sender<'_, V>) -> Result<(), MigrateError> {
    let vm = s.vm.clone();
    s.chans[0].wire.control(tag::VERIFY, &[])?;
    *s.bucket.lock().unwrap_or_else(|p| p.into_inner()) = TokenBucket::new(0);
    s.send_all_main()?;
    s.chans[0].wire.end()?;
    match read_reply(&mut s.chans[0].wire, 0)? {
        Record::Control {
            tag: tag::VERIFIED,
            body,
            at_byte,
        } => {
            let mut d = Dec::new(&body, "VERIFIED", at_byte);
            let (bad, first) = (d.u64()?, d.u64()?);
            d.finish()?;
            if bad > 0 {
                let slot = vm.locate(first).map(|(s, _)| s.id).unwrap_or(0);
                return Err(MigrateError::MemoryMismatch {
                    slot,
                    detail: format!(
                        "{bad} pages differ byte for byte, the first at gpa {first:#x}"
                    ),
                });
            }
            Ok(())
        }
        other => Err(unexpected_reply(other, "VERIFIED")),
    }
}

/// The source's per-slot digests, each checked against the destination's.
///
/// # Errors
/// [`MigrateError::MemoryMismatch`] for the first slot that differs or
/// that the destination did not report.
pub(super) fn check_digests<V: SessionVm>(
    vm: &V,
    dest_digests: &[(u16, u64)],
) -> Result<Vec<(u16, u64)>, MigrateError> {
    let slot_digests = source_digests(vm);
    for (id, d) in &slot_digests {
        match dest_digests.iter().find(|(i, _)| i == id) {
            Some((_, got)) if got == d => {}
            Some((_, got)) => {
                return Err(MigrateError::MemoryMismatch {
                    slot: *id,
                    detail: format!("source digest {d:#018x}, destination {got:#018x}"),
                })
            }
            None => {
                return Err(MigrateError::MemoryMismatch {
                    slot: *id,
                    detail: "the destination reported no digest for it".into(),
                })
            }
        }
    }
    Ok(slot_digests)
}
