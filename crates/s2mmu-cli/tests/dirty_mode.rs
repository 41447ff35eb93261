//! `dirty-log-perf --dirty hw`: hardware dirty state on the simulated VM
//! (no write faults in logged passes) and its refused combinations.

mod cli_common;

use cli_common::{fails_naming, json_of, output, succeeds, with};

/// A short `dirty-log-perf` run: one vCPU, 16 MiB, 3 logged passes.
const SHORT_RUN: &[&str] = &["dirty-log-perf", "-v", "1", "-b", "16M", "-i", "3"];

/// [`SHORT_RUN`] on hardware dirty state.
fn hw_run() -> Vec<&'static str> {
    with(SHORT_RUN, &["--dirty", "hw"])
}

#[test]
fn hardware_dirty_state_takes_no_write_faults() {
    let v = json_of(&with(&hw_run(), &["--json"]));
    assert_eq!(v["params"]["dirty"], serde_json::json!(["hw"]), "{v}");
    let text = String::from_utf8_lossy(&output(&hw_run()).stdout).into_owned();
    let faults: Vec<&str> = text.lines().filter(|l| l.contains(" faults: ")).collect();
    assert_eq!(faults.len(), 3, "{text}");
    for l in faults {
        assert!(l.contains("faults: 0 "), "a logged pass faulted: {l}");
    }
}

#[test]
fn hardware_dirty_state_refuses_rings_and_real_kvm() {
    for extra in [&["--ring", "4096"][..], &["--kvm"][..], &["--compare"][..]] {
        let base = ["dirty-log-perf", "-v", "1", "-b", "16M", "--dirty", "hw"];
        fails_naming(&with(&base, extra), "--dirty hw");
    }
}

#[test]
fn harvest_perf_finds_every_dirtied_page_and_checks_its_flags() {
    let v = json_of(&[
        "harvest-perf",
        "--mem",
        "64M",
        "--runs",
        "2",
        "--dirty-every",
        "3",
        "--json",
    ]);
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
        &["--mem", "3M"][..],
        &["--mem", "512G"][..],
        &["--runs", "0"][..],
        &["--dirty-every", "0"][..],
    ] {
        fails_naming(&with(&["harvest-perf"], bad), bad[0]);
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
        let base = [
            "dirty-log-perf",
            "-v",
            "2",
            "-b",
            "8M",
            "-i",
            "3",
            "--check",
        ];
        let text = succeeds(&with(&base, extra));
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
        let base = [
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
        let args = with(&base, extra);
        let out = output(&args);
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
    let v = json_of(&with(
        SHORT_RUN,
        &["-r", "2", "--dirty", "all", "--format", "ept", "--json"],
    ));
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
        fails_naming(&with(&["dirty-log-perf", "-b", "16M"], args), named);
    }
}

#[test]
fn harvest_perf_runs_on_ept() {
    let v = json_of(&[
        "harvest-perf",
        "--mem",
        "64M",
        "--runs",
        "1",
        "--format",
        "ept",
        "--json",
    ]);
    assert_eq!(v["params"]["format"], "ept");
}
