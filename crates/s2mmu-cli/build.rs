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
}
