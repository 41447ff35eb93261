//! The source's choices that other modules name too (the extras check
//! them against the harvest): a leaf, so that the source's settings and
//! the work beside it need not import each other.

/// How the session collects dirty pages: not a list of dirty modes but
/// the collection method a mode implies (`sim::source::session_harvest`
/// derives it from the engine's [`s2mmu::mmu::DirtyMode`]: rings are
/// reaped, every other mode, write protection, hardware dirty state and
/// PML alike, is read by GET and CLEAR of bitmaps). The Linux guest's
/// session, whose log is write protection with manual protect, sets
/// `Bitmap`. A new dirty mode adds a variant here only if it is collected
/// in a new way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Harvest {
    /// `KVM_GET_DIRTY_LOG` per round, `KVM_CLEAR_DIRTY_LOG` per chunk just
    /// before the chunk's pages are sent (QEMU's clear_bmap).
    Bitmap,
    /// Per-vCPU dirty rings, reaped whenever one fills and at each round.
    Ring,
}

/// What the source does when the guest dirties memory faster than the
/// link drains it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Converge {
    /// QEMU's auto-converge: throttle the vCPUs (20 %, then +10 % per
    /// round, up to 99 %) after two rounds that dirtied more than half of
    /// what they sent.
    Auto,
    /// QEMU's dirty-limit: cap each vCPU's dirty rate (its pace) to a
    /// quarter of the link, halving it on every further such round.
    DirtyLimit,
    /// Nothing: a guest that outruns the link fails at the round limit.
    None,
}
