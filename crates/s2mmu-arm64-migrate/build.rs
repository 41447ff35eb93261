//! The cfg that gates the tests needing the Linux guest: s2mmu-arm64's
//! build script says whether its model and its Linux guest can run
//! (`links` metadata). Where they cannot, the test runner reports those
//! tests as ignored with the reason, instead of as passed.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(s2mmu_linux_runnable)");
    if std::env::var_os("DEP_S2MMU_ARM64_LINUX").is_some() {
        println!("cargo:rustc-cfg=s2mmu_linux_runnable");
    }
}
