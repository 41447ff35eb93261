//! The figures of one engine run (per dirty iteration and per phase) and
//! the selftest's text lines for them.

use s2mmu::mmu::FaultStats;
use std::time::Duration;

use s2mmu_migrate::sim::lost_write as lost;

/// One dirty iteration of the engine run.
#[derive(Clone, Debug, Default)]
pub struct EngineIteration {
    /// Wall time until the slowest vCPU finished the pass.
    pub dirty_memory: Duration,
    /// GET (or ring harvest) time.
    pub get: Duration,
    /// CLEAR (or ring reset) time, with manual protect or rings.
    pub clear: Option<Duration>,
    /// Pages the log reported dirty.
    pub pages_dirty: u64,
    /// Fault and lock counters of the pass, all vCPUs.
    pub faults: FaultStats,
    /// Sum over vCPUs of their pass times.
    pub vcpu_time: Duration,
    /// CPU time of the harvesting thread in GET and CLEAR (or the ring
    /// harvest and reset).
    pub harvest_cpu: Duration,
    /// With `--check` on the engine: pages changed in the pass, and those
    /// of them missing from the log.
    pub lost_writes: Option<lost::Round>,
}

/// One engine run.
#[derive(Clone, Debug, Default)]
pub struct EngineRun {
    /// Policy label.
    pub label: String,
    /// vCPUs.
    pub vcpus: usize,
    /// Populate memory time.
    pub populate: Duration,
    /// The median of three passes with logging off after populating, when
    /// asked for.
    pub off_pass: Option<Duration>,
    /// Enabling dirty logging time.
    pub enable: Duration,
    /// Iterations.
    pub iterations: Vec<EngineIteration>,
    /// Disabling dirty logging time.
    pub disable: Duration,
    /// With `--after-pass`: the first pass after logging stops, and the
    /// vCPU faults it took (huge pages refaulted or collapsed in place).
    pub after: Option<(Duration, FaultStats)>,
    /// Guest-physical test memory.
    pub test_gpa: (u64, u64),
    /// Counters of VM-wide operations (enable, clears): eager split time.
    pub vm_stats: FaultStats,
}

impl EngineRun {
    /// Phases named as `s2mmu_kvm::DirtyLogReport::phases` names them.
    pub fn phases(&self, ring: bool) -> Vec<(String, Duration)> {
        let (g, c) = harvest_names(ring);
        let mut v = vec![
            ("populate memory".to_string(), self.populate),
            ("enabling dirty logging".to_string(), self.enable),
        ];
        for (i, it) in self.iterations.iter().enumerate() {
            let n = i + 1;
            v.push((format!("iteration {n} dirty memory"), it.dirty_memory));
            v.push((format!("iteration {n} {g}"), it.get));
            if let Some(cl) = it.clear {
                v.push((format!("iteration {n} {c}"), cl));
            }
        }
        v.push(("disabling dirty logging".to_string(), self.disable));
        v.push((
            format!("{g} total"),
            self.iterations.iter().map(|i| i.get).sum(),
        ));
        if self.iterations.iter().any(|i| i.clear.is_some()) {
            v.push((
                format!("{c} total"),
                self.iterations.iter().filter_map(|i| i.clear).sum(),
            ));
        }
        v
    }

    /// Fault counters of all dirty iterations.
    pub fn fault_totals(&self) -> FaultStats {
        let mut t = FaultStats::default();
        for it in &self.iterations {
            t.add(&it.faults);
        }
        t
    }

    /// The selftest's totals of the harvests `g` and of the clears `c`
    /// (when any pass cleared) over every iteration, appended to `out`.
    pub(super) fn push_totals(&self, (g, c): (&str, &str), out: &mut Vec<String>) {
        let s = secs;
        let n = self.iterations.len().max(1) as u32;
        let total = |name: &str, t: Duration| {
            format!(
                "{} over {} iterations took {}. (Avg {}/iteration)",
                capitalise(name),
                self.iterations.len(),
                s(t),
                s(t / n)
            )
        };
        out.push(total(g, self.iterations.iter().map(|i| i.get).sum()));
        if self.iterations.iter().any(|i| i.clear.is_some()) {
            out.push(total(
                c,
                self.iterations.iter().filter_map(|i| i.clear).sum(),
            ));
        }
    }

    /// The selftest's lines on the setup: the test memory, populating it
    /// and enabling the log, then a blank line.
    pub(super) fn setup_lines(&self) -> [String; 4] {
        [
            format!(
                "guest physical test memory: [{:#x}, {:#x})",
                self.test_gpa.0, self.test_gpa.1
            ),
            format!("Populate memory time: {}", secs(self.populate)),
            format!("Enabling dirty logging time: {}", secs(self.enable)),
            String::new(),
        ]
    }

    /// The selftest's lines plus the engine's counters.
    pub fn lines(&self, ring: bool) -> Vec<String> {
        let s = secs;
        let mut out = vec![
            format!("Test iterations: {}", self.iterations.len()),
            format!("Engine: {}, {} vCPUs", self.label, self.vcpus),
        ];
        out.extend(self.setup_lines());
        let (g, c) = harvest_names(ring);
        for (i, it) in self.iterations.iter().enumerate() {
            let n = i + 1;
            out.push(format!(
                "Iteration {n} dirty memory time: {}",
                s(it.dirty_memory)
            ));
            out.push(format!(
                "Iteration {n} faults: {} ({} fast, {} slow, {} split on fault), lock contentions {}, pages dirty {}",
                it.faults.permission + it.faults.translation,
                it.faults.fast,
                it.faults.slow,
                it.faults.splits_on_fault,
                it.faults.contentions(),
                it.pages_dirty
            ));
            out.push(format!("Iteration {n} {g} time: {}", s(it.get)));
            if let Some(cl) = it.clear {
                out.push(format!("Iteration {n} {c} time: {}", s(cl)));
            }
            if let Some(l) = it.lost_writes {
                out.push(format!(
                    "Iteration {n} lost-write check: {} pages changed, {} of them not in the log: {}",
                    l.changed,
                    l.lost,
                    if l.lost == 0 { "ok" } else { "LOST WRITES" }
                ));
            }
        }
        out.push(format!("Disabling dirty logging time: {}", s(self.disable)));
        if let Some((t, f)) = &self.after {
            out.push(format!(
                "Pass after logging stopped: {} ({} faults: {} translation; {} blocks collapsed in place)",
                s(*t),
                f.fast + f.slow,
                f.translation,
                self.vm_stats.collapsed
            ));
        }
        self.push_totals((g, c), &mut out);
        out
    }
}

/// The phase name with its first letter in upper case.
/// The names of a harvest and of its clear, as the selftest prints them:
/// a dirty ring's (`ring`) or a dirty log's.
pub(super) fn harvest_names(ring: bool) -> (&'static str, &'static str) {
    if ring {
        ("harvest dirty ring", "reset dirty ring")
    } else {
        ("get dirty log", "clear dirty log")
    }
}

pub fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
        .unwrap_or_default()
}

/// Seconds with nine decimals, as the selftests print them.
pub fn secs(d: Duration) -> String {
    format!("{}.{:09}s", d.as_secs(), d.subsec_nanos())
}

/// The median dirty memory time of a run's iterations (after the first
/// when there are several).
pub fn median_dirty(r: &EngineRun) -> Duration {
    // Iteration 1 after enabling logging includes first-touch effects of
    // protection; the steady state is the later iterations when there are any.
    let its: Vec<Duration> = r
        .iterations
        .iter()
        .skip(usize::from(r.iterations.len() > 1))
        .map(|i| i.dirty_memory)
        .collect();
    crate::stats::Summary::of(&its).median
}
