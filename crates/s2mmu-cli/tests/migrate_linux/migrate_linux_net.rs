//! `s2mmu migrate --guest linux` in two processes over mutual TLS from
//! files: `--listen` starts its own QEMU machine from the stream's header,
//! `--to` boots Debian's arm64 kernel running the guest program `counter`
//! and migrates it through the migration library's session. The
//! destination's guest must begin exactly the step after the last one the
//! source's guest began, and go on in order; the source's guest must not
//! print after the switch. The same with `--postcopy start`: the
//! destination resumes with every page missing and fetches them. The
//! same again with `--engine el2` on both sides (the engine linked into
//! each machine's EL2 image: the source's dirty log and the destination's
//! post-copy maps at EL2), with the host placement on one side and EL2
//! on the other, and `--engine el2` in one process. Ignored, with the
//! reason, where the build found that QEMU, the EL2 image or the kernel
//! are missing.

#[path = "../cli_common/mod.rs"]
mod cli_common;

use cli_common::{require_linux, spawn_listening};
use s2mmu_arm64_migrate::session_run;
use s2mmu_migrate::transport as net;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_s2mmu")
}

/// A CA and a certificate for localhost it signed, as files in `dir`.
fn write_pki(dir: &Path) -> Vec<String> {
    let (pki, _, _) = net::make_pki(&["localhost", "127.0.0.1"]).unwrap();
    let mut args = Vec::new();
    for (flag, name, pem) in [
        ("--tls-cert", "cert.pem", pki.cert_pem),
        ("--tls-key", "key.pem", pki.key_pem),
        ("--tls-ca", "ca.pem", pki.ca_pem),
    ] {
        let f: PathBuf = dir.join(name);
        std::fs::write(&f, pem).unwrap();
        args.push(flag.to_string());
        args.push(f.to_str().unwrap().to_string());
    }
    args
}

/// The number after `before` in `text`'s first line that has it.
fn number_after(text: &str, before: &str) -> Option<u64> {
    let rest = text.split(before).nth(1)?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// One Linux guest at a time here: each run starts two QEMU machines.
static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// What the two processes printed.
struct TwoRuns {
    src_err: String,
    d_out: String,
    /// Everything, for failure messages.
    all: String,
}

/// Runs `--listen` and `--to` with mutual TLS from files, `src_args` added
/// to the source's; both must succeed.
fn two_processes(src_args: &[&str]) -> TwoRuns {
    two_processes_with(&[], src_args)
}

/// As [`two_processes`], `dest_args` added to the destination's.
#[allow(clippy::zombie_processes)]
fn two_processes_with(dest_args: &[&str], src_args: &[&str]) -> TwoRuns {
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let dir = std::env::temp_dir().join(format!(
        "s2mmu-linux-net-{}-{}",
        std::process::id(),
        src_args.len() + 10 * dest_args.len()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let tls = write_pki(&dir);
    let common = ["migrate", "--guest", "linux", "--mem", "256M", "-v", "1"];
    let (dest, addr, err) = spawn_listening(
        Command::new(bin())
            .args(common)
            .args(["--listen", "127.0.0.1:0"])
            .args(&tls)
            .args(dest_args)
            .stdout(Stdio::piped()),
    );
    let dest_err = std::thread::spawn(move || {
        let mut s = String::new();
        for l in err.lines().map_while(Result::ok) {
            s.push_str(&l);
            s.push('\n');
        }
        s
    });
    let src = Command::new(bin())
        .args(common)
        .args(["--to", &addr, "--tls-name", "localhost"])
        .args(&tls)
        .args(src_args)
        .output()
        .expect("the source runs");
    let d = dest.wait_with_output().expect("the destination ends");
    let (src_err, src_out) = (
        String::from_utf8_lossy(&src.stderr).to_string(),
        String::from_utf8_lossy(&src.stdout).to_string(),
    );
    let d_out = String::from_utf8_lossy(&d.stdout).to_string();
    let d_err = dest_err.join().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let all = format!(
        "source stdout:\n{src_out}\nsource stderr:\n{src_err}\ndestination stdout:\n{d_out}\ndestination stderr:\n{d_err}"
    );
    assert!(src.status.success(), "{all}");
    assert!(d.status.success(), "{all}");
    assert!(src_err.contains("mutual TLS"), "{all}");
    TwoRuns {
        src_err,
        d_out,
        all,
    }
}

/// The quoted text after `before` in `text` (printed with `{:?}`; the
/// counter's lines hold no quote or backslash).
fn quoted_after<'a>(text: &'a str, before: &str) -> &'a str {
    let rest = text.split(before).nth(1).expect(before);
    rest.strip_prefix('"')
        .and_then(|r| r.split('"').next())
        .expect("a quoted line")
}

/// The source's guest had counted, and the destination's began at the
/// next step: whole on the destination's console, or cut by the switch,
/// its line begun on the source's console and ended on the
/// destination's (then the destination's first whole step is one later).
fn goes_on(r: &TwoRuns) {
    let all = &r.all;
    let last = number_after(&r.src_err, "counter step ").expect("the source's last step");
    let first = number_after(&r.d_out, "counter step ").expect("the destination's first step");
    assert!(last >= 2, "the source's guest had counted: {all}");
    let cut = quoted_after(&r.src_err, "its console ended with ");
    let rest = quoted_after(&r.d_out, "its console began with the line ");
    let joined = session_run::begun_steps(&format!("{cut}{rest}\n"));
    if joined.first() == Some(&(last + 1)) && first == last + 2 {
        return; // the switch cut step last + 1's line before its number
    }
    assert_eq!(
        first,
        last + 1,
        "the destination goes on at the next step: {all}"
    );
}

#[test]
#[cfg_attr(
    not(s2mmu_linux_runnable),
    ignore = "needs the Linux guest: QEMU, the EL2 image, the cross compiler, dtc and the kernel packages (scripts/setup.sh)"
)]
fn linux_guest_migrates_between_two_processes_over_tls() {
    require_linux();
    let r = two_processes(&[]);
    assert!(!r.d_out.contains("post-copy"), "{}", r.all);
    goes_on(&r);
}

/// `--postcopy start` on the source: it pauses before sending any page
/// and the destination resumes with every page missing, each fetched on a
/// stage-2 fault or streamed; the destination says so, the source's check
/// of FINAL passes (it succeeds), and the counter goes on.
///
/// Not `--postcopy` (after round 0): which pages are missing then is
/// whatever the guest wrote during round 0, and a guest that a loaded
/// machine did not schedule in those 0.2 s wrote none (CI saw 0 missing
/// pages once), so "pages were missing" would be a claim about timing.
/// Post-copy after a pre-copy round, with the dirtier, a guest that always
/// writes, is s2mmu-arm64's `linux_postcopy.rs`.
#[test]
#[cfg_attr(
    not(s2mmu_linux_runnable),
    ignore = "needs the Linux guest: QEMU, the EL2 image, the cross compiler, dtc and the kernel packages (scripts/setup.sh)"
)]
fn linux_guest_moves_by_postcopy_between_two_processes() {
    require_linux();
    let r = two_processes(&["--postcopy", "start"]);
    let all = &r.all;
    assert!(
        r.src_err.contains("post-copy from the start"),
        "the source switched to post-copy: {all}"
    );
    let missing = number_after(&r.d_out, "destination: post-copy: ")
        .expect("the destination's post-copy line");
    assert!(missing > 0, "pages were missing at the resume: {all}");
    assert!(
        r.src_err.contains("did not write equal the source's"),
        "the source checked FINAL: {all}"
    );
    goes_on(&r);
}

/// `--engine el2` on both sides, pre-copy then post-copy from the start:
/// the source's rounds come from the dirty log at EL2, the destination's
/// EL2 engine maps each page that arrives.
#[test]
#[cfg_attr(
    not(s2mmu_linux_runnable),
    ignore = "needs the Linux guest: QEMU, the EL2 image, the cross compiler, dtc and the kernel packages (scripts/setup.sh)"
)]
fn linux_guest_migrates_between_two_el2_processes() {
    require_linux();
    let el2 = ["--engine", "el2"];
    let r = two_processes_with(&el2, &el2);
    assert!(!r.d_out.contains("post-copy"), "{}", r.all);
    goes_on(&r);
    let r = two_processes_with(&el2, &["--engine", "el2", "--postcopy", "start"]);
    let missing = number_after(&r.d_out, "destination: post-copy: ")
        .expect("the destination's post-copy line");
    assert!(missing > 0, "pages were missing at the resume: {}", r.all);
    assert!(
        r.src_err.contains("did not write equal the source's"),
        "the source checked FINAL: {}",
        r.all
    );
    goes_on(&r);
}

/// A host-placement source into an EL2 destination: the stream names no
/// placement.
#[test]
#[cfg_attr(
    not(s2mmu_linux_runnable),
    ignore = "needs the Linux guest: QEMU, the EL2 image, the cross compiler, dtc and the kernel packages (scripts/setup.sh)"
)]
fn host_source_migrates_into_an_el2_destination_process() {
    require_linux();
    let r = two_processes_with(&["--engine", "el2"], &["--engine", "host"]);
    goes_on(&r);
}

/// `--engine el2` in one process: both machines at EL2, the run's JSON
/// says so, and B's guest went on.
#[test]
#[cfg_attr(
    not(s2mmu_linux_runnable),
    ignore = "needs the Linux guest: QEMU, the EL2 image, the cross compiler, dtc and the kernel packages (scripts/setup.sh)"
)]
fn linux_guest_migrates_at_el2_in_one_process() {
    require_linux();
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let o = Command::new(bin())
        .args(["migrate", "--guest", "linux", "-m", "256M", "-v", "2"])
        .args(["--engine", "el2", "--no-tls", "--json", "-q"])
        .output()
        .expect("s2mmu runs");
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("the JSON envelope");
    assert_eq!(v["params"]["engine"], "el2", "{v}");
    assert_eq!(v["params"]["runs"], 1, "{v}");
    let run = &v["results"][0];
    assert_eq!(run["case"], "run 1", "{v}");
    assert!(run["rounds"].as_u64().is_some_and(|n| n >= 1), "{v}");
}
