//! The one JSON envelope every `s2mmu` subcommand prints with `--json`
//! ([`Report`]): `command`, `version`, `params`, `host`, `results`,
//! `comparisons`; the command's `report` module re-exports it.

use serde_json::{json, Map, Value};
use std::sync::OnceLock;

/// The git revision [`host`] reports, set once by the command
/// ([`set_revision`]).
static REVISION: OnceLock<Option<&'static str>> = OnceLock::new();

/// Sets the git revision reports carry (the command's build records it);
/// the first call wins.
pub fn set_revision(rev: Option<&'static str>) {
    let _ = REVISION.set(rev);
}

/// Facts about the machine and build a result came from.
pub fn host() -> Value {
    json!({
        "logical_cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "kernel_release": kernel_release(),
        "engine_version": env!("CARGO_PKG_VERSION"),
        "git_revision": REVISION.get().copied().flatten().filter(|s| !s.is_empty()),
        "cpu_model": cpu_model(),
        "release_build": !cfg!(debug_assertions),
    })
}

/// `uname -r`.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The CPU model name from /proc/cpuinfo.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// A benchmark's whole report: the envelope every benchmark's `--json` prints.
pub struct Report {
    benchmark: &'static str,
    params: Value,
    results: Vec<Value>,
    comparisons: Vec<Value>,
    text: String,
    failure: Option<String>,
}

impl Report {
    /// Sets the human-readable form printed without `--json`.
    pub fn set_text(&mut self, text: String) {
        self.text = text;
    }

    /// The human-readable form.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// An empty report for `benchmark` run with `params`.
    pub fn new(benchmark: &'static str, params: Value) -> Self {
        Report {
            benchmark,
            params,
            results: Vec::new(),
            comparisons: Vec::new(),
            text: String::new(),
            failure: None,
        }
    }

    /// Marks the run failed (a check that did not hold): the report is
    /// still printed, then the command exits nonzero with `why`.
    pub fn fail(&mut self, why: String) {
        self.failure.get_or_insert(why);
    }

    /// Why the run failed, if a check did not hold.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// Adds a result row; `metrics` keys carry their unit.
    pub fn result(&mut self, case: &str, policy: &str, metrics: Value) {
        let mut row = Map::new();
        row.insert("case".into(), case.into());
        row.insert("policy".into(), policy.into());
        if let Value::Object(m) = metrics {
            row.extend(m);
        }
        self.results.push(Value::Object(row));
    }

    /// Adds a baseline-against-optimized comparison and returns it.
    pub fn compare(
        &mut self,
        case: &str,
        metric: &str,
        baseline: f64,
        optimized: f64,
    ) -> Comparison {
        let c = Comparison::new(baseline, optimized);
        self.comparisons.push(json!({
            "case": case,
            "metric": metric,
            "baseline": baseline,
            "optimized": optimized,
            "speedup": finite(c.speedup),
            "improvement_pct": finite(c.improvement_pct),
        }));
        c
    }

    /// The report as one JSON object: the envelope every subcommand's
    /// `--json` prints (`command`, `version`, `params`, `host`, `results`,
    /// `comparisons`; `benchmark` repeats `command` for readers of the
    /// older form).
    pub fn to_json(&self) -> Value {
        json!({
            "command": self.benchmark,
            "version": env!("CARGO_PKG_VERSION"),
            "benchmark": self.benchmark,
            "params": self.params,
            "host": host(),
            "results": self.results,
            "comparisons": self.comparisons,
        })
    }
}

fn finite(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        Value::Null
    }
}

/// Baseline against optimized.
#[derive(Clone, Copy, Debug)]
pub struct Comparison {
    /// baseline / optimized.
    pub speedup: f64,
    /// How much smaller optimized is, in percent of baseline.
    pub improvement_pct: f64,
}

impl Comparison {
    /// Compares two measurements where smaller is better.
    pub fn new(baseline: f64, optimized: f64) -> Self {
        Comparison {
            speedup: baseline / optimized,
            improvement_pct: (baseline - optimized) / baseline * 100.0,
        }
    }
}

/// Merges two JSON objects (the second wins on equal keys).
pub fn merge(a: Value, b: Value) -> Value {
    match (a, b) {
        (Value::Object(mut a), Value::Object(b)) => {
            a.extend(b);
            Value::Object(a)
        }
        (a, _) => a,
    }
}
