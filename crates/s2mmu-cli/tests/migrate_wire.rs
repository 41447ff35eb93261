//! Issue 28's figures are measured, not made up: an in-process migration
//! reports plain TCP between the same endpoints (as many bytes as the
//! stack's own probe, over as many connections), and the stage clocks
//! counted every page on both sides with time in each stage. Behaviour
//! only: no timing is compared.

mod migrate_common;

use migrate_common::{dest_cfg, plain, small};
use s2mmu_cli::migrate::migrate_in_process;
use s2mmu_cli::migrate::net::{self, NetConfig};
use s2mmu_cli::migrate::source::SimRun;
use std::time::Duration;

fn check(cfg: &SimRun, net: &NetConfig, tls: bool) {
    let (s, d) = migrate_in_process(cfg, &dest_cfg(), net).expect("migration succeeds");
    let l = s
        .plain_link
        .expect("plain TCP measured before the migration");
    assert_eq!(
        l.bytes, cfg.guest.mem_size,
        "as many bytes as the stack's probe"
    );
    assert_eq!(l.channels, cfg.session.channels);
    assert!(l.bytes_per_s() > 0.0);
    let x = s.send_stages;
    assert_eq!(x.pages, s.page_records, "the sender's clock saw every page");
    assert!(x.read_ns > 0 && x.hash_ns > 0 && x.write_ns > 0 && x.socket_ns > 0);
    assert!(
        x.socket_ns <= x.write_ns,
        "the socket is part of the writes"
    );
    let r = d.recv_stages;
    assert_eq!(
        r.pages, d.page_records,
        "the receiver's clock saw every page"
    );
    assert!(r.read_ns > 0 && r.check_ns > 0);
    assert!(r.socket_ns <= r.read_ns, "the socket is part of the reads");
    if std::path::Path::new("/proc/thread-self/schedstat").exists() {
        assert!(x.cpu_ns > 0 && r.cpu_ns > 0, "CPU time read on both sides");
    }
    if tls {
        assert!(x.encrypt_ns() > 0, "TLS costs time beyond the socket");
    }
}

#[test]
fn plain_tcp_and_the_stages_are_measured_without_tls() {
    check(&small(16 << 20), &plain(), false);
}

#[test]
fn plain_tcp_and_the_stages_are_measured_with_tls_over_two_channels() {
    let net = NetConfig {
        io_timeout: Duration::from_secs(10),
        security: net::ephemeral_tls().unwrap(),
    };
    check(
        &small(16 << 20).with(|_, s| {
            s.channels = 2;
        }),
        &net,
        true,
    );
}
