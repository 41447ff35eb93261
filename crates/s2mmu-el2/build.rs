//! Sets the cfg `s2mmu_el2_qemu` when the EL2 image's test can run here:
//! `qemu-system-aarch64` on `PATH` (or `S2MMU_QEMU` naming it) and the
//! `aarch64-unknown-none` target installed. Without them the test is
//! ignored with that reason; with `S2MMU_REQUIRE_ARM64` set (CI) the build
//! fails instead. Runs again when `PATH` changes or a package is installed.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // The stage-1 set-up and register-frame macros the EL2 stub of
    // `s2mmu-arm64` shares with this crate's image: its build script reads
    // this as `DEP_S2MMU_EL2_ASM_DIR`, so it assembles from a package as
    // from the repository.
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:asm_dir={dir}/asm");
    println!("cargo:rerun-if-env-changed=PATH");
    println!("cargo:rerun-if-env-changed=S2MMU_QEMU");
    println!("cargo:rerun-if-env-changed=S2MMU_REQUIRE_ARM64");
    println!("cargo::rustc-check-cfg=cfg(s2mmu_el2_qemu)");
    if Path::new("/var/lib/dpkg/status").exists() {
        println!("cargo:rerun-if-changed=/var/lib/dpkg/status");
    }
    match runnable() {
        Ok(()) => println!("cargo:rustc-cfg=s2mmu_el2_qemu"),
        Err(why) if std::env::var_os("S2MMU_REQUIRE_ARM64").is_some() => {
            panic!("S2MMU_REQUIRE_ARM64 is set but the EL2 image cannot run: {why}")
        }
        Err(why) => println!("cargo:warning=the EL2 image's QEMU test is ignored: {why}"),
    }
}

fn runnable() -> Result<(), String> {
    let qemu = std::env::var("S2MMU_QEMU").unwrap_or_else(|_| "qemu-system-aarch64".into());
    let ok = Command::new(&qemu)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        return Err(format!(
            "{qemu} not found (apt-get install qemu-system-arm)"
        ));
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let libdir = Command::new(rustc)
        .args([
            "--print",
            "target-libdir",
            "--target",
            "aarch64-unknown-none",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match libdir {
        Some(d) if Path::new(&d).is_dir() => Ok(()),
        _ => Err("the aarch64-unknown-none target is not installed \
                  (rustup target add aarch64-unknown-none)"
            .into()),
    }
}
