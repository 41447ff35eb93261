//! What the generic source and destination tests share: guest RAM as a
//! plain array of words (a VM that is not the simulated one) and the run
//! of one migration over loopback TCP.

// Guest RAM implements the unsafe trait GuestRam.
#![allow(unsafe_code, dead_code)]

use s2mmu_migrate::session::both_ends::run_both_ends;
use s2mmu_migrate::session::dest::{DestConfig, DestFactory, DestOutcome};
use s2mmu_migrate::session::guest::SourceGuest;
use s2mmu_migrate::session::source::{SourceConfig, SourceOutcome};
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::transport::{self, NetConfig};
use s2mmu_migrate::vm::GuestRam;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Per-slot digests: (slot id, digest).
pub type Digests = Vec<(u16, u64)>;

/// Guest RAM as a boxed array of words.
pub struct Words(pub Box<[AtomicU64]>);

impl Words {
    /// `bytes` of RAM (a multiple of 8), word `i` holding `fill(i)`.
    pub fn filled(bytes: u64, fill: impl Fn(u64) -> u64) -> Words {
        Words((0..bytes / 8).map(|i| AtomicU64::new(fill(i))).collect())
    }

    fn range_ok(&self, offset: u64, len: usize) -> bool {
        offset.is_multiple_of(8)
            && len.is_multiple_of(8)
            && offset
                .checked_add(len as u64)
                .is_some_and(|end| end <= self.size())
    }
}

// SAFETY: the words are one allocation of `size()` bytes (a multiple of
// the page size in every test) at `host_span(0)`, 8-byte aligned, alive as long as the value, and only ever accessed
// atomically per word (here and by the tests' writer threads).
unsafe impl GuestRam for Words {
    fn size(&self) -> u64 {
        self.0.len() as u64 * 8
    }
    fn host_span(&self, offset: u64) -> Option<(u64, u64)> {
        let size = self.size();
        (offset < size).then(|| (self.0.as_ptr() as u64 + offset, size - offset))
    }
    fn read_into(&self, offset: u64, out: &mut [u8]) -> bool {
        if !self.range_ok(offset, out.len()) {
            return false;
        }
        for (k, c) in out.chunks_exact_mut(8).enumerate() {
            let w = self.0[(offset / 8) as usize + k].load(Ordering::Relaxed);
            c.copy_from_slice(&w.to_le_bytes());
        }
        true
    }
    fn write_from(&self, offset: u64, data: &[u8]) -> bool {
        if !self.range_ok(offset, data.len()) {
            return false;
        }
        for (k, c) in data.chunks_exact(8).enumerate() {
            let w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
            self.0[(offset / 8) as usize + k].store(w, Ordering::Relaxed);
        }
        true
    }
}

/// One migration over loopback TCP (plain, 10 s deadlines) through
/// `run_both_ends`: `guest` (running) into the guest `factory` builds,
/// served on a thread of its own. Both outcomes come back, the
/// destination's first (it names what broke).
pub fn over_loopback<G: SourceGuest, D: DestFactory + Send + 'static>(
    dest_cfg: &DestConfig,
    factory: D,
    guest: &G,
    source_cfg: &SourceConfig,
) -> (
    Result<DestOutcome, MigrateError>,
    Result<SourceOutcome, MigrateError>,
) {
    let net = NetConfig::plain(Duration::from_secs(10));
    let listener = transport::bind("127.0.0.1:0").expect("a loopback listener");
    let both = run_both_ends(
        listener,
        Arc::new(factory),
        guest,
        source_cfg,
        dest_cfg,
        &net,
    )
    .expect("the destination thread starts");
    (both.dest, both.source)
}
