//! Who may resume a paused post-copy between two `s2mmu` processes: the
//! recovery over mutual TLS; peers that authenticate (the right key, a
//! certificate of the right CA) but join another session, peers with a
//! wrong key or another CA's certificate, and peers that authenticate and
//! then send garbage or stall. Each is refused on the destination's real
//! accept path (the peers are written with the crate's own `net` and
//! `wire` functions), the destination stays paused with the refusal in
//! `status`'s `last_error`, and the correct recovery after them succeeds.
//! Every peer is on 127.0.0.1. Behaviour only: no timing is asserted.

#[path = "../cli_common/mod.rs"]
mod cli_common;
#[path = "../recover_common/mod.rs"]
mod recover_common;

use recover_common::*;
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::transport::BoxConn;
use s2mmu_migrate::wire::{WireWriter, SESSION_LEN};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// How long a test peer waits for the destination to close it.
const CLOSED_WITHIN: Duration = Duration::from_secs(20);

/// Connects to `addr` (retrying while the destination's recovery
/// listener is not up yet, at most 10 s).
fn dial(addr: &str, net: &NetConfig) -> TcpStream {
    let t0 = Instant::now();
    loop {
        match net::connect_tcp(addr, net) {
            Ok(s) => return s,
            Err(e) if t0.elapsed() > Duration::from_secs(10) => panic!("{addr}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Connects to `addr` and authenticates with `net`: the connection, or
/// the client side's own error.
fn authenticate(addr: &str, net: &NetConfig) -> Result<BoxConn, MigrateError> {
    net::client(dial(addr, net), net)
}

/// Waits until the destination closes `conn` (end of stream or a reset;
/// not our own read deadline), at most [`CLOSED_WITHIN`].
fn closed_by_destination(mut conn: BoxConn) {
    conn.set_io_timeout(Some(CLOSED_WITHIN)).unwrap();
    let mut b = [0u8; 64];
    match conn.read(&mut b) {
        Ok(0) => {}
        Ok(n) => panic!("the destination answered a refused peer with {n} bytes"),
        Err(e) => assert!(
            !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
            "the destination did not close a refused peer within {CLOSED_WITHIN:?}"
        ),
    }
}

/// A peer holding the right credentials that joins the recovery's main
/// channel (0) with a session id that is not this migration's.
fn join_other_session(addr: &str, net: &NetConfig) {
    let mut conn = authenticate(addr, net).expect("the right credentials authenticate");
    let other = [0x5a; SESSION_LEN];
    // Sends the opening and JOIN, flushed; the writer borrows `conn`.
    WireWriter::join(&mut conn, &other, 0).expect("JOIN sent");
    closed_by_destination(conn);
}

/// Polls the destination's `status` until `last_error` contains `what`
/// in `phase` (at most 30 s); requires it to stay alive and the source
/// to stay paused.
fn wait_refusal(p: &mut Paused, phase: &str, what: &str) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        assert!(
            p.dest.try_wait().unwrap().is_none(),
            "the destination exited:\n{}",
            p.dlog.lock().unwrap()
        );
        let v = status(&p.dsock);
        if v["phase"] == phase && v["last_error"].as_str().unwrap().contains(what) {
            let s = status(&p.ssock);
            assert_eq!(s["phase"], "paused", "{s}");
            return v;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "never {phase} with {what:?}: {v}\n{}",
            p.dlog.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One recovery attempt on the destination's own listener that only
/// `peer` answers: it is refused, and the destination pauses again with
/// its pages still missing and no recovery counted.
fn refused_attempt(p: &mut Paused, what: &str, peer: impl FnOnce(&str, &NetConfig)) {
    let before = status(&p.dsock);
    let o = ctl(&p.dsock, &["recover"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    peer(&p.dest_addr, &p.net());
    let v = wait_refusal(p, "paused", what);
    let e = v["last_error"].as_str().unwrap();
    assert!(e.contains("the recovery failed"), "{v}");
    assert_eq!(v["pages_missing"], before["pages_missing"], "{v}");
    assert_eq!(v["recoveries"], 0, "{v}");
}

#[test]
fn a_recovery_over_mutual_tls_after_another_cas_certificate_is_refused() {
    let mut p = run_until_paused_with("tls", 96 << 10, "manual", &[], Sec::Tls);
    let other = write_pki(&p.dir, "other-");
    refused_attempt(&mut p, "failed authentication", |addr, good| {
        let net = NetConfig {
            security: net::tls_from_files(&other[0], &other[1], &other[2], "127.0.0.1").unwrap(),
            ..good.clone()
        };
        // Each side refuses the other's certificate.
        match authenticate(addr, &net) {
            Err(MigrateError::Auth { .. }) => {}
            Ok(c) => closed_by_destination(c),
            Err(e) => panic!("expected an authentication failure, got {e}"),
        }
    });
    // The right certificate but another migration's session.
    refused_attempt(&mut p, "joined another session", join_other_session);
    recover(p, true);
}

#[test]
fn another_session_and_a_wrong_key_are_refused_and_the_destination_stays_paused() {
    let mut p = run_until_paused("session", 64 << 10, "manual", &[]);
    refused_attempt(&mut p, "joined another session", join_other_session);
    refused_attempt(&mut p, "failed authentication", |addr, good| {
        let net = NetConfig {
            security: net::psk(b"not the key of this migration!!!").unwrap(),
            ..good.clone()
        };
        match authenticate(addr, &net) {
            Err(MigrateError::Auth { .. }) => {}
            Ok(c) => closed_by_destination(c),
            Err(e) => panic!("expected an authentication failure, got {e}"),
        }
    });
    recover(p, false);
}

#[test]
fn authenticated_peers_that_stall_or_send_garbage_do_not_end_the_recovery_wait() {
    let p = run_until_paused("stall", 128 << 10, "manual", &[]);
    recover_with(p, false, |p| {
        // Authenticates, then sends nothing: dropped at the I/O deadline.
        let staller = authenticate(&p.dest_addr, &p.net()).expect("authenticates");
        closed_by_destination(staller);
        wait_refusal(p, "recovering", "authenticated, then");
        // Authenticates, then sends what is not a migration stream.
        let mut garbage = authenticate(&p.dest_addr, &p.net()).expect("authenticates");
        garbage
            .write_all(b"GARBAGE!GARBAGE!GARBAGE!")
            .and_then(|()| garbage.flush())
            .unwrap();
        closed_by_destination(garbage);
        // Still waiting for this recovery: the source's, told now, joins.
        let v = wait_refusal(p, "recovering", "magic");
        assert!(
            !v["last_error"]
                .as_str()
                .unwrap()
                .contains("the recovery failed"),
            "{v}"
        );
    });
}

#[test]
fn strangers_stalling_their_handshakes_do_not_hold_the_sources_recovery_back() {
    let p = run_until_paused("strangers", 80 << 10, "manual", &[]);
    recover_with(p, false, |p| {
        // Three bare connections that never start TLS, held open while the
        // source recovers: each is authenticated on its own thread, so the
        // source's handshake is not queued behind their deadlines.
        let strangers: Vec<TcpStream> = (0..3).map(|_| dial(&p.dest_addr, &p.net())).collect();
        strangers
    });
}

#[test]
fn more_strangers_than_the_authenticated_cap_do_not_split_the_guest_in_a_recovery() {
    let p = run_until_paused("crowd", 80 << 10, "manual", &[]);
    recover_with(p, false, |p| {
        // Forty idle strangers held open while the source recovers: more
        // than the 16 authenticated connections that may read their
        // opening at once, fewer than the strangers' own budget of 64.
        let strangers: Vec<TcpStream> = (0..40).map(|_| dial(&p.dest_addr, &p.net())).collect();
        strangers
    });
}
