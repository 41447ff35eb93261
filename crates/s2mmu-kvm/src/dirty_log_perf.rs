//! `dirty_log_perf_test` on real vCPUs: the memstress workload with dirty logging, phase by
//! phase, returning measured figures as plain data.
//!
//! One host thread per vCPU runs `KVM_RUN` until the guest rings the doorbell at the end of
//! a pass, records the pass, and spins until the main thread publishes the next iteration,
//! exactly the lockstep of the selftest: GET and CLEAR happen while every vCPU is parked in
//! userspace.

mod params;
mod report;
mod run;
pub use params::DirtyLogParams;
pub use report::{fmt_secs, DirtyLogReport, IterationReport, Observer, PassCounts};
pub use run::{run, run_observed};
