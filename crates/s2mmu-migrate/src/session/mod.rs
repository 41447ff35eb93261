//! The network session: pre-copy over one or more channels, the
//! stop-and-copy, post-copy with recovery, the verification of the
//! destination's memory, and snapshots (beside a run, and of a paused guest).
//!
//! The source ([`source`]) sends the guest's memory in rounds over the
//! engine's dirty log until what is left fits the downtime budget, then
//! pauses the guest, sends the rest and the vCPU state, and checks the
//! destination's memory against its own; or it switches to post-copy
//! ([`postcopy`]). The destination (`dest`, still the simulated guest's: feature `sim`) checks the stream against
//! its own limits before it allocates anything, receives the pages
//! straight into guest memory, and resumes the guest only from a
//! complete, valid stream. The stream's format is [`crate::wire`]; its
//! connections [`crate::transport`]. What a caller sees while it runs is
//! a [`progress::Progress`] callback.

// Generic over the VM interface (crate::vm).
// Reads guest RAM word by word straight through its mapping (GuestRam)
// and prefetches it.
pub mod both_ends;
pub mod digests;
pub mod extras;
pub mod guest;
#[allow(unsafe_code)]
mod page_copy;
pub mod policy;
pub mod postcopy;
pub mod progress;
pub mod replies;
pub mod source;
pub mod timeline;

pub mod dest;
pub mod snapshot;

pub use progress::{Progress, ProgressEvent};
