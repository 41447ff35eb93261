//! Operations on a [`PageTable`](crate::PageTable), one file each, every one a
//! small visitor on the generic walker.

pub mod attr;
pub mod collapse;
mod hw_clean;
mod hw_scan;
pub mod map;
pub mod split;
pub mod unmap;

pub use attr::RelaxOutcome;
pub use collapse::CollapseStats;
pub use map::{MapOptions, MapStats};
pub use split::{SplitPolicy, SplitStats};
pub use unmap::UnmapStats;
