//! `SourceExtras::check`: the lost-write check of a migration, whose guest
//! runs while the source harvests.
//!
//! Every page is hashed after each harvest ([`super::lost_write`]). With
//! the guest running, a write lands in the log of the round whose window
//! it falls in or of the next one (a write between a GET and the hashing
//! that follows it is logged by the next GET; a write to a page reported
//! dirty and not cleared yet is sent after the clear), or it hit a page
//! of the previous round's log (sent after its clear, in this round). So a
//! page that changed in round r's window is lost only if it is in none of
//! the logs of rounds r-1, r and r+1; the final round, with the guest
//! paused, closes every window. A dropped dirty mark leaves its page
//! writable and never logged again, so a workload that rewrites it shows
//! it changed and unlogged within two rounds.

use super::lost_write::LostWriteCheck;
pub use crate::session::extras::CheckSummary;
use crate::stream_error::MigrateError;
use s2mmu::memslot::MemslotStore;
use s2mmu_vm::{KnownFormat, Vm};

/// The check across rounds.
pub struct RunningLostCheck {
    hashes: LostWriteCheck,
    /// The previous round's log.
    prev_log: Vec<Vec<u64>>,
    /// Pages changed in the previous window and in neither log around it
    /// yet: lost unless this round's log has them.
    suspects: Vec<Vec<u64>>,
    /// Pages found lost so far (each counted once, however often it
    /// changes unlogged again).
    lost: Vec<Vec<u64>>,
    /// What it found so far.
    pub found: CheckSummary,
}

fn err(e: String) -> MigrateError {
    MigrateError::Setup(format!("lost-write check: {e}"))
}

impl RunningLostCheck {
    /// Hashes every page (logging just turned on).
    ///
    /// # Errors
    /// [`MigrateError::Setup`] if a slot lies outside guest memory.
    pub fn new<S: MemslotStore, F: KnownFormat>(vm: &Vm<S, F>) -> Result<Self, MigrateError> {
        let zero: Vec<Vec<u64>> = vm
            .slots()
            .iter()
            .map(|s| vec![0u64; (s.size / 4096).div_ceil(64) as usize])
            .collect();
        Ok(RunningLostCheck {
            hashes: LostWriteCheck::new(vm).map_err(err)?,
            prev_log: zero.clone(),
            suspects: zero.clone(),
            lost: zero,
            found: CheckSummary::default(),
        })
    }

    /// After round r's harvest, whose log is `log` (the guest running, or
    /// paused with `last`).
    ///
    /// # Errors
    /// [`MigrateError::Setup`] if a slot lies outside guest memory.
    pub fn round<S: MemslotStore, F: KnownFormat>(
        &mut self,
        vm: &Vm<S, F>,
        log: &[Vec<u64>],
        last: bool,
    ) -> Result<(), MigrateError> {
        let changed = self.hashes.changed(vm).map_err(err)?;
        self.found.rounds += 1;
        for (s, slot) in vm.slots().iter().enumerate() {
            for (i, &c) in changed[s].iter().enumerate() {
                let now = log[s].get(i).copied().unwrap_or(0);
                let prev = self.prev_log[s][i];
                self.found.changed += u64::from(c.count_ones());
                let late = self.suspects[s][i] & !now;
                let fresh = c & !prev & !now;
                // Paused: nothing later can log this round's changes.
                let lost = (late | if last { fresh } else { 0 }) & !self.lost[s][i];
                self.lost[s][i] |= lost;
                self.suspects[s][i] = if last { 0 } else { fresh };
                if lost != 0 {
                    self.found.lost += u64::from(lost.count_ones());
                    let page = i as u64 * 64 + u64::from(lost.trailing_zeros());
                    self.found
                        .first_lost_gpa
                        .get_or_insert(slot.gpa + page * 4096);
                }
                self.prev_log[s][i] = now;
            }
        }
        Ok(())
    }
}
