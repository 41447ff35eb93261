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
use Values::{Around, List};

/// The values one flag is tried with.
enum Values {
    /// [`around`] its largest accepted value and the next one.
    Around(&'static str, &'static str),
    /// Exactly these.
    List(&'static [&'static str]),
}

impl Values {
    fn get(&self) -> Vec<String> {
        match self {
            Around(max, max_plus_one) => around(max, max_plus_one),
            List(values) => values.iter().map(|s| s.to_string()).collect(),
        }
    }
}

/// The other flags' small values while one flag is tried, per subcommand.
const SMALLS: &[(&str, &[(&str, &str)])] = &[
    (
        "split-perf",
        &[
            ("--mem", "32M"),
            ("--granule", "16k"),
            ("--runs", "1"),
            ("--json", ""),
        ],
    ),
    (
        "tlb-perf",
        &[
            ("--mem", "1G"),
            ("--chunk", "256M"),
            ("--runs", "1"),
            ("--vcpus", "1"),
            ("--vcpu-mem", "64K"),
            ("--settle", "100us"),
            ("--json", ""),
        ],
    ),
    (
        "harvest-perf",
        &[("--mem", "2M"), ("--runs", "1"), ("--json", "")],
    ),
    (
        "memslot-perf",
        &[
            ("-s", "10"),
            ("-r", "1"),
            ("--duration", "10ms"),
            ("--single-ops", "1"),
            ("--lookups", "1000"),
            ("--json", ""),
        ],
    ),
    (
        "dirty-log-perf",
        &[("-v", "1"), ("-b", "4M"), ("-i", "1"), ("--json", "")],
    ),
    ("migrate", MIGRATE_SMALLS),
    (
        "dirty-views",
        &[("--mem", "4M"), ("--vcpus", "1"), ("--ticks", "1")],
    ),
    (
        "snapshot",
        &[
            ("--mem", "4M"),
            ("-v", "1"),
            ("--duration", "10ms"),
            ("--every", "5ms"),
            ("--dir", "boundaries-snapshots"),
        ],
    ),
];

const MIGRATE_SMALLS: &[(&str, &str)] = &[
    ("--no-tls", ""),
    ("--mem", "8M"),
    ("-v", "1"),
    ("--warmup", "0ms"),
    ("--run-after", "0ms"),
    ("--plot", "boundaries-migrate.svg"),
];

/// Sizes tried on a guest memory flag whose largest valid run this machine
/// cannot spare.
const MEM_SIZES: &[&str] = &["0", "1", "4M", "16G1", "1P", "17E", "-1", "x", ""];
/// Durations tried on migrate's time flags.
const MIGRATE_DURATIONS: &[&str] = &["0s", "1ms", "1000000000s", "-1s", "x", ""];
/// Durations tried on snapshot's time flags.
const SNAPSHOT_DURATIONS: &[&str] = &["0s", "1ms", "10s", "1000000000s", "-1s", "x", ""];

/// Every boundary pass: subcommand, flag, values; one line per pass, run
/// in this order by the subcommand's test (a new subcommand needs its
/// `SMALLS` and a test calling [`run_table`]).
// One line per pass, however long: a pass added is a line added.
#[rustfmt::skip]
const FLAGS: &[(&str, &str, Values)] = &[
    ("split-perf", "--mem", Around("255T", "256T")),
    ("split-perf", "--mem", List(&["1P", "16E", "17E"])),
    ("split-perf", "--runs", Around("1000", "1001")),
    ("tlb-perf", "--mem", Around("256T", "257T")),
    ("tlb-perf", "--chunk", Around("1G", "2G")),
    ("tlb-perf", "--runs", Around("1000", "1001")),
    ("tlb-perf", "--vcpus", Around("64", "65")),
    ("tlb-perf", "--vcpu-mem", Around("1G", "16E")),
    ("tlb-perf", "--dirty-every", Around("262144", "262145")),
    ("tlb-perf", "--limit-pages", Around("4503599627370495", "4503599627370496")),
    ("tlb-perf", "--settle", List(&["0s", "1s", "1001ms", "18446744073709551616s", "-1s", "1", "x", ""])),
    ("tlb-perf", "--idle", List(&["0s", "1s", "1001ms", "18446744073709551616s", "-1s", "1", "x", ""])),
    ("harvest-perf", "--mem", Around("256G", "257G")),
    ("harvest-perf", "--runs", Around("100", "101")),
    ("harvest-perf", "--dirty-every", Around("512", "513")),
    ("harvest-perf", "--sparse-clear-runs", Around("512", "513")),
    ("memslot-perf", "-s", Around("32764", "32765")),
    ("memslot-perf", "-r", Around("100", "101")),
    ("memslot-perf", "--duration", List(&["0s", "1e-300s", "60s", "60.001s", "1e308s", "nans", "infs", "-1s", "1", "x", ""])),
    ("memslot-perf", "--single-ops", Around("100000", "100001")),
    ("memslot-perf", "--lookups", Around("10000000", "10000001")),
    ("dirty-log-perf", "-v", List(&["0", "1", "64", "18446744073709551616", "-1", "x", ""])),
    ("dirty-log-perf", "-b", List(&["0", "1", "4K", "1P", "16E", "17E", "-1", "x", ""])),
    ("dirty-log-perf", "-i", List(&["0", "1", "4294967296", "-1", "x", ""])),
    ("dirty-log-perf", "-x", Around("512", "4294967296")),
    ("dirty-log-perf", "-w", Around("100", "101")),
    ("dirty-log-perf", "--ring", Around("65536", "65537")),
    // --mem at its largest (64G) is left out: a valid run prefaults the
    // whole guest, which this shared machine cannot spare.
    ("migrate", "--mem", List(&["0", "1", "4K", "64G1", "1P", "16E", "17E", "-1", "x", ""])),
    ("migrate", "-v", Around("256", "257")),
    ("migrate", "-x", Around("512", "513")),
    ("migrate", "--max-rounds", Around("1000", "1001")),
    ("migrate", "--ring-entries", Around("65536", "4294967296")),
    ("migrate", "--clear-chunk", Around("64G", "65G")),
    ("migrate", "--dirty-rate", Around("1T", "2T")),
    ("migrate", "--bandwidth", Around("1T", "2T")),
    ("migrate", "--attempts", Around("1000", "1001")),
    ("migrate", "--channels", Around("64", "65")),
    ("migrate", "--io-timeout", List(MIGRATE_DURATIONS)),
    ("migrate", "--max-downtime", List(MIGRATE_DURATIONS)),
    ("migrate", "--warmup", List(MIGRATE_DURATIONS)),
    ("migrate", "--run-after", List(MIGRATE_DURATIONS)),
    ("migrate", "--recover-wait", List(MIGRATE_DURATIONS)),
    ("migrate", "--format", List(&["arm64", "ept", "x86", "EPT", ""])),
    ("dirty-views", "--mem", List(MEM_SIZES)),
    ("dirty-views", "--vcpus", Around("64", "65")),
    ("dirty-views", "--ticks", Around("100000", "100001")),
    ("dirty-views", "--tick-ms", Around("10000", "10001")),
    ("dirty-views", "--tick", List(&["0s", "1ms", "10s", "10001ms", "1500us", "-1s", "1", "x", ""])),
    ("dirty-views", "--view-periods", Around("1000", "1001")),
    ("snapshot", "--mem", List(MEM_SIZES)),
    ("snapshot", "-v", Around("64", "65")),
    ("snapshot", "--dirty-rate", Around("1G", "16E")),
    ("snapshot", "--every", List(SNAPSHOT_DURATIONS)),
    ("snapshot", "--duration", List(SNAPSHOT_DURATIONS)),
];

/// The subcommands with a test below that runs their lines of [`FLAGS`].
const TESTED: &[&str] = &[
    "split-perf",
    "tlb-perf",
    "harvest-perf",
    "memslot-perf",
    "dirty-log-perf",
    "migrate",
    "dirty-views",
    "snapshot",
];

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

fn smalls(cmd: &str) -> &'static [(&'static str, &'static str)] {
    SMALLS
        .iter()
        .find(|(c, _)| *c == cmd)
        .map(|(_, s)| *s)
        .unwrap_or_else(|| panic!("no SMALLS for {cmd}"))
}

/// Every pass of `cmd` in [`FLAGS`], in order; fails listing each value
/// that broke the bounds.
fn run_table(cmd: &str) {
    let smalls = smalls(cmd);
    let mut bad = Vec::new();
    let mut passes = 0;
    for (_, flag, values) in FLAGS.iter().filter(|(c, _, _)| *c == cmd) {
        bad.extend(pass(cmd, smalls, flag, &values.get()));
        passes += 1;
    }
    assert!(passes > 0, "no FLAGS lines for {cmd}");
    check(bad);
}

fn check(failures: Vec<String>) {
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_table_line_has_its_test_and_smalls() {
    for (cmd, flag, _) in FLAGS {
        assert!(TESTED.contains(cmd), "{cmd} {flag}: no test runs it");
        assert!(
            smalls(cmd).iter().all(|(f, _)| f.starts_with('-')),
            "{cmd}: SMALLS are flags"
        );
    }
}

#[test]
fn split_perf_boundaries() {
    run_table("split-perf");
}

#[test]
fn tlb_perf_boundaries() {
    run_table("tlb-perf");
}

#[test]
fn harvest_perf_boundaries() {
    run_table("harvest-perf");
}

#[test]
fn memslot_perf_boundaries() {
    run_table("memslot-perf");
}

#[test]
fn dirty_log_perf_boundaries() {
    run_table("dirty-log-perf");
}

#[test]
fn dirty_log_perf_huge_counts_stay_in_bounds() {
    let smalls = smalls("dirty-log-perf");
    let huge_vcpus = List(&["18446744073709551615", "100000"]).get();
    let mut bad = pass("dirty-log-perf", smalls, "-v", &huge_vcpus);
    let huge_iterations = List(&["4294967295"]).get();
    bad.extend(pass("dirty-log-perf", smalls, "-i", &huge_iterations));
    check(bad);
}

#[test]
fn migrate_boundaries() {
    run_table("migrate");
}

#[test]
fn migrate_json_is_not_silent_for_long() {
    let smalls: Vec<(&str, &str)> = MIGRATE_SMALLS
        .iter()
        .copied()
        .chain([("--json", "")])
        .collect();
    check(pass("migrate", &smalls, "--bandwidth", &List(&["1"]).get()));
}

#[test]
fn dirty_views_boundaries() {
    run_table("dirty-views");
}

#[test]
fn snapshot_boundaries() {
    run_table("snapshot");
}
