//! The one JSON shape every benchmark prints with `--json`, and the
//! formatting helpers the benchmarks share (the statistics are in
//! [`crate::stats`], re-exported here for the commands that import them
//! from this module).

pub use s2mmu_bench::report::{
    cpu_model, host, kernel_release, merge, set_revision, Comparison, Report,
};
pub use s2mmu_bench::stats::{paired_ratio, paired_ratios, Samples, Summary};
use std::time::Duration;

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
