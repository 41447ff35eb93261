//! The one JSON shape every benchmark prints with `--json`, and the
//! formatting helpers the benchmarks share (the statistics are in
//! [`crate::stats`], re-exported here for the commands that import them
//! from this module).

pub use s2mmu_bench::report::{
    cpu_model, host, kernel_release, merge, set_revision, Comparison, Report,
};
pub use s2mmu_bench::stats::{paired_ratio, paired_ratios, Samples, Summary};
pub use s2mmu_bench::text::{human, secs, verdict};

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
