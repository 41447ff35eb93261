//! `dirty-log-perf --dirty hw`: hardware dirty state on the simulated VM
//! (no write faults in logged passes) and its refused combinations.

use std::process::Command;

fn s2mmu(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_s2mmu"))
        .args(args)
        .output()
        .expect("the s2mmu binary runs")
}

#[test]
fn hardware_dirty_state_takes_no_write_faults() {
    let out = s2mmu(&[
        "dirty-log-perf",
        "-v",
        "1",
        "-b",
        "16M",
        "-i",
        "3",
        "--dirty",
        "hw",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(&text).expect("one JSON object");
    assert_eq!(v["params"]["dirty"], serde_json::json!(["hw"]), "{v}");
    let human = s2mmu(&[
        "dirty-log-perf",
        "-v",
        "1",
        "-b",
        "16M",
        "-i",
        "3",
        "--dirty",
        "hw",
    ]);
    let text = String::from_utf8_lossy(&human.stdout);
    let faults: Vec<&str> = text.lines().filter(|l| l.contains(" faults: ")).collect();
    assert_eq!(faults.len(), 3, "{text}");
    for l in faults {
        assert!(l.contains("faults: 0 "), "a logged pass faulted: {l}");
    }
}

#[test]
fn hardware_dirty_state_refuses_rings_and_real_kvm() {
    for extra in [&["--ring", "4096"][..], &["--kvm"][..], &["--compare"][..]] {
        let mut args = vec!["dirty-log-perf", "-v", "1", "-b", "16M", "--dirty", "hw"];
        args.extend_from_slice(extra);
        let out = s2mmu(&args);
        assert!(!out.status.success(), "{args:?} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--dirty hw"), "{args:?}: {err}");
    }
}

#[test]
fn harvest_perf_finds_every_dirtied_page_and_checks_its_flags() {
    let out = s2mmu(&[
        "harvest-perf",
        "--size",
        "64M",
        "--runs",
        "2",
        "--dirty-every",
        "3",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let rows = v["results"].as_array().expect("results");
    // GET, the per-leaf scan, the engine's CLEAR and the walk-per-run
    // CLEAR on the other table.
    let cases: Vec<&str> = rows.iter().filter_map(|r| r["case"].as_str()).collect();
    assert_eq!(
        cases,
        [
            "get (word scan)",
            "per-leaf scan",
            "clear",
            "clear (walk per run)"
        ],
        "{v}"
    );
    for r in rows {
        assert_eq!(r["runs"], 2);
        assert_eq!(
            r["samples_ns"].as_array().map(Vec::len),
            Some(2),
            "raw samples: {r}"
        );
    }
    for bad in [
        &["--size", "3M"][..],
        &["--size", "512G"][..],
        &["--runs", "0"][..],
        &["--dirty-every", "0"][..],
    ] {
        let mut args = vec!["harvest-perf"];
        args.extend_from_slice(bad);
        let out = s2mmu(&args);
        assert!(!out.status.success(), "{args:?} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(bad[0]), "{args:?}: the flag is named: {err}");
    }
}

#[test]
fn lost_write_check_passes_clean_runs_and_catches_dropped_marks() {
    for extra in [
        &[][..],
        &["--dirty", "hw"][..],
        &["--dirty", "pml", "--format", "ept"][..],
        &["--dirty", "hw", "--format", "ept", "-g"][..],
        &["--format", "ept"][..],
        &["-g"][..],
        &["-x", "2"][..],
    ] {
        let mut args = vec![
            "dirty-log-perf",
            "-v",
            "2",
            "-b",
            "8M",
            "-i",
            "3",
            "--check",
        ];
        args.extend_from_slice(extra);
        let out = s2mmu(&args);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{args:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let checks: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("lost-write check"))
            .collect();
        assert_eq!(checks.len(), 3, "{text}");
        assert!(
            checks
                .iter()
                .all(|l| l.contains(" 0 of them not in the log: ok")),
            "{text}"
        );
    }
    // PML: marks dropped in the flush of the log are caught too.
    for extra in [&[][..], &["--dirty", "pml", "--format", "ept"][..]] {
        let mut args = vec![
            "dirty-log-perf",
            "-v",
            "1",
            "-b",
            "8M",
            "-i",
            "2",
            "--check",
            "--inject-lost-marks",
            "2",
        ];
        args.extend_from_slice(extra);
        let out = s2mmu(&args);
        assert!(
            !out.status.success(),
            "{args:?}: an injected loss must fail the run"
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("2 of them not in the log: LOST WRITES"),
            "{args:?}: {text}"
        );
        assert!(String::from_utf8_lossy(&out.stderr).contains("lost-write check"));
    }
}

#[test]
fn the_modes_side_by_side_count_faults_exits_and_pages() {
    let out = s2mmu(&[
        "dirty-log-perf",
        "-v",
        "1",
        "-b",
        "16M",
        "-i",
        "3",
        "-r",
        "2",
        "--dirty",
        "all",
        "--format",
        "ept",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let rows = v["results"].as_array().expect("results");
    let row = |mode: &str| {
        rows.iter()
            .find(|r| r["case"] == "dirty_modes" && r["policy"] == mode)
            .unwrap_or_else(|| panic!("no row for {mode}: {v}"))
    };
    // 4096 pages a pass: wp faults on each; hw and pml not at all; PML's
    // 512-entry log exits 7 times a pass (the 8th fill is the harvest's).
    for (mode, faults, exits) in [("wp", 4096, 0), ("hw", 0, 0), ("pml", 0, 7)] {
        let r = row(mode);
        assert_eq!(r["runs"], 2);
        assert_eq!(
            r["faults_per_pass"],
            serde_json::json!([faults, faults]),
            "{r}"
        );
        assert_eq!(
            r["pml_full_exits_per_pass"],
            serde_json::json!([exits, exits])
        );
        assert_eq!(r["pages_dirty_per_pass"], serde_json::json!([4096, 4096]));
        for k in [
            "dirty_memory_ns",
            "logging_off_pass_ns",
            "harvest_ns",
            "harvest_thread_cpu_ns",
        ] {
            let s = r[k].as_array().unwrap_or_else(|| panic!("{k}: {r}"));
            assert_eq!(s.len(), 2, "{k}: raw samples per run");
            assert!(
                s.iter().all(|x| x.as_u64().is_some_and(|n| n > 0)),
                "{k}: {r}"
            );
        }
    }
}

#[test]
fn modes_and_formats_refuse_what_cannot_run() {
    for (args, named) in [
        (&["--dirty", "pml", "--arm64"][..], "--dirty pml"),
        (
            &["--dirty", "hw-blocks", "--arm64"][..],
            "--dirty hw-blocks",
        ),
        (&["--format", "ept", "--kvm"][..], "--format ept"),
        (&["--format", "ept", "--arm64"][..], "--format ept"),
        (&["--dirty", "wp,hw", "--check"][..], "several modes"),
        (&["--dirty", "all", "-v", "1,2"][..], "several modes"),
    ] {
        let mut a = vec!["dirty-log-perf", "-b", "16M"];
        a.extend_from_slice(args);
        let out = s2mmu(&a);
        assert!(!out.status.success(), "{a:?} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(named), "{a:?}: {err}");
    }
}

#[test]
fn harvest_perf_runs_on_ept() {
    let out = s2mmu(&[
        "harvest-perf",
        "--size",
        "64M",
        "--runs",
        "1",
        "--format",
        "ept",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["params"]["format"], "ept");
}
