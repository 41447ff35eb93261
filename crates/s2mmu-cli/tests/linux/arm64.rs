//! The `--arm64` modes through the `s2mmu` binary: a small checked
//! dirty-log run on QEMU's arm64 model (ignored, with the reason, where the
//! model cannot run), and options the model cannot take refused before
//! QEMU starts. No timing is asserted.

use serde_json::Value;
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};

/// One QEMU at a time: the machine may have 2 cores.
static ONE: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

fn s2mmu(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_s2mmu"))
        .args(args)
        .output()
        .expect("the s2mmu binary runs")
}

/// Runs `args` with a QEMU path that does not exist: an option refused
/// before QEMU starts is refused with its own message, never with a
/// complaint about QEMU.
fn refused(args: &[&str], wants: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_s2mmu"))
        .args(args)
        .env("S2MMU_QEMU", "/nonexistent/qemu-system-aarch64")
        .output()
        .expect("the s2mmu binary runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} was accepted");
    assert!(out.stdout.is_empty(), "{args:?} printed a report");
    for w in wants {
        assert!(err.contains(w), "{args:?}: {w:?} not in {err:?}");
    }
    assert!(!err.contains("nonexistent"), "{args:?} started QEMU: {err}");
}

fn skip_reason() -> Option<String> {
    s2mmu_arm64::available().err()
}

/// Fails the test, with the reason, when the model cannot run (the tests
/// are ignored by their cfg where the build found it cannot).
fn require_arm64() {
    if let Some(why) = skip_reason() {
        panic!("the build found the arm64 model but it cannot run now: {why}");
    }
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (scripts/setup.sh)"
)]
fn dirty_log_perf_arm64_check_is_exact() {
    // The binary these runs start is built with the break-before-make
    // monitor (the dev-dependency's feature): a violation fails the run.
    const {
        assert!(
            s2mmu::bbm::ENABLED,
            "the s2mmu binary's tests build the monitor in"
        )
    };
    let _one = serial();
    require_arm64();
    let args = [
        "dirty-log-perf",
        "--arm64",
        "--check",
        "-v",
        "1",
        "-b",
        "4M",
        "-i",
        "2",
    ];
    let out = s2mmu(&args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {:?}: {text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_check_lines(&text);
    assert!(text.contains("Abort round trip: "), "{text}");
    assert!(text.contains("Iteration 2 dirty memory time: "), "{text}");
    assert!(text.contains("emulator's"), "{text}");

    let mut json_args = args.to_vec();
    json_args.push("--json");
    let out = s2mmu(&json_args);
    assert!(out.status.success(), "{:?}", out.status);
    let j: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_check_rows(&j);
}

/// One `arm64 check` line per pass, exact (nothing missing or extra), over
/// the random pattern: some of the 1024 pages written, some not, so a page
/// logged but not written could show as extra.
fn assert_check_lines(text: &str) {
    let checks: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("arm64 check: logged"))
        .collect();
    assert_eq!(checks.len(), 2, "one check line per pass: {text}");
    for l in &checks {
        assert!(l.ends_with("missing 0, extra 0"), "{l}");
        let num = |key: &str| -> u64 {
            let at = l.find(key).unwrap() + key.len();
            l[at..]
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .unwrap()
                .parse()
                .unwrap()
        };
        let (w, u) = (num("written "), num("unwritten "));
        assert_eq!(w + u, 1024, "{l}");
        assert!(w > 0 && u > 0, "written and unwritten pages: {l}");
    }
}

/// The same in `--json`: exact check rows with unwritten pages, a phase row
/// and the abort round trip row.
fn assert_check_rows(j: &Value) {
    assert_eq!(j["benchmark"], "dirty-log-perf");
    assert_eq!(j["params"]["arm64"], true);
    let rows = j["results"].as_array().expect("results");
    let checks: Vec<&Value> = rows
        .iter()
        .filter(|r| {
            r["policy"] == "arm64" && r["case"].as_str().unwrap().starts_with("check_iteration_")
        })
        .collect();
    assert_eq!(checks.len(), 2);
    for c in checks {
        assert_eq!(
            (c["missing"].as_u64(), c["extra"].as_u64()),
            (Some(0), Some(0))
        );
        let w = c["written"].as_u64().unwrap();
        assert!(
            w > 0 && w < 1024,
            "random writes leave pages unwritten: {c}"
        );
    }
    let dirty = rows
        .iter()
        .find(|r| r["case"] == "iteration 2 dirty memory" && r["policy"] == "arm64")
        .expect("a phase row");
    assert_eq!(dirty["runs"], 1);
    assert_eq!(dirty["samples_ns"].as_array().map(Vec::len), Some(1));
    let rt = rows
        .iter()
        .find(|r| r["case"] == "abort_round_trip")
        .expect("the round trip row");
    assert!(rt["aborts"][0].as_u64().unwrap() >= 1024, "{rt}");
}

#[test]
fn arm64_options_are_checked_before_qemu_starts() {
    let d = ["dirty-log-perf", "--arm64"];
    let with = |extra: &[&'static str]| [&d[..], extra].concat();
    refused(&with(&["-v", "9"]), &["-v 9", "1..=7"]);
    refused(&with(&["-v", "1,8"]), &["-v 8", "1..=7"]);
    refused(&with(&["-b", "0"]), &["-b 0", "multiple of 4KiB"]);
    refused(
        &with(&["-s", "anonymous_thp", "-b", "3M"]),
        &["-b", "multiple of 2MiB"],
    );
    refused(
        &with(&["-v", "4", "-b", "64G"]),
        &["-v 4 x -b 64GiB", "128GiB"],
    );
    refused(&with(&["-x", "2"]), &["-x 2", "-x 1"]);
    refused(&with(&["-w", "50"]), &["-w 50"]);
    refused(
        &with(&["-s", "anonymous_hugetlb_1gb"]),
        &["-s anonymous_hugetlb_1gb"],
    );
    refused(&with(&["--ring", "1000"]), &["--ring 1000", "256..=65536"]);
    refused(
        &with(&["--ring", "4096", "-b", "64M"]),
        &["--ring 4096", "--ring 32768"],
    );
    refused(&with(&["--policy", "both"]), &["--policy both"]);
    refused(&with(&["--memslots", "array"]), &["--memslots array"]);
    refused(&with(&["-r", "0"]), &["-r 0", "1..=100"]);
    refused(&with(&["--kvm"]), &["--kvm"]);
    // --check on the engine is the lost-write check, which needs bitmaps.
    refused(
        &["dirty-log-perf", "--check", "--ring", "4096"],
        &["--check", "--ring"],
    );
}

#[test]
fn compare_has_an_arm64_column_or_says_why_not() {
    let _one = serial();
    let out = s2mmu(&[
        "dirty-log-perf",
        "--compare",
        "-b",
        "4M",
        "-i",
        "2",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let rows = j["results"].as_array().expect("results");
    let phase = rows
        .iter()
        .any(|r| r["policy"] == "arm64" && r["case"] == "iteration 2 dirty memory");
    let skipped = rows
        .iter()
        .find(|r| r["policy"] == "arm64" && r["case"] == "column_skipped");
    match skip_reason() {
        None => assert!(phase && skipped.is_none(), "no arm64 column: {rows:?}"),
        Some(why) => {
            eprintln!("arm64 column skipped: {why}");
            assert!(skipped.is_some() && !phase);
        }
    }
    // An option the model cannot take skips the column with the reason.
    let out = s2mmu(&[
        "dirty-log-perf",
        "--compare",
        "-b",
        "4M",
        "-x",
        "2",
        "-i",
        "1",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("arm64 column skipped: ") && text.contains("-x 2"),
        "{text}"
    );
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (scripts/setup.sh)"
)]
fn tlb_perf_arm64_counts_round_trips_per_policy() {
    let _one = serial();
    require_arm64();
    // 2 GiB slot, range limit 2^16 pages (256 MiB): 8 split calls or one
    // whole-VMID flush per clear; 512 MiB chunks: 4 clears.
    let args = [
        "tlb-perf",
        "--arm64",
        "--mem",
        "2G",
        "--chunk",
        "512M",
        "--limit-pages",
        "65536",
        "--runs",
        "1",
    ];
    let out = s2mmu(&[&args[..], &["--json"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(j["params"]["arm64"], true);
    assert_eq!(j["params"]["dirty_every"], 1, "every page by default");
    let rows = j["results"].as_array().expect("results");
    let get = |case: &str, pol: &str| {
        rows.iter()
            .find(|r| r["case"] == case && r["policy"] == pol)
            .unwrap_or_else(|| panic!("no row {case}/{pol}"))
            .clone()
    };
    assert_eq!(get("whole_slot", "split_calls")["tlb_calls"], 8);
    assert_eq!(get("whole_slot", "whole_vmid")["tlb_calls"], 1);
    assert_eq!(get("whole_slot", "whole_vmid")["tlbi_instructions"], 1);
    assert_eq!(get("chunk_512mib", "split_calls")["tlb_calls"], 32);
    assert_eq!(get("chunk_512mib", "whole_vmid")["tlb_calls"], 4);
    assert_eq!(get("whole_slot", "split_calls")["pages"], 1u64 << 19);
    check_samples_and_stub_time(rows);
    // The invalidations' effect on an idle CPU's TLB, per mode and policy
    // (tests/el1/effect.rs in s2mmu-arm64 shows it failing when dropped).
    let setup = rows
        .iter()
        .find(|r| r["case"] == "setup")
        .expect("setup row");
    let effect = setup["effect_check"].as_array().expect("effect check");
    assert_eq!(effect.len(), 4, "{setup}");
    for e in effect {
        assert_eq!(
            (e["pages"].as_u64(), e["protected"].as_u64()),
            (Some(8), Some(8)),
            "{e}"
        );
    }
    // The check QEMU can fail on a wrong TLBI operand (tests/el1/walk_cache.rs
    // in s2mmu-arm64 shows it failing with the operand one page off).
    let operand = &setup["operand_check"];
    assert_eq!(operand["walk_fault"], true, "{setup}");
    assert_eq!(operand["table_ipa"], 4u64 << 30, "{setup}");
    assert!(operand["tlbis"].as_u64() >= Some(2), "{setup}");
    let out = s2mmu(&args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.contains("[target 1 instead of 8: PASS]"), "{text}");
    assert!(
        text.contains("operand check (CPU 0, the guest's stage 1 on)"),
        "{text}"
    );
    assert!(text.contains("Chunked/WholeVmid 8 of 8"), "{text}");
    assert!(text.contains("emulator's"), "{text}");
}

/// One sample per row (`--runs 1`), and the wait for EL2 split into the
/// stub's own work (its counter stamps) and the rest: the work is there for
/// every row that made calls, and neither part exceeds the whole wait.
fn check_samples_and_stub_time(rows: &[Value]) {
    for r in rows.iter().filter(|r| r["case"] != "setup") {
        assert_eq!(r["samples_ns"].as_array().map(Vec::len), Some(1), "{r}");
        let total = r["tlb_time_ns"].as_u64().expect("tlb_time_ns");
        let work = r["tlb_work_ns"].as_u64().expect("tlb_work_ns");
        let pickup = r["tlb_pickup_ns"].as_u64().expect("tlb_pickup_ns");
        assert!(
            work > 0,
            "the stub's own time on {} calls: {r}",
            r["tlb_calls"]
        );
        assert!(work <= total && pickup <= total, "{r}");
    }
}

#[test]
fn tlb_perf_arm64_options_are_checked_before_qemu_starts() {
    refused(
        &["tlb-perf", "--arm64", "--mem", "256G"],
        &["--mem 256GiB", "128GiB"],
    );
    refused(&["tlb-perf", "--arm64", "--mem", "3M"], &["--mem", "1G"]);
    refused(&["tlb-perf", "--arm64", "--runs", "0"], &["--runs"]);
    refused(&["tlb-perf", "--arm64", "--vcpus", "2"], &["--vcpus"]);
    refused(
        &["tlb-perf", "--arm64", "--limit-pages", "1"],
        &["--limit-pages 1", "65536"],
    );
}

#[test]
fn without_qemu_arm64_is_refused_with_the_reason() {
    for args in [
        &["dirty-log-perf", "--arm64", "-b", "4M"][..],
        &["tlb-perf", "--arm64", "--mem", "1G"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_s2mmu"))
            .args(args)
            .env_remove("S2MMU_QEMU")
            .env("PATH", "/nonexistent")
            .output()
            .expect("the s2mmu binary runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(out.stdout.is_empty());
        assert!(err.starts_with("s2mmu: --arm64: "), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
    }
}
