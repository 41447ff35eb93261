//! The benchmarks' JSON envelope and size helpers.
use s2mmu_cli::report::{human_bytes, parse_size, Report};
use serde_json::json;

#[test]
fn sizes_parse() {
    assert_eq!(parse_size("4096").unwrap(), 4096);
    assert_eq!(parse_size("1G").unwrap(), 1 << 30);
    assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
    assert_eq!(parse_size("64k").unwrap(), 64 << 10);
    assert_eq!(parse_size("2MB").unwrap(), 2 << 20);
    assert!(parse_size("x").unwrap_err().contains("invalid size"));
    assert!(parse_size("99999999999T").is_err());
    assert_eq!(human_bytes(1 << 30), "1GiB");
    assert_eq!(human_bytes(3 << 20), "3MiB");
}

#[test]
fn envelope_has_every_field() {
    let mut r = Report::new("x", json!({"a": 1}));
    r.result("c", "p", json!({"median_ns": 5}));
    let c = r.compare("c", "median_ns", 10.0, 5.0);
    assert_eq!(c.speedup, 2.0);
    assert_eq!(c.improvement_pct, 50.0);
    let j = r.to_json();
    for k in [
        "command",
        "version",
        "benchmark",
        "params",
        "host",
        "results",
        "comparisons",
    ] {
        assert!(j.get(k).is_some(), "{k}");
    }
    assert_eq!(j["results"][0]["case"], "c");
    assert_eq!(j["results"][0]["median_ns"], 5);
    assert_eq!(j["comparisons"][0]["speedup"], 2.0);
}
