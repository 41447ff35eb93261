//! A destination that dies inside the stop-and-copy leaves the source
//! running: `s2mmu migrate --guest linux` in one process and in two
//! (`--listen`/`--to`), the destination failing after the source paused
//! its guest and sent the last pages, the vCPU state and every END, and
//! before the destination's guest resumes. The failure is not a race
//! against a sleep: `S2MMU_TEST_DEST_FAULT_AT_STATE` makes the destination
//! kill its own process (`exit`) or its own QEMU machine (`kill-qemu`) at
//! that point (the source sends its vCPU state only with its guest
//! paused). Each time the source exits with an error that names what
//! failed and says its guest was resumed, after that guest (the counter, whose running hash re-checks
//! what it wrote) printed its next steps in order: no step lost. Real
//! QEMU machines and processes. Behaviour only: no timing is asserted.

#[path = "../cli_common/mod.rs"]
mod cli_common;
#[macro_use]
#[path = "../fail_common/mod.rs"]
mod fail_common;

use fail_common::{
    listen_env, migrate, migrate_env, require_linux, source_resumed, wait_exit, Qemu,
};
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

const FAULT: &str = "S2MMU_TEST_DEST_FAULT_AT_STATE";

/// The source's error when the destination ended after the source sent
/// its last pages and the vCPU state (its guest paused).
const NO_RESUMED: &str = "waiting for the destination's RESUMED after the last pages and the \
                          vCPU state were sent: the destination closed the connection";

linux_test!(
    one_process_machine_b_killed_in_stop_and_copy_leaves_a_running,
    {
        let q = Qemu::new("fail-b-stopcopy");
        let (mut c, log) = migrate_env(&q, "256M", &["--no-tls"], &[(FAULT, "kill-qemu")]);
        source_resumed(&mut c, &log, "Linux destination: its QEMU machine: ");
        let text = log.text();
        assert!(
            text.contains("QEMU machine is killed at STATE"),
            "the fault came at STATE:\n{text}"
        );
    }
);

linux_test!(
    a_destination_process_killed_in_stop_and_copy_leaves_the_source_running,
    {
        let (qd, qs) = (Qemu::new("fail-sc-dproc-d"), Qemu::new("fail-sc-dproc-s"));
        let (mut d, addr, dlog) = listen_env(&qd, "256M", &[], &[(FAULT, "exit")]);
        let (mut s, slog) = migrate(&qs, "256M", &["--to", &addr]);
        let st = wait_exit(&mut d, &dlog, Duration::from_secs(900));
        assert_eq!(st.signal(), Some(9), "killed:\n{}", dlog.text());
        assert!(
            dlog.text()
                .contains("destination process is killed at STATE"),
            "the fault came at STATE:\n{}",
            dlog.text()
        );
        source_resumed(&mut s, &slog, NO_RESUMED);
    }
);

linux_test!(
    a_destinations_qemu_killed_in_stop_and_copy_leaves_the_source_running,
    {
        let (qd, qs) = (Qemu::new("fail-sc-dqemu-d"), Qemu::new("fail-sc-dqemu-s"));
        let (mut d, addr, dlog) = listen_env(&qd, "256M", &[], &[(FAULT, "kill-qemu")]);
        let (mut s, slog) = migrate(&qs, "256M", &["--to", &addr]);
        source_resumed(&mut s, &slog, "Linux destination: its QEMU machine: ");
        let st = wait_exit(&mut d, &dlog, Duration::from_secs(120));
        assert!(!st.success(), "the destination succeeded:\n{}", dlog.text());
        assert!(
            dlog.text().contains("QEMU machine is killed at STATE"),
            "the fault came at STATE:\n{}",
            dlog.text()
        );
    }
);
