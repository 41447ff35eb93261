//! `s2mmu linux --on-reset reboot`: a guest whose `/init` runs `reboot -f`
//! on every boot boots `--max-reboots` + 1 times, and the reset past the
//! bound ends the run as a reset (the JSON report counts the reboots, the
//! command fails: the guest did not power off). With the default
//! `--on-reset stop` it boots once. Flags out of range are refused before
//! QEMU starts.

use std::process::{Command, Output};

fn s2mmu(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_s2mmu"))
        .args(args)
        .output()
        .expect("s2mmu runs")
}

/// The JSON report's line and stderr of `s2mmu linux --run reboot ARGS`.
fn reboot_run(args: &[&str]) -> (serde_json::Value, String) {
    let mut all = vec!["linux", "-v", "1", "--mem", "256M", "--run", "reboot"];
    all.extend_from_slice(args);
    all.push("--json");
    let o = s2mmu(&all);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(!o.status.success(), "the run ended in a reset: {out}{err}");
    assert!(err.contains("did not power off: Reset"), "{err}");
    let start = out.find('{').expect("a report");
    let envelope: serde_json::Value =
        serde_json::from_str(&out[start..]).expect("one JSON envelope");
    (envelope["results"][0].clone(), err)
}

#[test]
#[cfg_attr(
    not(s2mmu_linux_runnable),
    ignore = "needs the Linux guest: QEMU, the EL2 image, the cross compiler, dtc and the kernel packages (scripts/setup.sh)"
)]
fn on_reset_reboot_boots_again_up_to_the_bound() {
    let (j, _) = reboot_run(&["--on-reset", "reboot", "--max-reboots", "1"]);
    assert_eq!(j["stop"], "Reset", "{j}");
    assert_eq!(j["reboots"], 1, "{j}");
    assert_eq!(j["cpus_online"], 1, "{j}");
    let (j, _) = reboot_run(&[]);
    assert_eq!(j["reboots"], 0, "{j}");
}

#[test]
fn reset_flags_out_of_range_are_refused() {
    for (args, want) in [
        (&["--on-reset", "again"][..], "--on-reset"),
        (
            &["--on-reset", "reboot", "--max-reboots", "0"][..],
            "--max-reboots",
        ),
        (&["--max-reboots", "101"][..], "--max-reboots"),
    ] {
        let mut all = vec!["linux"];
        all.extend_from_slice(args);
        let o = s2mmu(&all);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(want), "{err}");
    }
}
