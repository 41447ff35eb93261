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
    assert_eq!(v["params"]["dirty"], "hw", "{v}");
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
    assert_eq!(rows.len(), 3, "{v}");
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
    let out = s2mmu(&[
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
    ]);
    assert!(!out.status.success(), "an injected loss must fail the run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("2 of them not in the log: LOST WRITES"),
        "{text}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("lost-write check"));
}
