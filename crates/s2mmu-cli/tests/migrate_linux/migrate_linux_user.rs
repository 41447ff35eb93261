//! `s2mmu migrate --guest linux` with the user's own guest: the kernel,
//! the initramfs and the command line given as files and words (here the
//! cached Debian kernel, the project's initramfs and a command line that
//! runs its counter), both consoles written to `--console-dir` and their
//! last lines shown; the guest's identity in the HEADER, a destination
//! given other files refusing it by name. Ignored, with the reason, where
//! the build found that the Linux guest cannot run (QEMU, the EL2 image,
//! the cross compiler, dtc or the kernel packages missing); a test that
//! then finds it cannot run fails with the reason.

#[path = "../cli_common/mod.rs"]
mod cli_common;

use s2mmu_arm64::linux::assets::{ensure, AssetOptions, LinuxAssets};
use std::process::{Command, Stdio};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_s2mmu")
}

/// The cached kernel and initramfs; fails the test, with the reason, where
/// the Linux guest cannot run although the build found it could.
fn assets() -> LinuxAssets {
    s2mmu_arm64::available()
        .map_err(|e| e.to_string())
        .and_then(|()| ensure(&AssetOptions::from_env()).map_err(|e| e.to_string()))
        .unwrap_or_else(|why| {
            panic!("the build found the Linux guest but it cannot run now: {why}")
        })
}

/// The user's guest: their files and a command line running the counter.
fn user_guest(a: &LinuxAssets) -> Vec<String> {
    vec![
        "--kernel".into(),
        a.image.display().to_string(),
        "--initrd".into(),
        a.initramfs.display().to_string(),
        "--cmdline".into(),
        "quiet s2mmu.run=counter s2mmu.args=kib=4,ms=1000".into(),
    ]
}

/// A small guest: 256 MiB, one vCPU.
const SMALL: [&str; 7] = ["migrate", "--guest", "linux", "--mem", "256M", "-v", "1"];

#[test]
#[cfg_attr(
    not(s2mmu_linux_runnable),
    ignore = "needs the Linux guest: QEMU, the EL2 image, the cross compiler, dtc and the kernel packages (scripts/setup.sh)"
)]
fn the_users_guest_migrates_in_one_process_and_both_consoles_are_kept() {
    let a = assets();
    let dir = std::env::temp_dir().join(format!("s2mmu-user-guest-{}", std::process::id()));
    let out = Command::new(bin())
        .args(SMALL)
        .args(user_guest(&a))
        .arg("--no-tls")
        .arg("--console-dir")
        .arg(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let src = std::fs::read_to_string(dir.join("source.log")).unwrap();
    let dst = std::fs::read_to_string(dir.join("dest.log")).unwrap();
    // The user's program ran on A, then went on on B, which printed its
    // own lines, and the tail of each is shown.
    assert!(src.contains("s2mmu-counter"), "{src}");
    assert!(dst.contains("s2mmu-counter"), "{dst}");
    assert!(err.contains("B's guest printed"), "{err}");
    assert!(
        err.contains("destination's console, its last lines"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[cfg_attr(
    not(s2mmu_linux_runnable),
    ignore = "needs the Linux guest: QEMU, the EL2 image, the cross compiler, dtc and the kernel packages (scripts/setup.sh)"
)]
fn a_destination_given_another_initramfs_refuses_the_guest_by_name() {
    let a = assets();
    let dir = std::env::temp_dir().join(format!("s2mmu-user-shape-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let other = dir.join("other.cpio");
    std::fs::write(&other, b"another initramfs").unwrap();
    let (mut dest, addr, _derr) = cli_common::spawn_listening(
        Command::new(bin())
            .args(SMALL)
            .args(["--listen", "127.0.0.1:0", "--io-timeout", "20s"])
            .arg("--kernel")
            .arg(&a.image)
            .arg("--initrd")
            .arg(&other)
            .stdout(Stdio::piped()),
    );
    let src = Command::new(bin())
        .args(SMALL)
        .args(user_guest(&a))
        .args(["--to", &addr, "--io-timeout", "20s"])
        .output()
        .unwrap();
    let serr = String::from_utf8_lossy(&src.stderr);
    let _ = dest.kill();
    let _ = dest.wait();
    assert!(!src.status.success(), "{serr}");
    assert!(
        serr.contains("guest shape mismatch: the stream's guest image (kernel and initramfs)"),
        "{serr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
