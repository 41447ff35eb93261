//! `s2mmu linux --plot FILE`: the exits per second over the boot and the
//! dirty rate at each harvest, drawn only when asked. Ignored, with the
//! reason, where the build found that the Linux guest cannot run.

use std::process::Command;

#[test]
#[cfg_attr(
    not(s2mmu_linux_runnable),
    ignore = "needs the Linux guest: QEMU, the EL2 image, the cross compiler, dtc and the kernel packages (scripts/setup.sh)"
)]
fn the_boot_and_the_harvests_are_drawn_when_asked() {
    let dir = std::env::temp_dir().join(format!("s2mmu-linux-boot-plot-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_s2mmu"))
        .args([
            "linux",
            "-m",
            "256M",
            "--run",
            "dirtier",
            "--args",
            "mem=16,file=0,secs=3",
        ])
        .args(["--dirty", "wp", "--plot", "boot.svg", "-q"])
        .current_dir(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let svg = std::fs::read_to_string(dir.join("boot.svg")).expect("the SVG");
    for title in [
        "exits per second, by kind",
        "stage2_fault",
        "dirty rate at each harvest",
    ] {
        assert!(svg.contains(title), "no {title:?} in the figure");
    }
    assert!(dir.join("boot.png").is_file(), "the PNG beside it");
    let _ = std::fs::remove_dir_all(&dir);
}
