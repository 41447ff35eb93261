//! `s2mmu linux --run ipi --json`: one result row of the JSON envelope per vCPU count (1 and 2
//! here, those up to `-v`), each with the SGI rate of every run, its
//! median, QEMU alone's on the same EL1 guest, and the kicks that woke
//! the other vCPUs, with the engine on the host and at EL2 (the envelope's
//! params name it). Flags the run does not take are refused by name.
//! Counts only: no rate is asserted.

use std::process::{Command, Output};

fn s2mmu(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_s2mmu"))
        .args(args)
        .output()
        .expect("s2mmu runs")
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs the arm64 model: QEMU, the EL2 image and binutils for aarch64 (scripts/setup.sh)"
)]
fn ipi_reports_each_vcpu_count_against_qemu_alone() {
    ipi_rows("host");
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs the arm64 model: QEMU, the EL2 image and binutils for aarch64 (scripts/setup.sh)"
)]
fn ipi_runs_with_the_engine_at_el2() {
    ipi_rows("el2");
}

fn ipi_rows(engine: &str) {
    let o = s2mmu(&[
        "linux", "--run", "ipi", "-v", "2", "--runs", "2", "--json", "--engine", engine,
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let envelope: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON envelope");
    assert_eq!(envelope["params"]["engine"], engine, "{out}");
    let rows = envelope["results"].as_array().expect("results").clone();
    assert_eq!(rows.len(), 2, "{out}");
    for (row, vcpus) in rows.iter().zip([1, 2]) {
        assert_eq!(row["vcpus"], vcpus, "{row}");
        assert_eq!(row["runs"], 2, "{row}");
        for key in ["sgis_per_s_runs", "qemu_alone_runs"] {
            let runs = row[key].as_array().expect("runs");
            assert_eq!(runs.len(), 2, "{row}");
            assert!(runs.iter().all(|r| r.as_f64().unwrap() > 0.0), "{row}");
        }
        assert!(row["sgis_per_s_median"].as_f64().unwrap() > 0.0, "{row}");
    }
    assert_eq!(rows[0]["of_1_vcpu"], 1.0, "{out}");
    assert_eq!(
        rows[0]["kicked_exits_median"], 0.0,
        "one vCPU: no other to kick"
    );
    // vCPU 1 waits in WFI for the SGIs of vCPU 0: each wake is a kick.
    assert!(
        rows[1]["kicked_exits_median"].as_f64().unwrap() >= 1.0,
        "{out}"
    );
}

#[test]
fn ipi_refuses_flags_it_does_not_take() {
    for flag in [&["--dirty", "wp"][..], &["--vs-qemu"][..]] {
        let mut args = vec!["linux", "--run", "ipi"];
        args.extend_from_slice(flag);
        let o = s2mmu(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{err}");
        assert!(err.contains("--run ipi") && err.contains(flag[0]), "{err}");
    }
}
