//! What is left of the in-process pre-copy driver (`driver::migrate`,
//! retired: migrations and snapshots run through [`crate::session`]): the
//! policy that the Linux post-copy path (`s2mmu_arm64::linux::postcopy`,
//! and `linux::session_run`'s use of it) still takes. It goes with them
//! when they move onto the session.

/// Most pre-copy rounds a policy may ask for.
pub const MAX_ROUNDS: u32 = 1000;

/// When pre-copy stops and the switch begins.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// Pre-copy rounds after round 0 at most, 0..=[`MAX_ROUNDS`].
    pub max_rounds: u32,
    /// Stop pre-copy once a harvest finds at most this many pages.
    pub switch_below_pages: u64,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            max_rounds: 8,
            switch_below_pages: 256,
        }
    }
}
