//! Records the git revision, when there is one, for the `host` block of reports.
use std::path::PathBuf;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

fn main() {
    let rev = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_default();
    println!("cargo:rustc-env=S2MMU_GIT_REV={rev}");
    // A commit changes the branch's ref, not HEAD (which names the branch):
    // watch both, and packed-refs, so a report never carries an old
    // revision. Only files that exist: cargo reruns the script on every
    // build for a path that does not.
    let mut watch: Vec<PathBuf> = Vec::new();
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        watch.push(PathBuf::from(&dir).join("HEAD"));
        if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watch.push(PathBuf::from(&dir).join(r));
        }
    }
    if let Some(common) = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]) {
        let common = PathBuf::from(common);
        if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watch.push(common.join(r));
        }
        watch.push(common.join("packed-refs"));
    }
    for p in watch.into_iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    println!("cargo:rerun-if-changed=build.rs");
    test_cfgs();
}

/// The cfgs that gate the tests needing a tool this build may not have:
/// where the build finds none, the test runner reports those tests as
/// ignored with the reason, instead of as passed. s2mmu-arm64's build
/// script says whether its model and its Linux guest can run (`links`
/// metadata).
fn test_cfgs() {
    println!("cargo::rustc-check-cfg=cfg(s2mmu_arm64_runnable)");
    println!("cargo::rustc-check-cfg=cfg(s2mmu_linux_runnable)");
    println!("cargo::rustc-check-cfg=cfg(s2mmu_netns)");
    if std::env::var_os("DEP_S2MMU_ARM64_ARM64").is_some() {
        println!("cargo:rustc-cfg=s2mmu_arm64_runnable");
    }
    if std::env::var_os("DEP_S2MMU_ARM64_LINUX").is_some() {
        println!("cargo:rustc-cfg=s2mmu_linux_runnable");
    }
    // Network namespaces need root (CAP_SYS_ADMIN) and iproute2's `ip`.
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .map(|u| u.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    let path = std::env::var_os("PATH").unwrap_or_default();
    let ip = std::env::split_paths(&path).any(|d| d.join("ip").is_file());
    println!("cargo:rerun-if-env-changed=PATH");
    if root && ip {
        println!("cargo:rustc-cfg=s2mmu_netns");
    } else if std::env::var_os("S2MMU_REQUIRE_NETNS").is_some() {
        panic!("S2MMU_REQUIRE_NETNS is set but network namespaces need root and `ip`");
    }
    println!("cargo:rerun-if-env-changed=S2MMU_REQUIRE_NETNS");
}
