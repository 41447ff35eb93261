//! The lost-write check of a dirty-log run and of a migration
//! on the engine: before the first logged pass and after each harvest,
//! every page of the test memory is hashed; a page whose content changed
//! since the last harvest but that the dirty log did not report is a lost
//! write (the bug class that made guests crash after live migration in
//! propolis #233). `dirty-log-perf` harvests with the guest between passes
//! ([`LostWriteCheck::round`]); a migration harvests while it runs, and
//! judges the changed pages itself ([`LostWriteCheck::changed`],
//! [`super::lost_check`]).

use s2mmu_vm::{KnownFormat, Vm};
use xxhash_rust::xxh3::xxh3_64;

const PAGE: u64 = 4096;

/// Page hashes of every slot, as of the last harvest.
pub struct LostWriteCheck {
    hashes: Vec<Vec<u64>>,
}

/// What one round found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Round {
    /// Pages whose content changed since the last harvest.
    pub changed: u64,
    /// Of those, pages the log did not report.
    pub lost: u64,
}

fn hash_slots<S: s2mmu::memslot::MemslotStore, F: KnownFormat>(
    vm: &Vm<S, F>,
) -> Result<Vec<Vec<u64>>, String> {
    let mem = vm.memory();
    let mut page = vec![0u8; PAGE as usize];
    vm.slots()
        .iter()
        .map(|s| {
            (0..s.size / PAGE)
                .map(|i| {
                    if !mem.read_into(s.mem_offset + i * PAGE, &mut page) {
                        return Err(format!("slot {} page {i} is outside guest memory", s.id));
                    }
                    Ok(xxh3_64(&page))
                })
                .collect()
        })
        .collect()
}

impl LostWriteCheck {
    /// Hashes every page now (logging on, before the first logged pass).
    ///
    /// # Errors
    /// A slot outside guest memory.
    pub fn new<S: s2mmu::memslot::MemslotStore, F: KnownFormat>(
        vm: &Vm<S, F>,
    ) -> Result<Self, String> {
        Ok(LostWriteCheck {
            hashes: hash_slots(vm)?,
        })
    }

    /// The pages changed since the last round (one bitmap per slot, bit 0
    /// the slot's first page), the hashes then taken as the new reference.
    ///
    /// # Errors
    /// A slot outside guest memory.
    pub fn changed<S: s2mmu::memslot::MemslotStore, F: KnownFormat>(
        &mut self,
        vm: &Vm<S, F>,
    ) -> Result<Vec<Vec<u64>>, String> {
        let now = hash_slots(vm)?;
        let changed = self
            .hashes
            .iter()
            .zip(&now)
            .map(|(old, new)| {
                let mut bm = vec![0u64; old.len().div_ceil(64)];
                for (i, (a, b)) in old.iter().zip(new).enumerate() {
                    if a != b {
                        bm[i / 64] |= 1 << (i % 64);
                    }
                }
                bm
            })
            .collect();
        self.hashes = now;
        Ok(changed)
    }

    /// After a harvest whose logs (one bitmap per slot, bit 0 the slot's
    /// first page) are `logs`, taken with the guest not running: pages
    /// changed since the last round, and changed pages missing from the
    /// logs.
    ///
    /// # Errors
    /// A slot outside guest memory.
    pub fn round<S: s2mmu::memslot::MemslotStore, F: KnownFormat>(
        &mut self,
        vm: &Vm<S, F>,
        logs: &[Vec<u64>],
    ) -> Result<Round, String> {
        let mut r = Round::default();
        for (changed, log) in self.changed(vm)?.iter().zip(logs) {
            for (i, &c) in changed.iter().enumerate() {
                r.changed += u64::from(c.count_ones());
                let logged = log.get(i).copied().unwrap_or(0);
                r.lost += u64::from((c & !logged).count_ones());
            }
        }
        Ok(r)
    }
}
