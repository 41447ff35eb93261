//! Sets the cfg `s2mmu_kvm_device` when `/dev/kvm` opens read-write here,
//! so that where it does not, the tests that run guests on it are counted
//! and shown as ignored with the reason instead of passing (they also skip
//! at run time, with a line, for what only running can tell: a KVM that
//! cannot run this crate's guests). With `S2MMU_REQUIRE_KVM` set the build
//! fails instead. The script runs again when `/dev/kvm` changes; where it
//! is missing, touch this file (or set the variable) after loading KVM.

use std::fs::OpenOptions;

const KVM: &str = "/dev/kvm";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=S2MMU_REQUIRE_KVM");
    println!("cargo::rustc-check-cfg=cfg(s2mmu_kvm_device)");
    if std::path::Path::new(KVM).exists() {
        // A missing file would make cargo run this script on every build.
        println!("cargo:rerun-if-changed={KVM}");
    }
    match OpenOptions::new().read(true).write(true).open(KVM) {
        Ok(_) => println!("cargo:rustc-cfg=s2mmu_kvm_device"),
        Err(e) => {
            if std::env::var_os("S2MMU_REQUIRE_KVM").is_some() {
                panic!("S2MMU_REQUIRE_KVM is set but {KVM} cannot be opened: {e}");
            }
            println!("cargo:warning=s2mmu-kvm: {KVM} cannot be opened ({e}); the real-KVM tests are ignored");
        }
    }
}
