//! Post-copy migration: the destination resumes the guest before all of
//! its memory has arrived, and the engine's stage-2 fault path is the page
//! request.
//!
//! After round 0 (`Postcopy::On`), or once pre-copy is seen not to converge
//! (`Postcopy::Auto`), the source pauses its guest and sends the vCPU
//! STATE and POSTCOPY, the bitmap of the pages still dirty. The
//! destination resumes at once: those pages are simply not mapped in its
//! stage-2 table (it logs dirty pages while post-copy runs, which keeps
//! every mapping one page wide), and a vCPU's translation fault on one
//! goes to `fetch::Fetcher`, the VM's [`crate::vm::PageFetch`] hook: that
//! vCPU alone waits while a REQUEST goes to the source over a connection
//! kept for requests, and the page comes back over a second connection
//! kept for the answers, so it never queues behind the background stream.
//! The source meanwhile streams every other missing page in the background
//! on the main connection ([`source`]). Whichever copy of a page lands
//! first is claimed and kept; a later one (background after a request, or
//! the reverse) is read and dropped, so a page the guest has written since
//! is never overwritten.
//!
//! Verification: when every page is there, the destination runs its guest
//! on, pauses it and sends FINAL: its figures, its vCPUs' states and the
//! per-slot digests of its memory. The source recomputes the writes its
//! guest's workload made between the state it stopped in and those states
//! (the simulated guest: `s2mmu_vm::replay_writes`), applies them to its own frozen memory,
//! and requires the same digests: destination memory is the source's at
//! the stop plus exactly the destination guest's writes.
//!
//! This module holds what both ends share (the protocol's records, the
//! fetcher, the keepalives, the control socket) and the source's half;
//! the destination's half is [`crate::session::dest::postcopy`], which
//! imports this module and is imported by nothing here.
//!
//! Recovery: a connection that breaks during post-copy leaves the memory
//! split. Both sides say so and keep their guest paused; with `RecoveryMode::Auto`
//! auto` they reconnect at once (at most [`source::MAX_RECOVERIES`] times),
//! the destination answering with MISSING, the pages it still lacks; with
//! `RecoveryMode::Manual` (or once `auto` gave up) each waits for an
//! operator on its control socket ([`control`]) to `recover` or `cancel`.

pub mod control;
// geteuid and SO_PEERCRED for the control socket's owner checks.
#[allow(unsafe_code)]
mod control_guard;
// A thread's own setresuid, to connect as a second user.
#[cfg(test)]
#[allow(unsafe_code)]
mod control_guard_tests;
// Writes an answered page straight into guest memory.
#[allow(unsafe_code)]
pub mod fetch;
pub mod keepalive;
pub mod source;

use crate::stream_error::MigrateError;
use crate::vm::{GuestRam, SessionVm};
use crate::wire::{Dec, Enc, MAX_SLOTS, PAGE_SIZE};

/// When the source switches to post-copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Postcopy {
    /// Never: pre-copy only.
    Off,
    /// Right after round 0.
    On,
    /// At the start, before any page is sent (no pre-copy round): every
    /// page is missing when the destination resumes, and each comes by
    /// request (the destination's fault on it) or with the background
    /// stream, as QEMU's post-copy started before its first pass ends.
    Start,
    /// When pre-copy does not converge (two rounds that dirtied more than
    /// half of what they sent, or the round limit), as QEMU's post-copy
    /// after a pre-copy phase.
    Auto,
}

/// What the destination measured during post-copy (the FINAL record).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PostcopyFigures {
    /// Pages that were missing when the guest resumed.
    pub missing_pages: u64,
    /// vCPU faults that had to wait for a page from the source.
    pub remote_faults: u64,
    /// REQUESTs sent (a page two vCPUs wait for is asked for once).
    pub requests: u64,
    /// Median and 99th percentile of a remote fault's wait, nanoseconds.
    pub fault_median_ns: u64,
    pub fault_p99_ns: u64,
    /// Of those, the faults whose page came as the answer to a request
    /// (not from the background stream), and their wait's median and 99th
    /// percentile: the request round trip as a vCPU sees it.
    pub answered_faults: u64,
    pub answered_median_ns: u64,
    pub answered_p99_ns: u64,
    /// From the resume to the last missing page's arrival, nanoseconds.
    pub time_to_last_page_ns: u64,
    /// The reference: median of sequential one-page requests over the
    /// same connections once nothing else is sent (a loopback round trip
    /// plus one page's transfer), nanoseconds, and how many were timed.
    pub reference_ns: u64,
    pub reference_samples: u64,
    /// Missing pages that came with the background stream and as answers.
    pub background_pages: u64,
    pub answered_pages: u64,
    /// Copies that arrived after the page had already landed, dropped.
    pub dropped_duplicates: u64,
    /// Times the connections broke and the source resumed over new ones.
    pub recoveries: u64,
}

/// Post-copy as the source reports it.
#[derive(Clone, Debug, Default)]
pub struct PostcopyOutcome {
    /// The destination's figures.
    pub figures: PostcopyFigures,
    /// The pre-copy round after which the source switched.
    pub after_round: u32,
    /// Pages the source sent in the background and as answers, and the
    /// stream bytes of both.
    pub background_pages: u64,
    pub answered_pages: u64,
    pub bytes: u64,
    /// Timeline seconds at the end of the background stream.
    pub background_end_s: f64,
    /// Connections that broke and were replaced (post-copy recovery).
    pub recoveries: u32,
}

/// Bytes of FINAL's guest state at most.
pub const MAX_FINAL_STATE: u32 = 1 << 20;

/// The FINAL record: figures, the destination guest's state after its
/// run (its vCPUs' places, as the guest encodes them: the source's
/// [`crate::session::guest::SourceGuest::verify_final`] reads them) and
/// the per-slot digests of its memory then.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Final {
    pub figures: PostcopyFigures,
    pub state: Vec<u8>,
    pub digests: Vec<(u16, u64)>,
}

impl Final {
    /// The record's body.
    pub fn encode(&self) -> Vec<u8> {
        let f = &self.figures;
        let mut e = Enc::default();
        for v in [
            f.missing_pages,
            f.remote_faults,
            f.requests,
            f.fault_median_ns,
            f.fault_p99_ns,
            f.answered_faults,
            f.answered_median_ns,
            f.answered_p99_ns,
            f.time_to_last_page_ns,
            f.reference_ns,
            f.reference_samples,
            f.background_pages,
            f.answered_pages,
            f.dropped_duplicates,
            f.recoveries,
        ] {
            e.u64(v);
        }
        e.u32(self.state.len() as u32).bytes(&self.state);
        e.u32(self.digests.len() as u32);
        for (id, d) in &self.digests {
            e.u16(*id).u64(*d);
        }
        e.0
    }

    /// Parses a FINAL body.
    ///
    /// # Errors
    /// [`MigrateError::Malformed`].
    pub fn decode(body: &[u8], at_byte: u64) -> Result<Self, MigrateError> {
        let mut d = Dec::new(body, "FINAL", at_byte);
        let mut v = [0u64; 15];
        for x in &mut v {
            *x = d.u64()?;
        }
        let figures = PostcopyFigures {
            missing_pages: v[0],
            remote_faults: v[1],
            requests: v[2],
            fault_median_ns: v[3],
            fault_p99_ns: v[4],
            answered_faults: v[5],
            answered_median_ns: v[6],
            answered_p99_ns: v[7],
            time_to_last_page_ns: v[8],
            reference_ns: v[9],
            reference_samples: v[10],
            background_pages: v[11],
            answered_pages: v[12],
            dropped_duplicates: v[13],
            recoveries: v[14],
        };
        let n = d.u32()?;
        if n > MAX_FINAL_STATE {
            return Err(d.malformed(format!(
                "{n} bytes of guest state (at most {MAX_FINAL_STATE})"
            )));
        }
        let state = d.bytes(n as usize)?.to_vec();
        let n = d.u32()?;
        if n > MAX_SLOTS {
            return Err(d.malformed(format!("{n} slot digests (at most {MAX_SLOTS})")));
        }
        let mut digests = Vec::new();
        for _ in 0..n {
            digests.push((d.u16()?, d.u64()?));
        }
        d.finish()?;
        Ok(Final {
            figures,
            state,
            digests,
        })
    }
}

/// The bitmap over all of guest memory (bit i: page i from the start of
/// guest memory) of the per-slot bitmaps `pending` (bit i: page i of the
/// slot), as POSTCOPY carries it.
pub fn memory_bitmap<V: SessionVm + ?Sized>(vm: &V, pending: &[Vec<u64>]) -> Vec<u64> {
    let pages = vm.ram().size() / PAGE_SIZE as u64;
    let mut out = vec![0u64; pages.div_ceil(64) as usize];
    for (s, bm) in vm.slots().iter().zip(pending) {
        let first = s.mem_offset / PAGE_SIZE as u64;
        let n = s.size / PAGE_SIZE as u64;
        for (w, &word) in bm.iter().enumerate() {
            let mut m = word;
            while m != 0 {
                let i = w as u64 * 64 + u64::from(m.trailing_zeros());
                m &= m - 1;
                if i < n {
                    let g = first + i;
                    out[(g / 64) as usize] |= 1 << (g % 64);
                }
            }
        }
    }
    out
}

/// The POSTCOPY body of `bitmap`.
pub fn encode_missing(bitmap: &[u64]) -> Vec<u8> {
    let mut e = Enc::default();
    for w in bitmap {
        e.u64(*w);
    }
    e.0
}

/// Parses a POSTCOPY body for a guest of `pages` pages: exactly one bit
/// per page, rounded up to whole words, none set past the last page.
///
/// # Errors
/// [`MigrateError::Malformed`].
pub fn decode_missing(body: &[u8], at_byte: u64, pages: u64) -> Result<Vec<u64>, MigrateError> {
    let words = pages.div_ceil(64) as usize;
    let mut d = Dec::new(body, "POSTCOPY", at_byte);
    if body.len() != words * 8 {
        return Err(d.malformed(format!(
            "a bitmap of {} bytes for {pages} pages ({} expected)",
            body.len(),
            words * 8
        )));
    }
    let mut v = Vec::with_capacity(words);
    for _ in 0..words {
        v.push(d.u64()?);
    }
    d.finish()?;
    if !pages.is_multiple_of(64) {
        if let Some(last) = v.last() {
            if last >> (pages % 64) != 0 {
                return Err(d.malformed(format!("bits set past the guest's {pages} pages")));
            }
        }
    }
    Ok(v)
}

/// The median and the 99th percentile of `v`, 0 for none, by
/// `s2mmu_stats` (the median of an even count rounded half up, the
/// percentile interpolated between ranks and rounded).
pub fn median_p99(v: &[u64]) -> (u64, u64) {
    let f: Vec<f64> = v.iter().map(|&x| x as f64).collect();
    (
        s2mmu_stats::median_u64(v).unwrap_or(0),
        s2mmu_stats::percentile(&f, 99.0).map_or(0, |p| p.round() as u64),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_round_trips_and_bad_bitmaps_are_refused() {
        let f = Final {
            figures: PostcopyFigures {
                remote_faults: 7,
                fault_p99_ns: 9,
                ..PostcopyFigures::default()
            },
            state: vec![2, 3, 4, 5],
            digests: vec![(0, 1), (1, 2)],
        };
        assert_eq!(Final::decode(&f.encode(), 0).unwrap(), f);
        let body = f.encode();
        assert!(Final::decode(&body[..body.len() - 1], 0).is_err());
        assert_eq!(
            decode_missing(&encode_missing(&[5]), 0, 3).unwrap(),
            vec![5]
        );
        assert!(decode_missing(&encode_missing(&[8]), 0, 3).is_err());
        assert!(decode_missing(&encode_missing(&[1, 0]), 0, 3).is_err());
        assert_eq!(median_p99(&[5, 1, 3]), (3, 5));
        assert_eq!(median_p99(&[4, 1, 3, 2]), (3, 4));
        assert_eq!(median_p99(&[]), (0, 0));
        let v: Vec<u64> = (1..=200).rev().collect();
        assert_eq!(median_p99(&v), (101, 198));
    }
}
