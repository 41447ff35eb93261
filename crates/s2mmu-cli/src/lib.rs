//! The library half of the `s2mmu` command: what integration tests reach.
//! The subcommands that are only benchmarks live in the binary.

pub use s2mmu_bench::dirty_mode;
pub mod flags;
pub mod limits;
pub mod migrate;
pub mod plot;
pub mod progress;
pub mod report;
pub mod snapshot;
pub use s2mmu_bench::stats;
pub mod vm_format;
