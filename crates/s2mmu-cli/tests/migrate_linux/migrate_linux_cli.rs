//! `s2mmu migrate --guest linux` refuses bad options before it starts
//! anything (no QEMU needed).

use std::process::Command;

fn refused(args: &[&str], want: &str) {
    let o = Command::new(env!("CARGO_BIN_EXE_s2mmu"))
        .args(["migrate", "--guest", "linux"])
        .args(args)
        .output()
        .expect("s2mmu runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(
        err.contains(want),
        "{args:?}: {err:?} does not say {want:?}"
    );
}

#[test]
fn bad_options_are_refused_by_name() {
    refused(&["--runs", "0"], "--runs 0");
    refused(&["--runs", "21"], "--runs 21");
    refused(
        &["--to", "127.0.0.1:1", "--runs", "2"],
        "--runs 2 with --listen or --to",
    );
    refused(&["--channels", "0"], "--channels");
    // The guest programs are named, fill among them.
    refused(&["--linux-run", "nope"], "nope");
    refused(&["--linux-run", "nope"], "counter, dirtier, fill");
    refused(&["--engine", "kvm"], "expected host or el2");
    // Its source logs by write protection or hardware dirty state only.
    refused(&["--dirty", "ring"], "logs with wp or hw");
}

#[test]
fn an_unknown_guest_is_refused() {
    let o = Command::new(env!("CARGO_BIN_EXE_s2mmu"))
        .args(["migrate", "--guest", "windows"])
        .output()
        .expect("s2mmu runs");
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("windows"));
}
