//! Post-copy of a Linux guest through the migration library's session:
//! what the destination's FINAL carries back and how the source checks it.
//!
//! The simulated guest's source replays its workload's writes to check
//! the destination's memory; a Linux guest's writes cannot be replayed.
//! Instead the destination keeps the engine's dirty log on from its
//! resume until FINAL (the session turns it on for post-copy anyway, to
//! keep every mapping one page wide), so it knows every page its guest
//! wrote. FINAL's guest state ([`LinuxFinal`]) is the Linux state, that
//! bitmap, and the digest of every page the guest did NOT write. Those
//! pages must be exactly the source's at the stop (pre-copied, sent
//! during the pause, fetched on a stage-2 fault or streamed in the
//! background): the source recomputes the same digest over its frozen
//! memory with the destination's bitmap and requires it equal
//! ([`verify_final`]).

use s2mmu_arm64::linux::memory::{digest_of, LinuxRam};
use s2mmu_arm64::linux::vm;
use s2mmu_migrate::session::postcopy::Final;
use s2mmu_migrate::stream_error::MigrateError;

/// The first bytes of a Linux FINAL state ("LPCF", version 1).
const MAGIC: [u8; 4] = *b"LPCF";
const VERSION: u32 = 1;

/// The guest state a Linux destination sends in FINAL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinuxFinal {
    /// The destination guest's state (`LinuxVm::save_state`) when it
    /// paused for FINAL.
    pub state: Vec<u8>,
    /// Bit `i`: the destination's guest wrote page `i` since it resumed.
    pub written: Vec<u64>,
    /// [`untouched_digest`] of the destination's memory with `written`.
    pub untouched: u64,
}

impl LinuxFinal {
    /// The encoding: magic, version, the state's length and bytes, the
    /// bitmap's words, the digest (little-endian).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(24 + self.state.len() + self.written.len() * 8);
        v.extend_from_slice(&MAGIC);
        v.extend_from_slice(&VERSION.to_le_bytes());
        v.extend_from_slice(&(self.state.len() as u32).to_le_bytes());
        v.extend_from_slice(&self.state);
        v.extend_from_slice(&(self.written.len() as u32).to_le_bytes());
        for w in &self.written {
            v.extend_from_slice(&w.to_le_bytes());
        }
        v.extend_from_slice(&self.untouched.to_le_bytes());
        v
    }

    /// Parses FINAL's state of a guest of `pages` pages: the bitmap must
    /// have one bit per page (whole words), none past the last.
    ///
    /// # Errors
    /// What is wrong with it, as text.
    pub fn decode(b: &[u8], pages: u64) -> Result<LinuxFinal, String> {
        let mut at = 0usize;
        let mut take = |n: usize, what: &str| -> Result<&[u8], String> {
            let end = at
                .checked_add(n)
                .filter(|&e| e <= b.len())
                .ok_or_else(|| format!("{} bytes end inside {what}", b.len()))?;
            let s = &b[at..end];
            at = end;
            Ok(s)
        };
        if take(4, "the magic")? != MAGIC {
            return Err("not a Linux guest's FINAL state (magic)".into());
        }
        let u32_of = |s: &[u8]| u32::from_le_bytes(s.try_into().unwrap_or_default());
        let version = u32_of(take(4, "the version")?);
        if version != VERSION {
            return Err(format!("version {version} (this side reads {VERSION})"));
        }
        let n = u32_of(take(4, "the state's length")?) as usize;
        let state = take(n, "the state")?.to_vec();
        let words = u64::from(u32_of(take(4, "the bitmap's length")?));
        if words != pages.div_ceil(64) {
            return Err(format!(
                "a written-pages bitmap of {words} words for {pages} pages"
            ));
        }
        let raw = take(words as usize * 8, "the bitmap")?;
        let written: Vec<u64> = raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect();
        if !pages.is_multiple_of(64) && written.last().is_some_and(|w| w >> (pages % 64) != 0) {
            return Err(format!("bits set past the guest's {pages} pages"));
        }
        let untouched = u64::from_le_bytes(take(8, "the digest")?.try_into().unwrap_or_default());
        if at != b.len() {
            return Err(format!("{} bytes after the digest", b.len() - at));
        }
        Ok(LinuxFinal {
            state,
            written,
            untouched,
        })
    }

    /// Pages the destination's guest wrote.
    pub fn written_pages(&self) -> u64 {
        self.written.iter().map(|w| u64::from(w.count_ones())).sum()
    }
}

/// The digest ([`digest_of`] the page hashes in page order) of `ram` with
/// the hash of every page set in `written` replaced by 0: the pages a
/// destination's guest did not write.
///
/// # Errors
/// The hashes' memory cannot be had, or `written` does not cover `ram`.
pub fn untouched_digest(ram: &LinuxRam, written: &[u64]) -> Result<u64, String> {
    let pages = ram.pages();
    if written.len() as u64 != pages.div_ceil(64) {
        return Err(format!(
            "a bitmap of {} words for {pages} pages",
            written.len()
        ));
    }
    let mut hashes = Vec::new();
    hashes
        .try_reserve_exact(pages as usize)
        .map_err(|e| format!("page hashes: {e}"))?;
    hashes.resize(pages as usize, 0u64);
    ram.page_hashes(0, &mut hashes);
    for (i, h) in hashes.iter_mut().enumerate() {
        if written[i / 64] & (1 << (i % 64)) != 0 {
            *h = 0;
        }
    }
    Ok(digest_of(&hashes))
}

/// The source's check of a Linux destination's FINAL: its state decodes
/// for a guest of `vcpus` vCPUs and `ram`'s size, and the pages its guest
/// did not write hash to the digest of the same pages of `ram` (the
/// source's memory, frozen since the pause). Returns the slot's digest
/// that agreed.
///
/// # Errors
/// [`MigrateError::MemoryMismatch`] naming what differs;
/// [`MigrateError::PostcopyBroken`] when FINAL carries no state (the
/// destination's guest could not be saved: its machine failed after the
/// resume).
pub fn verify_final(
    ram: &LinuxRam,
    vcpus: usize,
    fin: &Final,
) -> Result<Vec<(u16, u64)>, MigrateError> {
    if fin.state.is_empty() {
        // `LinuxRunning::final_state` sends nothing when the guest's
        // state cannot be had: not a memory that differs, a guest lost.
        return Err(MigrateError::PostcopyBroken {
            why: "the destination's FINAL carries no guest state: its guest failed after it \
                  resumed there (its QEMU machine or a vCPU stopped; the destination's log \
                  says which), and the vCPU state and the pages it wrote since the resume are \
                  lost with it; the source does not resume its own older copy"
                .into(),
            missing_pages: None,
        });
    }
    let mismatch = |detail: String| MigrateError::MemoryMismatch {
        slot: vm::RAM_SLOT,
        detail,
    };
    let f = LinuxFinal::decode(&fin.state, ram.pages())
        .map_err(|e| mismatch(format!("FINAL's Linux state: {e}")))?;
    crate::state::linux::decode(&f.state, vcpus, ram.size())
        .map_err(|e| mismatch(format!("FINAL's Linux guest state: {e}")))?;
    let mine = untouched_digest(ram, &f.written).map_err(mismatch)?;
    if mine != f.untouched {
        return Err(mismatch(format!(
            "the {} pages the destination's guest did not write (of {}) differ from the \
             source's at the pause: source digest {mine:#018x}, destination {:#018x}",
            ram.pages() - f.written_pages(),
            ram.pages(),
            f.untouched
        )));
    }
    Ok(vec![(vm::RAM_SLOT, mine)])
}

#[cfg(test)]
mod tests {
    use super::LinuxFinal;

    #[test]
    fn final_state_round_trips_and_bad_ones_are_refused() {
        let f = LinuxFinal {
            state: vec![1, 2, 3],
            written: vec![u64::MAX, 0b101],
            untouched: 0xfeed,
        };
        let b = f.encode();
        assert_eq!(LinuxFinal::decode(&b, 67).unwrap(), f);
        assert_eq!(f.written_pages(), 66);
        // Too short, too long, a bitmap of another size, a bit past the end.
        assert!(LinuxFinal::decode(&b[..b.len() - 1], 67).is_err());
        let mut long = b.clone();
        long.push(0);
        assert!(LinuxFinal::decode(&long, 67).is_err());
        assert!(LinuxFinal::decode(&b, 200).is_err());
        assert!(LinuxFinal::decode(&b, 65).is_err());
        let mut bad = b;
        bad[0] = b'X';
        assert!(LinuxFinal::decode(&bad, 67).is_err());
    }
}
