//! The engine of `s2mmu dirty-log-perf`: KVM's `dirty_log_perf_test` flow
//! on the simulated VM ([`run`]), and the figures it returns ([`EngineRun`]);
//! the same flow on QEMU's arm64 model ([`arm64`]); the rotating orders
//! the comparisons run it in ([`schedule`]).

pub mod arm64;
pub mod arm64_rows;
mod bounds;
mod engine_run;
pub mod rows;
mod running;
pub mod schedule;
mod spec;

pub use bounds::{
    check, check_guest_memory, GPA_BASE, IPA_BITS, MAX_ITERATIONS, MAX_SLOTS, MAX_VCPUS,
};
pub use engine_run::{capitalise, median_dirty, secs, EngineIteration, EngineRun};
pub use running::{label, run};
pub use spec::RunSpec;
