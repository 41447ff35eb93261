//! `s2mmu migrate --guest linux --plot FILE`: the figure of the rounds and
//! the downtime's parts, drawn only when asked. Ignored, with the reason,
//! where the build found that the Linux guest cannot run.

use std::process::Command;

#[test]
#[cfg_attr(
    not(s2mmu_linux_runnable),
    ignore = "needs the Linux guest: QEMU, the EL2 image, the cross compiler, dtc and the kernel packages (scripts/setup.sh)"
)]
fn the_linux_guests_migration_is_drawn_when_asked() {
    let dir = std::env::temp_dir().join(format!("s2mmu-linux-plot-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_s2mmu"))
        .args([
            "migrate", "--guest", "linux", "-m", "256M", "-v", "1", "--no-tls", "-q",
        ])
        .args(["--plot", "m.svg"])
        .current_dir(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let svg = std::fs::read_to_string(dir.join("m.svg")).expect("the SVG");
    for title in [
        "pages sent per pre-copy round",
        "time of each pre-copy round",
        "the downtime",
    ] {
        assert!(svg.contains(title), "no chart {title:?}");
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
