//! A boundary pass over every numeric flag of every subcommand: 0, 1, the
//! largest accepted value, one more, 2^64 - 1, 2^64, a negative number,
//! garbage and the empty string. No value may make a command panic, abort
//! or stay silent for more than 5 s: each run is stopped as soon as it has
//! said something (a refusal, its start line or its output), so a valid
//! run at a large value costs a fraction of a second.
//!
//! The other flags keep small values (`smalls`) so that a valid run is a
//! short one. Values that break the bounds today in commands this suite
//! does not own are in `#[ignore]`d tests with the reason.

mod cli_common;

use cli_common::{around, boundary};

/// The boundary pass over `flag` of `cmd`: `smalls` but `flag`, then
/// `flag value` for each value.
fn pass(cmd: &str, smalls: &[(&str, &str)], flag: &str, values: &[String]) -> Vec<String> {
    let base: Vec<&str> = smalls
        .iter()
        .filter(|(f, _)| *f != flag)
        .flat_map(|(f, v)| [*f, *v])
        .filter(|w| !w.is_empty())
        .collect();
    let values: Vec<&str> = values.iter().map(String::as_str).collect();
    boundary(cmd, &base, flag, &values)
}

fn values(extra: &[&str]) -> Vec<String> {
    extra.iter().map(|s| s.to_string()).collect()
}

fn check(failures: Vec<String>) {
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn split_perf_boundaries() {
    let smalls = [
        ("--size", "32M"),
        ("--granule", "16k"),
        ("--runs", "1"),
        ("--json", ""),
    ];
    let mut bad = pass("split-perf", &smalls, "--size", &around("255T", "256T"));
    bad.extend(pass(
        "split-perf",
        &smalls,
        "--size",
        &values(&["1P", "16E", "17E"]),
    ));
    bad.extend(pass(
        "split-perf",
        &smalls,
        "--runs",
        &around("1000", "1001"),
    ));
    check(bad);
}

#[test]
fn tlb_perf_boundaries() {
    let smalls = [
        ("--size", "1G"),
        ("--chunk", "256M"),
        ("--runs", "1"),
        ("--vcpus", "1"),
        ("--vcpu-mem", "64K"),
        ("--settle-us", "100"),
        ("--json", ""),
    ];
    let cmd = "tlb-perf";
    let mut bad = pass(cmd, &smalls, "--size", &around("256T", "257T"));
    bad.extend(pass(cmd, &smalls, "--chunk", &around("1G", "2G")));
    bad.extend(pass(cmd, &smalls, "--runs", &around("1000", "1001")));
    bad.extend(pass(cmd, &smalls, "--vcpus", &around("64", "65")));
    bad.extend(pass(cmd, &smalls, "--vcpu-mem", &around("1G", "16E")));
    bad.extend(pass(
        cmd,
        &smalls,
        "--dirty-every",
        &around("262144", "262145"),
    ));
    bad.extend(pass(
        cmd,
        &smalls,
        "--limit-pages",
        &around("4503599627370495", "4503599627370496"),
    ));
    bad.extend(pass(
        cmd,
        &smalls,
        "--settle-us",
        &around("1000000", "1000001"),
    ));
    bad.extend(pass(
        cmd,
        &smalls,
        "--idle-us",
        &around("1000000", "1000001"),
    ));
    check(bad);
}

#[test]
fn harvest_perf_boundaries() {
    let smalls = [("--size", "2M"), ("--runs", "1"), ("--json", "")];
    let cmd = "harvest-perf";
    let mut bad = pass(cmd, &smalls, "--size", &around("256G", "257G"));
    bad.extend(pass(cmd, &smalls, "--runs", &around("100", "101")));
    bad.extend(pass(cmd, &smalls, "--dirty-every", &around("512", "513")));
    bad.extend(pass(
        cmd,
        &smalls,
        "--sparse-clear-runs",
        &around("512", "513"),
    ));
    check(bad);
}

#[test]
fn memslot_perf_boundaries() {
    let smalls = [
        ("-s", "10"),
        ("-r", "1"),
        ("-l", "0.01"),
        ("--single-ops", "1"),
        ("--lookups", "1000"),
        ("--json", ""),
    ];
    let cmd = "memslot-perf";
    let mut bad = pass(cmd, &smalls, "-s", &around("32764", "32765"));
    bad.extend(pass(cmd, &smalls, "-r", &around("100", "101")));
    bad.extend(pass(
        cmd,
        &smalls,
        "-l",
        &values(&[
            "0", "1e-300", "60", "60.001", "1e308", "nan", "inf", "-1", "x", "",
        ]),
    ));
    bad.extend(pass(
        cmd,
        &smalls,
        "--single-ops",
        &around("100000", "100001"),
    ));
    bad.extend(pass(
        cmd,
        &smalls,
        "--lookups",
        &around("10000000", "10000001"),
    ));
    check(bad);
}

#[test]
fn dirty_log_perf_boundaries() {
    let smalls = [("-v", "1"), ("-b", "4M"), ("-i", "1"), ("--json", "")];
    let cmd = "dirty-log-perf";
    let mut bad = pass(
        cmd,
        &smalls,
        "-v",
        &values(&["0", "1", "64", "18446744073709551616", "-1", "x", ""]),
    );
    bad.extend(pass(
        cmd,
        &smalls,
        "-b",
        &values(&["0", "1", "4K", "1P", "16E", "17E", "-1", "x", ""]),
    ));
    bad.extend(pass(
        cmd,
        &smalls,
        "-i",
        &values(&["0", "1", "4294967296", "-1", "x", ""]),
    ));
    bad.extend(pass(cmd, &smalls, "-x", &around("512", "4294967296")));
    bad.extend(pass(cmd, &smalls, "-w", &around("100", "101")));
    bad.extend(pass(cmd, &smalls, "--ring", &around("65536", "65537")));
    check(bad);
}

#[test]
fn dirty_log_perf_huge_counts_stay_in_bounds() {
    let smalls = [("-v", "1"), ("-b", "4M"), ("-i", "1"), ("--json", "")];
    let mut bad = pass(
        "dirty-log-perf",
        &smalls,
        "-v",
        &values(&["18446744073709551615", "100000"]),
    );
    bad.extend(pass(
        "dirty-log-perf",
        &smalls,
        "-i",
        &values(&["4294967295"]),
    ));
    check(bad);
}

#[test]
fn migrate_boundaries() {
    let smalls = [
        ("--no-tls", ""),
        ("--mem", "8M"),
        ("-v", "1"),
        ("--warmup", "0ms"),
        ("--run-after", "0ms"),
        ("--plot", "boundaries-migrate.svg"),
    ];
    let cmd = "migrate";
    // --mem at its largest (64G) is left out: a valid run prefaults the
    // whole guest, which this shared machine cannot spare.
    let mut bad = pass(
        cmd,
        &smalls,
        "--mem",
        &values(&["0", "1", "4K", "64G1", "1P", "16E", "17E", "-1", "x", ""]),
    );
    bad.extend(pass(cmd, &smalls, "-v", &around("256", "257")));
    bad.extend(pass(cmd, &smalls, "-x", &around("512", "513")));
    bad.extend(pass(cmd, &smalls, "--max-rounds", &around("1000", "1001")));
    bad.extend(pass(
        cmd,
        &smalls,
        "--ring-entries",
        &around("65536", "4294967296"),
    ));
    bad.extend(pass(cmd, &smalls, "--clear-chunk", &around("64G", "65G")));
    bad.extend(pass(cmd, &smalls, "--dirty-rate", &around("1T", "2T")));
    bad.extend(pass(cmd, &smalls, "--bandwidth", &around("1T", "2T")));
    bad.extend(pass(cmd, &smalls, "--attempts", &around("1000", "1001")));
    bad.extend(pass(cmd, &smalls, "--channels", &around("64", "65")));
    for flag in ["--io-timeout", "--max-downtime", "--warmup", "--run-after"] {
        bad.extend(pass(
            cmd,
            &smalls,
            flag,
            &values(&["0s", "1ms", "1000000000s", "-1s", "x", ""]),
        ));
    }
    check(bad);
}

#[test]
fn migrate_json_is_not_silent_for_long() {
    let smalls = [
        ("--no-tls", ""),
        ("--mem", "8M"),
        ("-v", "1"),
        ("--warmup", "0ms"),
        ("--run-after", "0ms"),
        ("--plot", "boundaries-migrate.svg"),
        ("--json", ""),
    ];
    check(pass("migrate", &smalls, "--bandwidth", &values(&["1"])));
}

#[test]
fn dirty_views_boundaries() {
    let smalls = [("--mem", "4M"), ("--vcpus", "1"), ("--ticks", "1")];
    let cmd = "dirty-views";
    let mut bad = pass(
        cmd,
        &smalls,
        "--mem",
        &values(&["0", "1", "4M", "16G1", "1P", "17E", "-1", "x", ""]),
    );
    bad.extend(pass(cmd, &smalls, "--vcpus", &around("64", "65")));
    bad.extend(pass(cmd, &smalls, "--ticks", &around("100000", "100001")));
    bad.extend(pass(cmd, &smalls, "--tick-ms", &around("10000", "10001")));
    bad.extend(pass(
        cmd,
        &smalls,
        "--view-periods",
        &around("1000", "1001"),
    ));
    check(bad);
}

#[test]
fn snapshot_boundaries() {
    let smalls = [
        ("--mem", "4M"),
        ("-v", "1"),
        ("--duration", "10ms"),
        ("--every", "5ms"),
        ("--dir", "boundaries-snapshots"),
    ];
    let cmd = "snapshot";
    let mut bad = pass(
        cmd,
        &smalls,
        "--mem",
        &values(&["0", "1", "4M", "16G1", "1P", "17E", "-1", "x", ""]),
    );
    bad.extend(pass(cmd, &smalls, "-v", &around("64", "65")));
    bad.extend(pass(cmd, &smalls, "--dirty-rate", &around("1G", "16E")));
    for flag in ["--every", "--duration"] {
        bad.extend(pass(
            cmd,
            &smalls,
            flag,
            &values(&["0s", "1ms", "10s", "1000000000s", "-1s", "x", ""]),
        ));
    }
    check(bad);
}
