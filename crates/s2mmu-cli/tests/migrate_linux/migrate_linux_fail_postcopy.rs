//! A destination that dies in post-copy leaves the source paused with its
//! half of the memory: `s2mmu migrate --guest linux` between two
//! processes (`--listen`/`--to`, `--postcopy start`: every page is missing
//! on the destination when its guest resumes). The destination's process
//! is killed right after its resumed guest's first page fetched from the
//! source has arrived: the guest has run there on pages the source no
//! longer holds as the newest, so the source must not resume its own
//! copy, and must not end with its pages either while an operator may
//! still recover. The kill is not a race against a sleep:
//! `S2MMU_TEST_DEST_FAULT_AT_STATE=exit-in-postcopy` makes the
//! destination kill itself in its page-fetch hook. The source
//! (`--control PATH`, the default automatic recovery) must say that
//! post-copy broke with the memory split, find the destination gone,
//! keep its guest paused and wait for the operator on its control socket;
//! an operator's `cancel` then ends it with the error that names the
//! split. With `kill-qemu-in-postcopy` the destination's QEMU machine is
//! killed at the same point instead: its guest's vCPU state dies with it,
//! so nothing is left to recover against; the destination ends naming its
//! machine, and the source ends without resuming its older copy, naming a
//! guest lost on the destination (not a memory that differs). Real QEMU
//! machines and processes. Behaviour only: no timing is asserted.

#[path = "../cli_common/mod.rs"]
mod cli_common;
#[path = "../fail_common/mod.rs"]
mod fail_common;
#[path = "../recover_common/mod.rs"]
mod recover_common;

use fail_common::{listen_env, migrate, require_linux, wait_exit, Log, Qemu};
use recover_common::ctl;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

const FAULT: &str = "S2MMU_TEST_DEST_FAULT_AT_STATE";

/// Polls the source's control socket (every 200 ms, at most `limit`)
/// until its phase is `paused`; panics if the source exits first.
fn wait_paused(sock: &Path, c: &mut Child, log: &Log, limit: Duration) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        if let Some(s) = c.try_wait().unwrap() {
            panic!(
                "the source exited ({s}) instead of pausing:\n{}",
                log.text()
            );
        }
        let o = ctl(sock, &["status"]);
        if o.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            if v["phase"] == "paused" {
                return v;
            }
        }
        assert!(
            t0.elapsed() < limit,
            "the source never paused:\n{}",
            log.text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A listening destination with `fault` and a post-copy source (`--to`,
/// `--postcopy start`, `--control`) to it; the source's control socket.
fn start(qd: &Qemu, qs: &Qemu, fault: &str) -> (Child, Log, Child, Log, PathBuf) {
    let sock = qs.dir.join("src.sock");
    let (d, addr, dlog) = listen_env(qd, "256M", &[], &[(FAULT, fault)]);
    let (s, slog) = migrate(
        qs,
        "256M",
        &[
            "--to",
            &addr,
            "--postcopy",
            "start",
            "--control",
            sock.to_str().unwrap(),
        ],
    );
    (d, dlog, s, slog, sock)
}

/// The source paused with its memory, naming what failed (`what`), its
/// guest not resumed and its QEMU machine alive; then the operator's
/// `cancel` ends it with the error that names the split.
fn source_kept_its_half(s: &mut Child, slog: &Log, sock: &Path, qs: &Qemu, what: &[&str]) {
    let v = wait_paused(sock, s, slog, Duration::from_secs(300));
    eprintln!("the source's status: {v}");
    assert!(
        v["pages_missing"].as_u64().unwrap() > 0,
        "the destination lacked pages: {v}"
    );
    let text = slog.text();
    for what in [
        "source: POST-COPY BROKE (",
        "the guest's memory is split between the two hosts",
        "source: POST-COPY PAUSED (",
        "the guest stays paused here and this side's memory is kept for a recovery",
    ]
    .iter()
    .chain(what)
    {
        assert!(text.contains(what), "the source says {what:?}:\n{text}");
    }
    assert!(
        !text.contains("the source's guest was resumed"),
        "the source resumed a guest whose newer pages are lost:\n{text}"
    );
    let qemu = qs.pid(1).expect("the source's machine started");
    assert!(
        Path::new(&format!("/proc/{qemu}")).exists(),
        "the source's QEMU machine ended while paused:\n{text}"
    );

    // The operator gives up: the source ends, naming the split.
    let o = ctl(sock, &["cancel"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let st = wait_exit(s, slog, Duration::from_secs(60));
    let text = slog.text();
    eprintln!("the source:\n{text}");
    assert!(!st.success(), "the source succeeded:\n{text}");
    for what in [
        "cancelled by the operator",
        "The guest's memory is SPLIT between the two hosts",
    ] {
        assert!(text.contains(what), "the source says {what:?}:\n{text}");
    }
}

/// The source's words for a destination that is gone: its reconnect
/// refused.
const GONE: [&str; 3] = [
    "the recovery failed: ",
    "connecting to 127.0.0.1:",
    "nothing listens there (the peer's process has ended or closed its port)",
];

#[test]
#[cfg_attr(
    not(s2mmu_linux_runnable),
    ignore = "needs the Linux guest: QEMU, the EL2 image, the cross compiler, dtc and the kernel packages (scripts/setup.sh)"
)]
fn a_destination_process_killed_in_postcopy_leaves_the_source_paused_with_its_pages() {
    require_linux();
    let (qd, qs) = (Qemu::new("fail-pc-dproc-d"), Qemu::new("fail-pc-dproc-s"));
    let (mut d, dlog, mut s, slog, sock) = start(&qd, &qs, "exit-in-postcopy");
    let st = wait_exit(&mut d, &dlog, Duration::from_secs(900));
    assert_eq!(st.signal(), Some(9), "killed:\n{}", dlog.text());
    assert!(
        dlog.text()
            .contains("destination process is killed in post-copy, after its first fetched page"),
        "the fault came in post-copy:\n{}",
        dlog.text()
    );
    source_kept_its_half(&mut s, &slog, &sock, &qs, &GONE);
}

#[test]
#[cfg_attr(
    not(s2mmu_linux_runnable),
    ignore = "needs the Linux guest: QEMU, the EL2 image, the cross compiler, dtc and the kernel packages (scripts/setup.sh)"
)]
fn a_destinations_qemu_killed_in_postcopy_ends_the_source_paused_naming_the_lost_guest() {
    require_linux();
    let (qd, qs) = (Qemu::new("fail-pc-dqemu-d"), Qemu::new("fail-pc-dqemu-s"));
    let (mut d, dlog, mut s, slog, _sock) = start(&qd, &qs, "kill-qemu-in-postcopy");
    let st = wait_exit(&mut d, &dlog, Duration::from_secs(900));
    let dtext = dlog.text();
    assert!(!st.success(), "the destination succeeded:\n{dtext}");
    for what in [
        "QEMU machine is killed in post-copy, after its first fetched page",
        "the guest stopped",
        "QEMU exited (signal: 9 (SIGKILL))",
    ] {
        assert!(
            dtext.contains(what),
            "the destination says {what:?}:\n{dtext}"
        );
    }
    // The destination's vCPU state died with its machine: nothing is
    // left to recover against, and the source must not resume its older
    // copy. It ends, naming the guest lost on the destination.
    let st = wait_exit(&mut s, &slog, Duration::from_secs(300));
    let text = slog.text();
    eprintln!("the source:\n{text}");
    assert!(!st.success(), "the source succeeded:\n{text}");
    for what in [
        "POST-COPY BROKE: the destination's FINAL carries no guest state: its guest failed",
        "the source does not resume its own older copy",
    ] {
        assert!(text.contains(what), "the source says {what:?}:\n{text}");
    }
    assert!(
        !text.contains("the source's guest was resumed"),
        "the source resumed a guest whose newer pages are lost:\n{text}"
    );
}
