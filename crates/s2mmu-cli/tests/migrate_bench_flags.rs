//! `s2mmu migrate-bench`'s flags: what it refuses, by name, before any
//! guest or QEMU starts.

use std::process::Command;

fn run(args: &[&str]) -> (i32, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_s2mmu"))
        .arg("migrate-bench")
        .args(args)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).to_string(),
    )
}

#[test]
fn it_refuses_what_it_cannot_run_naming_the_flag() {
    let (code, err) = run(&[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--vs-qemu"), "{err}");
    let (code, err) = run(&["--vs-qemu", "--cells", "idle,busy"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--cells") && err.contains("busy"), "{err}");
    let (code, err) = run(&["--vs-qemu", "--links", "wifi"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--links") && err.contains("wifi"), "{err}");
    let (code, err) = run(&["--vs-qemu", "--runs", "21"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--runs"), "{err}");
    let (code, err) = run(&["--vs-qemu", "--guest-time", "2s"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--guest-time"), "{err}");
}
