//! A failed migration of the Linux guest leaves the source running:
//! `s2mmu migrate --guest linux` in one process and in two
//! (`--listen`/`--to`), its destination failing each way it can before its
//! guest runs: its QEMU machine does not start, its QEMU is killed during
//! round 0, its process is killed, it refuses the stream's shape. Each
//! time the source exits with an error that names what failed and says
//! its guest was resumed, after that guest (the counter, whose running
//! hash re-checks what it wrote) printed its next steps in order. Real
//! QEMU machines and processes; the link is held at 2 MiB/s so that round
//! 0 lasts while a machine or process is killed. Behaviour only: no timing
//! is asserted.

#[path = "../cli_common/mod.rs"]
mod cli_common;
#[macro_use]
#[path = "../fail_common/mod.rs"]
mod fail_common;

use fail_common::{listen, migrate, require_linux, source_resumed, wait_exit, Qemu};
use std::time::Duration;

/// Round 0 of the counter's guest (some 50 MiB of pages that are not
/// zero) at 2 MiB/s: well past the kills below.
const SLOW: [&str; 2] = ["--bandwidth", "2M"];

const BOOT: Duration = Duration::from_secs(900);

linux_test!(one_process_machine_b_that_cannot_start_leaves_a_running, {
    let q = Qemu::new("fail-b-start");
    q.fail(2);
    let (mut c, log) = migrate(&q, "256M", &["--no-tls"]);
    source_resumed(&mut c, &log, "machine B");
    assert!(log.text().contains("machine 2 refused by the test"));
});

linux_test!(one_process_machine_b_killed_in_round_0_leaves_a_running, {
    let q = Qemu::new("fail-b-kill");
    let (mut c, log) = migrate(&q, "256M", &["--no-tls", SLOW[0], SLOW[1]]);
    wait_round_0(&mut c, &log);
    q.kill(2);
    source_resumed(&mut c, &log, "Linux destination: its QEMU machine: ");
});

linux_test!(a_killed_destination_process_leaves_the_source_running, {
    let (qd, qs) = (Qemu::new("fail-dproc-d"), Qemu::new("fail-dproc-s"));
    let (mut d, addr, dlog) = listen(&qd, "256M", &[]);
    let (mut s, slog) = migrate(&qs, "256M", &["--to", &addr, SLOW[0], SLOW[1]]);
    wait_round_0(&mut s, &slog);
    d.kill().unwrap();
    wait_exit(&mut d, &dlog, Duration::from_secs(10));
    source_resumed(&mut s, &slog, "source: ");
});

linux_test!(the_destinations_qemu_killed_leaves_the_source_running, {
    let (qd, qs) = (Qemu::new("fail-dqemu-d"), Qemu::new("fail-dqemu-s"));
    let (mut d, addr, dlog) = listen(&qd, "256M", &[]);
    let (mut s, slog) = migrate(&qs, "256M", &["--to", &addr, SLOW[0], SLOW[1]]);
    wait_round_0(&mut s, &slog);
    qd.kill(1);
    source_resumed(&mut s, &slog, "Linux destination: its QEMU machine: ");
    let st = wait_exit(&mut d, &dlog, Duration::from_secs(120));
    assert!(!st.success(), "the destination succeeded:\n{}", dlog.text());
});

linux_test!(
    a_destination_refusing_the_shape_leaves_the_source_running,
    {
        let (qd, qs) = (Qemu::new("fail-shape-d"), Qemu::new("fail-shape-s"));
        let (mut d, addr, dlog) = listen(&qd, "128M", &[]);
        let (mut s, slog) = migrate(&qs, "256M", &["--to", &addr]);
        source_resumed(&mut s, &slog, "this destination accepts at most 134217728");
        let st = wait_exit(&mut d, &dlog, Duration::from_secs(120));
        assert!(!st.success(), "the destination succeeded:\n{}", dlog.text());
    }
);

linux_test!(
    a_destination_whose_qemu_cannot_start_leaves_the_source_running,
    {
        // The destination's machine of its own shape starts; the stream's
        // (128 MiB) needs another, which does not.
        let (qd, qs) = (Qemu::new("fail-dstart-d"), Qemu::new("fail-dstart-s"));
        qd.fail(2);
        let (mut d, addr, dlog) = listen(&qd, "256M", &[]);
        let (mut s, slog) = migrate(&qs, "128M", &["--to", &addr]);
        source_resumed(&mut s, &slog, "machine 2 refused by the test");
        let st = wait_exit(&mut d, &dlog, Duration::from_secs(120));
        assert!(!st.success(), "the destination succeeded:\n{}", dlog.text());
    }
);

/// Waits until the source's session began (`s` holds an established TCP
/// connection: its guest booted, the counter's steps came, the session
/// connected), then 2 s more: inside round 0 at 2 MiB/s.
fn wait_round_0(s: &mut std::process::Child, slog: &fail_common::Log) {
    let t0 = std::time::Instant::now();
    while !fail_common::connected(s.id()) {
        if let Some(st) = s.try_wait().unwrap() {
            panic!("the source exited ({st}) before round 0:\n{}", slog.text());
        }
        assert!(t0.elapsed() < BOOT, "the source never connected");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
}
