//! `s2mmu migrate --guest linux --plot FILE --json`: the figure of the
//! rounds, the downtime's parts and the guest's console gap, drawn only
//! when asked, and the run in the JSON envelope every subcommand prints.
//! Ignored, with the reason, where the build found that the Linux guest
//! cannot run.

use std::process::Command;

#[test]
#[cfg_attr(
    not(s2mmu_linux_runnable),
    ignore = "needs the Linux guest: QEMU, the EL2 image, the cross compiler, dtc and the kernel packages (scripts/setup.sh)"
)]
fn the_linux_guests_migration_is_drawn_when_asked_and_reported_in_the_envelope() {
    let dir = std::env::temp_dir().join(format!("s2mmu-linux-plot-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // The dirtier prints a line every 5 ms: the console gap has lines on
    // both machines to be measured between.
    let o = Command::new(env!("CARGO_BIN_EXE_s2mmu"))
        .args([
            "migrate", "--guest", "linux", "-m", "256M", "-v", "1", "--no-tls", "-q",
        ])
        .args(["--linux-run", "dirtier"])
        .args(["--linux-args", "pages=256,rate=64,file=0,secs=25,tick=5"])
        .args(["--plot", "m.svg", "--json"])
        .current_dir(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let env: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON envelope: {e}\n{}",
            String::from_utf8_lossy(&o.stdout)
        )
    });
    assert_eq!(env["command"], "migrate");
    assert_eq!(env["params"]["guest"], "linux");
    assert_eq!(env["params"]["program"], "dirtier");
    let run = &env["results"][0];
    assert_eq!(run["case"], "run 1");
    assert!(
        run["downtime_ms"].as_f64().is_some_and(|d| d > 0.0),
        "{run}"
    );
    assert!(run["rounds"].as_u64().is_some_and(|n| n >= 1), "{run}");
    let gap = &run["console_gap"];
    assert!(gap["lines"].as_u64().is_some_and(|n| n > 10), "{gap}");
    let largest = gap["largest_ms"].as_f64().expect("a largest gap");
    // The dirtier sleeps 5 ms between lines: every gap is at least that
    // long, less the host's reading of two lines at once.
    assert!(largest >= 4.0, "{gap}");
    assert!(gap["largest_where"].is_string(), "{gap}");
    assert_eq!(env["results"][1]["case"], "all runs");

    let svg = std::fs::read_to_string(dir.join("m.svg")).expect("the SVG");
    for title in [
        "pages sent per pre-copy round",
        "time of each pre-copy round",
        "the downtime",
        "console gap",
        "run 1, source",
        "run 1, destination",
        "run 1: largest gap",
    ] {
        assert!(svg.contains(title), "no {title:?} in the figure");
    }
    assert!(dir.join("m.png").is_file(), "the PNG beside it");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    files.sort();
    assert_eq!(
        files,
        ["m.png", "m.svg"],
        "nothing else in the current directory"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
