//! The library half of the `s2mmu` command: what integration tests reach.
//! The subcommands that are only benchmarks live in the binary.
//!
//! Not an API to build on: the engine is the `s2mmu` crate, migration is
//! `s2mmu-migrate`, the arm64 model and its Linux guest are `s2mmu-arm64`,
//! the benchmarks' engines are `s2mmu-bench`. What is here is the
//! command's own part:
//! - [`flags`]: the values every subcommand's flags share (durations with
//!   a unit, the MMU policy, which options were given; `docs/cli.md` lists
//!   the vocabulary), and [`limits`], the bounds checked before anything
//!   is allocated;
//! - [`migrate`]: `s2mmu migrate`'s options, guest choice and reports;
//!   [`snapshot`]: `s2mmu snapshot`;
//! - [`report`]: the JSON envelope every `--json` prints, and the text
//!   helpers (the SVG and PNG figures of `--plot FILE` are `s2mmu-plot`'s);
//!   [`progress`]: the progress line on a terminal.

pub use s2mmu_bench::dirty_mode;
pub mod flags;
pub mod limits;
pub mod migrate;
pub mod progress;
pub mod report;
pub mod snapshot;
pub use s2mmu_bench::stats;
pub mod vm_format;
