//! The one JSON shape every benchmark prints with `--json`, and the
//! formatting helpers the benchmarks share (the statistics are in
//! [`crate::stats`], re-exported here for the commands that import them
//! from this module).

pub use s2mmu_bench::stats::{paired_ratio, paired_ratios, Samples, Summary};
use serde_json::{json, Map, Value};
use std::time::Duration;

/// Facts about the machine and build a result came from.
pub fn host() -> Value {
    json!({
        "logical_cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "kernel_release": kernel_release(),
        "engine_version": env!("CARGO_PKG_VERSION"),
        "git_revision": option_env!("S2MMU_GIT_REV").filter(|s| !s.is_empty()),
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

    /// The report as one JSON object.
    pub fn to_json(&self) -> Value {
        json!({
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

/// Seconds with nine decimals, as the KVM selftests print them.
#[allow(dead_code)]
pub fn secs(d: Duration) -> String {
    format!("{}.{:09}s", d.as_secs(), d.subsec_nanos())
}

/// A duration in the most readable unit.
pub fn human(d: Duration) -> String {
    let ns = d.as_nanos() as f64;
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.2} us", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.3} ms", ns / 1e6)
    } else {
        format!("{:.3} s", ns / 1e9)
    }
}

/// Parses a size such as `4096`, `64K`, `2M`, `1G`, `1GiB`, `64g`, `1P`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let lower = lower.trim_end_matches("ib").trim_end_matches('b');
    let (num, mult) = match lower.chars().last() {
        Some('k') => (&lower[..lower.len() - 1], 1u64 << 10),
        Some('m') => (&lower[..lower.len() - 1], 1 << 20),
        Some('g') => (&lower[..lower.len() - 1], 1 << 30),
        Some('t') => (&lower[..lower.len() - 1], 1 << 40),
        Some('p') => (&lower[..lower.len() - 1], 1 << 50),
        Some('e') => (&lower[..lower.len() - 1], 1 << 60),
        _ => (lower, 1),
    };
    let n: u64 = num.trim().parse().map_err(|_| {
        format!("invalid size '{s}': expected a number with an optional K/M/G/T/P/E suffix")
    })?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size '{s}' is too large"))
}

pub use s2mmu_bench::human_bytes;

/// "PASS"/"MISS" for a target line.
pub fn verdict(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "MISS"
    }
}

/// Prints a report: its text, or its JSON envelope with `json`. A closed
/// pipe (`| head`) is not an error worth a panic.
pub fn emit(report: &Report, json: bool) {
    use std::io::Write;
    let out = if json {
        let mut s = serde_json::to_string_pretty(&report.to_json()).expect("serialisable");
        s.push('\n');
        s
    } else {
        report.text().to_string()
    };
    let _ = std::io::stdout().lock().write_all(out.as_bytes());
}
