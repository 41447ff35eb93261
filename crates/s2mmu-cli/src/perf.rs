//! The benchmark subcommands of the engine on the simulated VM (and real
//! KVM or the arm64 model where a flag asks): each module holds one
//! subcommand's options (`Params`/`Args`) and its `main`.

pub mod dirty_log_perf;
pub mod dirty_views;
pub mod harvest_perf;
pub mod memslot_perf;
pub mod split_perf;
pub mod tlb_perf;
