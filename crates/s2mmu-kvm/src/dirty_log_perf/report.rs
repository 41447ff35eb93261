//! What one run measured: the counts of each pass, each iteration's
//! phases and the run's report.

use super::params::DirtyLogParams;
use crate::sys::VcpuCounters;
use std::time::Duration;

/// Counts for one pass, summed over vCPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassCounts {
    /// Returns from `KVM_RUN` to userspace that were the doorbell (one per vCPU per pass).
    pub userspace_mmio_exits: u64,
    /// `KVM_EXIT_DIRTY_RING_FULL` returns (dirty ring only).
    pub userspace_ring_full_exits: u64,
    /// Other returns to userspace (interruptions).
    pub userspace_other_exits: u64,
    /// KVM's per-vCPU binary statistics over the pass (None where unavailable): `exits`
    /// counts every VM exit, including the write-protection faults handled in the kernel.
    pub kvm: VcpuCounters,
}

impl PassCounts {
    pub(super) fn add(&self, other: &PassCounts) -> PassCounts {
        PassCounts {
            userspace_mmio_exits: self.userspace_mmio_exits + other.userspace_mmio_exits,
            userspace_ring_full_exits: self.userspace_ring_full_exits
                + other.userspace_ring_full_exits,
            userspace_other_exits: self.userspace_other_exits + other.userspace_other_exits,
            kvm: self.kvm.add(&other.kvm),
        }
    }
}

/// One dirty iteration (the selftest's "Iteration N ..." lines).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IterationReport {
    /// 1-based iteration number.
    pub iteration: u32,
    /// From publishing the iteration until the slowest vCPU finished its pass.
    pub dirty_memory: Duration,
    /// `KVM_GET_DIRTY_LOG` on every slot (dirty ring: harvesting every ring into bitmaps).
    pub get_dirty_log: Duration,
    /// `KVM_CLEAR_DIRTY_LOG` of every whole slot (manual protect only; dirty ring:
    /// `KVM_RESET_DIRTY_RINGS`).
    pub clear_dirty_log: Option<Duration>,
    /// Pages the guest wrote in this pass (replayed on the host from the guest's RNG).
    pub pages_written: u64,
    /// Bits set in the harvested bitmaps.
    pub pages_dirty: u64,
    /// Exits during the pass, summed over vCPUs.
    pub exits: PassCounts,
}

/// Everything one run measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirtyLogReport {
    /// The parameters it ran with.
    pub params: DirtyLogParams,
    /// The `MANUAL_DIRTY_LOG_PROTECT2` bits enabled (0 when manual protect is off).
    pub manual_caps: u64,
    /// Guest-physical range of the test memory.
    pub test_gpa: (u64, u64),
    /// Pages in the test memory.
    pub total_pages: u64,
    /// Thread start up to the last vCPU finishing pass 0 (all first-touch faults).
    pub populate: Duration,
    /// Exits during population.
    pub populate_exits: PassCounts,
    /// Turning `KVM_MEM_LOG_DIRTY_PAGES` on for every slot.
    pub enable_dirty_logging: Duration,
    /// The dirty iterations.
    pub iterations: Vec<IterationReport>,
    /// Turning dirty logging off for every slot.
    pub disable_dirty_logging: Duration,
}

impl DirtyLogReport {
    /// Every timed phase, named as in the selftest's output (lower case, without "time"),
    /// so a comparison can join these with the engine's figures by name: `populate
    /// memory`, `enabling dirty logging`, `iteration N dirty memory`, `iteration N get
    /// dirty log`, `iteration N clear dirty log`, `disabling dirty logging`, `get dirty
    /// log total`, `clear dirty log total` (dirty ring: `harvest dirty ring`, `reset dirty
    /// ring`).
    pub fn phases(&self) -> Vec<(String, Duration)> {
        let (get_name, clear_name) = self.collect_names();
        let mut out = vec![
            ("populate memory".to_string(), self.populate),
            (
                "enabling dirty logging".to_string(),
                self.enable_dirty_logging,
            ),
        ];
        for it in &self.iterations {
            let n = it.iteration;
            out.push((format!("iteration {n} dirty memory"), it.dirty_memory));
            out.push((format!("iteration {n} {get_name}"), it.get_dirty_log));
            if let Some(clear) = it.clear_dirty_log {
                out.push((format!("iteration {n} {clear_name}"), clear));
            }
        }
        out.push((
            "disabling dirty logging".to_string(),
            self.disable_dirty_logging,
        ));
        out.push((format!("{get_name} total"), self.get_dirty_log_total()));
        if let Some(clear) = self.clear_dirty_log_total() {
            out.push((format!("{clear_name} total"), clear));
        }
        out
    }

    fn collect_names(&self) -> (&'static str, &'static str) {
        if self.params.dirty_ring_entries.is_some() {
            ("harvest dirty ring", "reset dirty ring")
        } else {
            ("get dirty log", "clear dirty log")
        }
    }

    /// Sum of the GET times.
    pub fn get_dirty_log_total(&self) -> Duration {
        self.iterations.iter().map(|i| i.get_dirty_log).sum()
    }

    /// Sum of the CLEAR times (None without manual protect).
    pub fn clear_dirty_log_total(&self) -> Option<Duration> {
        self.iterations.iter().map(|i| i.clear_dirty_log).sum()
    }

    /// Sum of the dirty-memory times.
    pub fn dirty_memory_total(&self) -> Duration {
        self.iterations.iter().map(|i| i.dirty_memory).sum()
    }

    /// `total / iterations`.
    pub fn average(total: Duration, iterations: usize) -> Duration {
        total / u32::try_from(iterations.max(1)).unwrap_or(u32::MAX)
    }

    /// The run in the selftest's output format, one line per element (the dirty-memory
    /// lines are followed by the exits of the pass, which the selftest does not print).
    pub fn selftest_lines(&self) -> Vec<String> {
        let s = fmt_secs;
        let (get_name, clear_name) = self.collect_names();
        let mut out = vec![
            format!("Test iterations: {}", self.iterations.len()),
            "Testing guest mode: PA-bits:ANY, VA-bits:48,  4K pages".to_string(),
            format!(
                "guest physical test memory: [{:#x}, {:#x})",
                self.test_gpa.0, self.test_gpa.1
            ),
            format!("Populate memory time: {}", s(self.populate)),
            format!(
                "Enabling dirty logging time: {}",
                s(self.enable_dirty_logging)
            ),
            String::new(),
        ];
        for it in &self.iterations {
            let n = it.iteration;
            out.push(format!(
                "Iteration {n} dirty memory time: {}",
                s(it.dirty_memory)
            ));
            out.push(format!(
                "Iteration {n} exits: {} (KVM stat 'exits'), {} write faults fixed \
                 ('pf_fixed'), {} doorbell MMIO exits{}; pages written {}, pages dirty {}",
                opt(it.exits.kvm.exits),
                opt(it.exits.kvm.pf_fixed),
                it.exits.userspace_mmio_exits,
                if self.params.dirty_ring_entries.is_some() {
                    format!(
                        ", {} ring-full exits (harvested and reset inside the pass)",
                        it.exits.userspace_ring_full_exits
                    )
                } else {
                    String::new()
                },
                it.pages_written,
                it.pages_dirty
            ));
            out.push(format!(
                "Iteration {n} {get_name} time: {}",
                s(it.get_dirty_log)
            ));
            if let Some(clear) = it.clear_dirty_log {
                out.push(format!("Iteration {n} {clear_name} time: {}", s(clear)));
            }
        }
        out.push(format!(
            "Disabling dirty logging time: {}",
            s(self.disable_dirty_logging)
        ));
        let n = self.iterations.len();
        let get = self.get_dirty_log_total();
        out.push(format!(
            "{} over {n} iterations took {}. (Avg {}/iteration)",
            capitalize(get_name),
            s(get),
            s(Self::average(get, n))
        ));
        if let Some(clear) = self.clear_dirty_log_total() {
            out.push(format!(
                "{} over {n} iterations took {}. (Avg {}/iteration)",
                capitalize(clear_name),
                s(clear),
                s(Self::average(clear, n))
            ));
        }
        out
    }
}

/// `%ld.%.9lds`, as the selftests print durations.
pub fn fmt_secs(d: Duration) -> String {
    format!("{}.{:09}s", d.as_secs(), d.subsec_nanos())
}

fn capitalize(s: &str) -> String {
    let mut chars = s.chars();
    chars.next().map_or_else(String::new, |c| {
        c.to_uppercase().collect::<String>() + chars.as_str()
    })
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| v.to_string())
}

/// Per-iteration hook: the iteration number and the harvested bitmap of every slot (as
/// returned by `KVM_GET_DIRTY_LOG`, before any clear).
pub type Observer<'a> = dyn FnMut(u32, &[Vec<u64>]) + 'a;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_the_selftest() {
        assert_eq!(fmt_secs(Duration::new(3, 5)), "3.000000005s");
    }
}
