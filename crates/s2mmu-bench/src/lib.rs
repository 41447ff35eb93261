//! The benchmark engines of the `s2mmu` command: each builds and runs what it
//! measures (simulated VMs and their vCPU threads, memslot guests, the arm64
//! model on QEMU, real KVM) and returns result structs; the command keeps
//! only its flags, the text and JSON reports and the plots.
//!
//! One module per benchmark, each with a configuration in and a result
//! struct out:
//! - [`dirty_log`]: KVM's `dirty_log_perf_test` flow on the simulated VM
//!   (`s2mmu dirty-log-perf`);
//! - [`harvest`]: the harvest of hardware dirty state on a large slot
//!   (`harvest-perf`); [`views`]: several dirty consumers over one slot
//!   (`dirty-views`);
//! - [`memslot`], [`split`], [`tlb`]: KVM's `memslot_perf_test`
//!   scenarios, eager splits, and harvest cycles under the TLB range
//!   policies (`memslot-perf`, `split-perf`, `tlb-perf`);
//! - [`arm64`]: what the measurements on the arm64 model under QEMU share;
//! - [`wire`]: the migration measured against the wire (iperf3, plain
//!   stores);
//! - [`vs_qemu`]: a Linux guest's migration, ours against QEMU 7.2's own.
//!
//! What they share: [`report::Report`], the one JSON envelope every
//! `--json` prints (`command`, `version`, `params`, `host`, `results`,
//! `comparisons`); [`text`], the units and verdicts of the text reports;
//! [`stats`], the medians; [`dirty_mode`], the names of
//! the engine's dirty-logging modes on the command line; [`host`], facts
//! about the host's memory a run may use.
//!
//! ```
//! use s2mmu_bench::report::Report;
//! use serde_json::json;
//!
//! let mut r = Report::new("my-bench", json!({"mem_bytes": 1 << 30}));
//! r.result("run 1", "default", json!({"downtime_ms": 6.4}));
//! r.compare("run 1", "downtime_ms", 8.0, 6.4);
//! let v = r.to_json();
//! assert_eq!(v["command"], "my-bench");
//! assert_eq!(v["results"][0]["downtime_ms"], 6.4);
//! assert!(v["comparisons"][0]["speedup"].as_f64().unwrap() > 1.0);
//! ```

pub mod arm64;
pub mod dirty_log;
pub mod dirty_mode;
pub mod harvest;
pub mod host;
pub mod memslot;
pub mod report;
pub mod split;
pub mod stats;
pub mod text;
pub mod tlb;
pub mod views;
pub mod vs_qemu;
pub mod wire;

/// Where an engine reports how far it got (the command draws a progress
/// bar); every method does nothing unless implemented.
pub trait Progress {
    /// One step of the run is done.
    fn step(&self) {}
    /// What runs now.
    fn message(&self, _msg: &str) {}
}

/// Makes the progress bar of one phase of a run from what runs and its
/// number of steps (the command draws them; [`no_bars`] shows nothing).
pub type Bars<'a> = &'a dyn Fn(&str, u64) -> Box<dyn Progress>;

/// A [`Bars`] that shows nothing.
pub fn no_bars(_what: &str, _steps: u64) -> Box<dyn Progress> {
    Box::new(NoProgress)
}

/// No progress shown.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoProgress;

impl Progress for NoProgress {}

/// A byte count as the largest exact unit (`1GiB`, `2MiB`, `4096B`).
pub fn human_bytes(b: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if b >= 1 << shift && b.is_multiple_of(1 << shift) {
            return format!("{}{unit}", b >> shift);
        }
    }
    format!("{b}B")
}
