//! Every subcommand's bad input, as a user would type it: the command must
//! exit with status 2 (not 101, a panic), quickly, with a message that
//! names the flag at fault (and, where one applies, its limit).
//!
//! Cases that fail today in commands this suite does not own are kept,
//! marked `#[ignore]` with the reason, so they run with `--ignored` and
//! turn into plain tests once fixed.

mod cli_common;

use assert_cmd::Command;
use predicates::prelude::*;
use std::time::Duration;

/// `s2mmu args` run in the scratch directory, killed after 30 s.
fn s2mmu(args: &[&str]) -> assert_cmd::assert::Assert {
    Command::new(env!("CARGO_BIN_EXE_s2mmu"))
        .args(args)
        .current_dir(cli_common::scratch())
        .timeout(Duration::from_secs(30))
        .assert()
}

/// `args` is refused with status 2 and a message holding every `wants`.
fn refused(args: &[&str], wants: &[&str]) {
    let mut a = s2mmu(args).code(2);
    a = a.stderr(predicate::str::contains("panicked").not());
    for w in wants {
        a = a.stderr(predicate::str::contains(*w));
    }
    drop(a);
}

#[test]
fn split_perf_bad_input() {
    refused(&["split-perf", "--mem", "1P"], &["--mem", "at most 255TiB"]);
    refused(&["split-perf", "--mem", "0"], &["--mem", "at least"]);
    refused(&["split-perf", "--mem", "12x"], &["--mem", "invalid size"]);
    refused(&["split-perf", "--mem", "-1"], &["--mem"]);
    refused(
        &["split-perf", "--mem", "48M", "--granule", "16k"],
        &["--mem", "multiple of 32MiB"],
    );
    refused(&["split-perf", "--runs", "0"], &["--runs", "1..=1000"]);
    refused(&["split-perf", "--runs", "1001"], &["--runs", "1..=1000"]);
    refused(&["split-perf", "--granule", "8k"], &["--granule"]);
}

#[test]
fn tlb_perf_bad_input() {
    refused(&["tlb-perf", "--mem", "0"], &["--mem"]);
    refused(&["tlb-perf", "--mem", "1G", "--chunk", "4K"], &["--chunk"]);
    refused(&["tlb-perf", "--mem", "1G", "--chunk", "2G"], &["--chunk"]);
    refused(&["tlb-perf", "--runs", "0"], &["--runs", "1..=1000"]);
    refused(&["tlb-perf", "--vcpus", "65"], &["--vcpus", "64"]);
    refused(&["tlb-perf", "--vcpu-mem", "1K"], &["--vcpu-mem"]);
    refused(
        &["tlb-perf", "--vcpu-mem", "1T", "--vcpus", "64"],
        &["--vcpu-mem 1TiB x --vcpus 64", "memory"],
    );
    refused(
        &["tlb-perf", "--vcpu-mem", "16E", "--vcpus", "64"],
        &["--vcpu-mem"],
    );
    refused(&["tlb-perf", "--limit-pages", "0"], &["--limit-pages"]);
    refused(&["tlb-perf", "--dirty-every", "0"], &["--dirty-every"]);
    refused(
        &["tlb-perf", "--settle", "1001ms"],
        &["--settle", "at most 1s"],
    );
    refused(&["tlb-perf", "--idle=-1s"], &["--idle"]);
    refused(&["tlb-perf", "--idle-us", "50"], &["--idle", "no unit"]);
    refused(&["tlb-perf", "--arm64", "--vcpus", "2"], &["--vcpus"]);
}

#[test]
fn harvest_perf_bad_input() {
    refused(&["harvest-perf", "--mem", "3M"], &["--mem", "2M"]);
    refused(&["harvest-perf", "--mem", "512G"], &["--mem", "256GiB"]);
    refused(&["harvest-perf", "--runs", "0"], &["--runs", "1..=100"]);
    refused(&["harvest-perf", "--runs", "101"], &["--runs", "1..=100"]);
    refused(&["harvest-perf", "--dirty-every", "0"], &["--dirty-every"]);
    refused(
        &["harvest-perf", "--mem", "2M", "--dirty-every", "513"],
        &["--dirty-every", "512"],
    );
    refused(
        &["harvest-perf", "--sparse-clear-runs", "513"],
        &["--sparse-clear-runs", "0..=512"],
    );
    refused(
        &["harvest-perf", "--sparse-clear-runs", "-1"],
        &["--sparse-clear-runs"],
    );
}

#[test]
fn memslot_perf_bad_input() {
    refused(&["memslot-perf", "-s", "0"], &["--slots", "1..=32764"]);
    refused(&["memslot-perf", "-s", "32765"], &["--slots", "1..=32764"]);
    refused(&["memslot-perf", "-s", "10,x"], &["--slots"]);
    let seventeen = vec!["1"; 17].join(",");
    refused(&["memslot-perf", "-s", &seventeen], &["--slots"]);
    for l in ["0s", "nans", "infs", "61s"] {
        refused(&["memslot-perf", "--duration", l], &["--duration"]);
    }
    refused(&["memslot-perf", "-l", "0.5"], &["--duration", "no unit"]);
    refused(&["memslot-perf", "-r", "0"], &["--runs", "1..=100"]);
    refused(&["memslot-perf", "-r", "101"], &["--runs", "1..=100"]);
    refused(&["memslot-perf", "--single-ops", "0"], &["--single-ops"]);
    refused(&["memslot-perf", "--lookups", "999"], &["--lookups"]);
    refused(&["memslot-perf", "--lookups", "4294967295"], &["--lookups"]);
}

#[test]
fn reproduce_bad_input() {
    // Refused before the minutes of experiments, not after them.
    refused(
        &["reproduce", "--out", "/nonexistent-dir/report.md"],
        &["--out /nonexistent-dir/report.md", "cannot write"],
    );
    refused(&["reproduce", "--runs", "3"], &["--runs"]);
}

#[test]
fn dirty_log_perf_bad_input() {
    refused(&["dirty-log-perf", "-v", "0"], &["-v", "at least 1"]);
    refused(&["dirty-log-perf", "-v", "x"], &["-v"]);
    refused(&["dirty-log-perf", "-i", "0"], &["-i", "at least 1"]);
    refused(&["dirty-log-perf", "-w", "101"], &["-w", "0..=100"]);
    refused(&["dirty-log-perf", "-s", "bogus"], &["--backing", "bogus"]);
}

#[test]
fn dirty_log_perf_huge_vcpu_count_is_refused() {
    refused(&["dirty-log-perf", "-v", "18446744073709551615"], &["-v"]);
}

#[test]
fn dirty_log_perf_too_much_memory_names_the_flags() {
    refused(&["dirty-log-perf", "-v", "100000"], &["-v"]);
    refused(&["dirty-log-perf", "-b", "1P"], &["-b"]);
}

#[test]
fn dirty_log_perf_slots_and_ring_name_the_flags() {
    refused(&["dirty-log-perf", "-x", "0"], &["-x"]);
    refused(&["dirty-log-perf", "--ring", "0"], &["--ring"]);
    refused(
        &["dirty-log-perf", "--dirty", "wp,dbm"],
        &["--dirty", "\"dbm\"", "pml"],
    );
}

/// `migrate --no-tls` with one bad flag: the flags, and words the refusal
/// must name.
const MIGRATE_NO_TLS_REFUSALS: &[(&[&str], &[&str])] = &[
    (&["--mem", "0"], &["--mem", "64GiB"]),
    (&["--mem", "1P"], &["--mem", "64GiB"]),
    (&["-v", "0"], &["-v", "256"]),
    (&["-x", "0"], &["--slots", "512"]),
    (&["--dirty", "ring:0"], &["--dirty ring:0"]),
    (&["--dirty", "dbm"], &["--dirty", "\"dbm\"", "hw-blocks"]),
    (&["--io-timeout", "0s"], &["--io-timeout"]),
    (&["--channels", "0"], &["--channels", "1 to 64"]),
    (&["--attempts", "0"], &["--attempts", "1..=1000"]),
    (&["--warmup", "100000000s"], &["--warmup"]),
    (
        &["--clear-chunk", "0"],
        &["--clear-chunk", "at least 256KiB"],
    ),
    (
        &["--clear-chunk", "128G"],
        &["--clear-chunk", "at most 64GiB"],
    ),
    (
        &["--harvest", "ring:1048576"],
        &["--dirty ring:1048576", "65536"],
    ),
    (
        &["--dirty", "ring:100"],
        &["--dirty ring:100", "power of two"],
    ),
    (&["--max-rounds", "1001"], &["--max-rounds", "1000"]),
    (&["--bandwidth", "2T"], &["--bandwidth", "at most 1TiB"]),
    (&["--dirty-rate", "2T"], &["--dirty-rate", "at most 1TiB"]),
    (
        &["--max-downtime", "100000000s"],
        &["--max-downtime", "86400s"],
    ),
    (&["-s", "bogus"], &["bogus", "backing"]),
    (&["--format", "x86"], &["--format", "x86", "arm64", "ept"]),
    (&["--format", ""], &["--format"]),
    (&["--recover-wait", "0s"], &["--recover-wait", "86400s"]),
    (
        &["--recover-wait", "100000s"],
        &["--recover-wait", "86400s"],
    ),
    (&["--recovery", "bogus"], &["--recovery", "bogus"]),
    (
        &["--recovery", "manual"],
        &["--recovery manual", "--control"],
    ),
    (&["--control", "c.sock"], &["--control", "--to or --listen"]),
];

#[test]
fn migrate_bad_input() {
    for (flags, words) in MIGRATE_NO_TLS_REFUSALS {
        let args: Vec<&str> = ["migrate", "--no-tls"]
            .iter()
            .chain(flags.iter())
            .copied()
            .collect();
        refused(&args, words);
    }
    refused(
        &["migrate", "--listen", "x", "--to", "y"],
        &["--listen", "--to"],
    );
    let not_a_socket = cli_common::scratch().join("control-not-a-socket");
    std::fs::write(&not_a_socket, b"x").unwrap();
    refused(
        &[
            "migrate",
            "--listen",
            "127.0.0.1:0",
            "--control",
            not_a_socket.to_str().unwrap(),
        ],
        &["control socket", "control-not-a-socket", "not a socket"],
    );
}

#[test]
fn migrate_ctl_bad_input() {
    refused(
        &["migrate-ctl", "--control", "no-such.sock", "status"],
        &["no-such.sock", "no such socket"],
    );
    refused(
        &[
            "migrate-ctl",
            "--control",
            "no-such.sock",
            "recover",
            "--to",
            "a b",
        ],
        &["--to", "no spaces"],
    );
    refused(
        &["migrate-ctl", "--control", "no-such.sock", "resume"],
        &["resume"],
    );
    refused(&["migrate-ctl", "status"], &["--control"]);
}

#[test]
fn unknown_subcommands_and_flags_are_refused() {
    refused(&["split-pref"], &["split-pref"]);
    refused(&["split-perf", "--sise", "1G"], &["--sise"]);
    s2mmu(&[]).code(2).stderr(predicate::str::contains("Usage"));
}

#[test]
fn dirty_views_bad_input() {
    refused(&["dirty-views", "--mem", "0"], &["--mem", "16GiB"]);
    refused(&["dirty-views", "--mem", "1P"], &["--mem", "16GiB"]);
    refused(&["dirty-views", "--vcpus", "0"], &["--vcpus", "1..=64"]);
    refused(
        &["dirty-views", "--view-periods", "0"],
        &["--view-periods", "1..=1000"],
    );
    refused(&["dirty-views", "--ticks", "0"], &["--ticks", "1..=100000"]);
    refused(
        &["dirty-views", "--tick-ms", "10001"],
        &["--tick-ms", "0..=10000"],
    );
}

#[test]
fn snapshot_bad_input() {
    refused(&["snapshot", "--mem", "0"], &["--mem", "16GiB"]);
    refused(&["snapshot", "-v", "0"], &["--vcpus", "1..=64"]);
    refused(&["snapshot", "--every", "0ms"], &["--every", "1ms..=1h"]);
    refused(&["snapshot", "--duration", "100000000s"], &["--duration"]);
    refused(
        &["snapshot", "--verify", "/nonexistent/s2mmu-snapshots"],
        &["/nonexistent/s2mmu-snapshots"],
    );
}

#[test]
fn linux_engine_bad_input() {
    refused(&["linux", "--engine", "nope"], &["nope", "host or el2"]);
    refused(
        &["linux", "--engine-compare", "--dirty", "wp"],
        &["--engine-compare", "--dirty"],
    );
    refused(
        &["linux", "--engine-compare", "--run", "dirtier"],
        &["--engine-compare", "--run"],
    );
}

#[test]
fn linux_rate_per_mode_bad_input() {
    refused(
        &["linux", "--rate-per-mode"],
        &["--rate-per-mode", "--run dirtier"],
    );
    refused(
        &[
            "linux",
            "--run",
            "dirtier",
            "--rate-per-mode",
            "--dirty",
            "wp",
        ],
        &["--rate-per-mode", "no --dirty"],
    );
    refused(
        &["linux", "--run", "dirtier", "--rate-per-mode", "--baseline"],
        &["--rate-per-mode", "--vs-qemu"],
    );
    refused(
        &["linux", "--harvest-ms", "50"],
        &["--harvest-every", "--dirty"],
    );
    refused(&["linux", "--timeout", "30"], &["--timeout", "no unit"]);
    refused(&["linux", "--dirty", "pml"], &["--dirty pml"]);
}
