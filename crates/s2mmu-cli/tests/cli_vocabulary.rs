//! The flag vocabulary every subcommand shares (docs/cli.md): the old
//! spellings still run as hidden aliases, a bare duration is refused
//! naming its flag, options of the other guest are refused by name,
//! every `--json` prints the one envelope, and nothing is written into
//! the current directory unless asked.

use assert_cmd::Command;
use predicates::prelude::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A fresh, empty directory of this test's own.
fn empty_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("s2mmu-vocab-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch directory");
    d
}

fn s2mmu(dir: &Path, args: &[&str]) -> assert_cmd::assert::Assert {
    Command::new(env!("CARGO_BIN_EXE_s2mmu"))
        .args(args)
        .current_dir(dir)
        .timeout(Duration::from_secs(120))
        .assert()
}

/// Runs `args` with `--json -q` in an empty directory: it succeeds,
/// prints the envelope of `command`, and leaves the directory empty.
fn envelope(command: &str, args: &[&str]) -> serde_json::Value {
    let dir = empty_dir(&format!("{command}-{}", args.len()));
    let mut all = vec![command];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--json", "-q"]);
    let out = s2mmu(&dir, &all).success().get_output().stdout.clone();
    let v: serde_json::Value = serde_json::from_slice(&out)
        .unwrap_or_else(|e| panic!("{all:?}: not one JSON object: {e}"));
    assert_eq!(v["command"], command, "{all:?}");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"), "{all:?}");
    assert!(v["params"].is_object() && v["host"].is_object(), "{all:?}");
    assert!(
        v["results"].as_array().is_some_and(|r| !r.is_empty()),
        "{all:?}"
    );
    assert!(v["comparisons"].is_array(), "{all:?}");
    let left: Vec<_> = std::fs::read_dir(&dir).expect("dir").collect();
    assert!(
        left.is_empty(),
        "{all:?} wrote into the current directory: {left:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    v
}

/// A quick simulated migration's flags (8 MiB, one vCPU, no warm-up and
/// no run after the switch, plain TCP), then `$more`.
macro_rules! quick_sim {
    ($($more:expr),* $(,)?) => {
        [
            "--guest",
            "sim",
            "--no-tls",
            "-m",
            "8M",
            "-v",
            "1",
            "--warmup",
            "0ms",
            "--run-after",
            "0ms",
            $($more),*
        ]
    };
}

/// The same run spelled the new way and the old way (hidden aliases):
/// both run and print the envelope.
const NEW_AND_OLD: &[(&str, &[&str], &[&str])] = &[
    (
        "split-perf",
        &["-m", "32M", "--granule", "16k", "--runs", "1"],
        &["--size", "32M", "--granule", "16k", "--runs", "1"],
    ),
    (
        "harvest-perf",
        &["-m", "2M", "--runs", "1"],
        &["--size", "2M", "--runs", "1"],
    ),
    (
        "tlb-perf",
        &[
            "-m",
            "1G",
            "--chunk",
            "256M",
            "--runs",
            "1",
            "-v",
            "1",
            "--vcpu-mem",
            "64K",
            "--settle",
            "100us",
            "--idle",
            "0s",
        ],
        &[
            "--size",
            "1G",
            "--chunk",
            "256M",
            "--runs",
            "1",
            "--vcpus",
            "1",
            "--vcpu-mem",
            "64K",
            "--settle-us",
            "100us",
            "--idle-us",
            "0s",
        ],
    ),
    (
        "dirty-log-perf",
        &[
            "--vcpus",
            "1",
            "--mem-per-vcpu",
            "4M",
            "--iterations",
            "1",
            "--backing",
            "anonymous",
            "--slots",
            "1",
            "--dirty",
            "ring:4096",
            "--policy",
            "default",
        ],
        &[
            "-v",
            "1",
            "-b",
            "4M",
            "-i",
            "1",
            "-s",
            "anonymous",
            "-x",
            "1",
            "--ring",
            "4096",
            "--policy",
            "fast",
        ],
    ),
    (
        "dirty-views",
        &[
            "-m", "4M", "-v", "1", "--ticks", "1", "--dirty", "hw", "--tick", "1ms",
        ],
        &[
            "--mem",
            "4M",
            "--vcpus",
            "1",
            "--ticks",
            "1",
            "--hardware",
            "--tick-ms",
            "1",
        ],
    ),
    (
        "memslot-perf",
        &[
            "--slots",
            "10",
            "-r",
            "1",
            "--duration",
            "10ms",
            "--single-ops",
            "1",
            "--lookups",
            "1000",
        ],
        &[
            "-s",
            "10",
            "-r",
            "1",
            "-l",
            "10ms",
            "--single-ops",
            "1",
            "--lookups",
            "1000",
        ],
    ),
    (
        "migrate",
        &quick_sim![
            "--backing",
            "anonymous",
            "--slots",
            "1",
            "--dirty",
            "wp",
            "--policy",
            "baseline",
        ],
        &quick_sim![
            "-s",
            "anonymous",
            "-x",
            "1",
            "--harvest",
            "wp",
            "--baseline",
        ],
    ),
];

#[test]
fn old_spellings_run_as_the_new_ones_and_every_json_is_the_envelope() {
    for (cmd, new, old) in NEW_AND_OLD {
        let a = envelope(cmd, new);
        let b = envelope(cmd, old);
        assert_eq!(
            a["params"], b["params"],
            "{cmd}: the alias means another run"
        );
    }
}

#[test]
fn snapshot_prints_the_envelope_and_writes_into_no_current_directory() {
    let chain = empty_dir("snapshot-chain").join("chain");
    let chain = chain.to_str().expect("utf-8");
    let args = [
        "-m",
        "4M",
        "-v",
        "1",
        "--duration",
        "20ms",
        "--every",
        "10ms",
    ];
    envelope("snapshot", &[&args[..], &["--dir", chain]].concat());
    // Without --dir, the chain goes to a fresh directory under the
    // temporary one, not into the current directory.
    envelope("snapshot", &args);
}

#[test]
fn migrate_draws_a_plot_only_when_asked() {
    let dir = empty_dir("plot");
    let args = quick_sim!["-q"];
    let args = [&["migrate"][..], &args].concat();
    s2mmu(&dir, &args).success();
    assert_eq!(std::fs::read_dir(&dir).expect("dir").count(), 0);
    let mut with = args.to_vec();
    with.extend_from_slice(&["--plot", "m.svg"]);
    s2mmu(&dir, &with).success();
    assert!(dir.join("m.svg").is_file() && dir.join("m.png").is_file());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `args` exits with status 2 and a message holding every `wants`.
fn refused(args: &[&str], wants: &[&str]) {
    let mut a = s2mmu(&std::env::temp_dir(), args).code(2);
    a = a.stderr(predicate::str::contains("panicked").not());
    for w in wants {
        a = a.stderr(predicate::str::contains(*w));
    }
    drop(a);
}

#[test]
fn bare_durations_are_refused_naming_the_flag() {
    for (cmd, flag) in [
        ("migrate", "--max-downtime"),
        ("migrate", "--warmup"),
        ("snapshot", "--every"),
        ("linux", "--timeout"),
        ("linux", "--harvest-every"),
        ("tlb-perf", "--settle"),
        ("memslot-perf", "--duration"),
        ("dirty-views", "--tick"),
    ] {
        refused(&[cmd, flag, "20"], &[flag, "no unit", "500ms"]);
    }
}

#[test]
fn options_of_the_other_guest_are_refused_by_name() {
    for extra in [
        &["--format", "ept"][..],
        &["--check"],
        &["--backing", "anonymous"],
        &["--policy", "baseline"],
    ] {
        let mut args = vec!["migrate", "--guest", "linux"];
        args.extend_from_slice(extra);
        refused(&args, &[extra[0], "--guest linux"]);
    }
    refused(
        &["migrate", "--guest", "sim", "--linux-run", "dirtier"],
        &["--linux-run", "--guest sim"],
    );
    refused(
        &["migrate", "--kernel", "Image", "-s", "anonymous"],
        &["--backing", "--kernel", "give --guest"],
    );
}

#[test]
fn dirty_modes_have_one_set_of_names() {
    // Each subcommand names the mode it cannot run, and the names it takes.
    refused(
        &["migrate", "--guest", "sim", "--dirty", "off"],
        &["--dirty", "\"off\"", "hw-blocks"],
    );
    refused(
        &["linux", "--dirty", "dbm"],
        &["--dirty", "\"dbm\"", "manual", "ring[:N]"],
    );
    refused(
        &["dirty-views", "--dirty", "pml"],
        &["--dirty pml", "wp or hw"],
    );
}
