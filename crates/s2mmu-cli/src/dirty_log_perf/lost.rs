//! The lost-write check of `dirty-log-perf --check` on the engine: before
//! the first logged pass and after each harvest, every page of the test
//! memory is hashed; a page whose content changed since the last harvest
//! but that the dirty log did not report is a lost write (the bug class
//! that made guests crash after live migration in propolis #233).

use s2mmu::memslot::MemslotStore;
use s2mmu_vm::{Vm, VmFormat};
use xxhash_rust::xxh3::xxh3_64;

const PAGE: u64 = 4096;

/// Page hashes of every slot, as of the last harvest.
pub(super) struct LostWriteCheck {
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

fn hash_slots<S: MemslotStore, F: VmFormat>(vm: &Vm<S, F>) -> Result<Vec<Vec<u64>>, String> {
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
    pub fn new<S: MemslotStore, F: VmFormat>(vm: &Vm<S, F>) -> Result<Self, String> {
        Ok(LostWriteCheck {
            hashes: hash_slots(vm)?,
        })
    }

    /// After a harvest whose logs (one bitmap per slot, bit 0 the slot's
    /// first page) are `logs`: pages changed since the last round, and
    /// changed pages missing from the logs.
    pub fn round<S: MemslotStore, F: VmFormat>(
        &mut self,
        vm: &Vm<S, F>,
        logs: &[Vec<u64>],
    ) -> Result<Round, String> {
        let now = hash_slots(vm)?;
        let mut r = Round::default();
        for ((old, new), log) in self.hashes.iter().zip(&now).zip(logs) {
            for (i, (a, b)) in old.iter().zip(new).enumerate() {
                if a != b {
                    r.changed += 1;
                    let logged = log.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1);
                    r.lost += u64::from(!logged);
                }
            }
        }
        self.hashes = now;
        Ok(r)
    }
}
