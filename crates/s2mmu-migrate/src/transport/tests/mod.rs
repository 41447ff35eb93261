//! The transports' contract, over real sockets: a shutdown handle ends a
//! read blocked in another thread, a listener's accept keeps its deadline
//! and fails once shut down, TLS and the pre-shared key run over a Unix
//! socket as over TCP, and the I/O timeout bounds a read on both.

mod admit;
mod records;

use super::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::{Duration, Instant};

/// A connected TCP pair over loopback.
fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    (a, b)
}

/// A read blocked on `c` (with a 20 s timeout) ends soon after its
/// shutdown handle is used from this thread.
fn shutdown_ends_a_blocked_read(c: BoxConn) {
    c.set_io_timeout(Some(Duration::from_secs(20))).unwrap();
    let h = c.shutdown_handle().unwrap();
    let mut c = c;
    let reader = thread::spawn(move || {
        let t = Instant::now();
        let mut b = [0u8; 16];
        let r = c.read(&mut b);
        (r.map_err(|e| e.kind()), t.elapsed())
    });
    thread::sleep(Duration::from_millis(100));
    h.shutdown();
    let (r, took) = reader.join().unwrap();
    assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");
    assert!(
        took < Duration::from_secs(10),
        "the read ended by the handle, {took:?}"
    );
}

#[test]
fn a_shutdown_handle_ends_a_blocked_tcp_read() {
    let (a, _b) = tcp_pair();
    shutdown_ends_a_blocked_read(Box::new(a));
}

#[test]
fn a_shutdown_handle_ends_a_blocked_unix_read() {
    let (a, _b) = UnixStream::pair().unwrap();
    shutdown_ends_a_blocked_read(Box::new(a));
}

#[test]
fn the_io_timeout_bounds_a_read_on_both_transports() {
    let (t, _t2) = tcp_pair();
    let (u, _u2) = UnixStream::pair().unwrap();
    for c in [Box::new(t) as BoxConn, Box::new(u)] {
        c.set_io_timeout(Some(Duration::from_millis(50))).unwrap();
        // The kernel keeps it in its own ticks: about what was set.
        let t = c.io_timeout().expect("a timeout is set");
        assert!(
            t >= Duration::from_millis(50) && t < Duration::from_millis(100),
            "{t:?}"
        );
        let mut c = c;
        let e = c.read(&mut [0u8; 4]).expect_err("nothing comes");
        assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "{e}"
        );
    }
}

fn accept_keeps_its_deadline_and_fails_once_shut_down(l: &dyn Listener) {
    let t = Instant::now();
    let r = l.accept_until(Some(t + Duration::from_millis(50))).unwrap();
    assert!(r.is_none(), "nobody connected");
    assert!(t.elapsed() >= Duration::from_millis(50));
    l.shutdown_handle().unwrap().shutdown();
    let r = l.accept_until(Some(Instant::now() + Duration::from_secs(5)));
    assert!(r.is_err(), "a shut-down listener accepts nothing");
}

#[test]
fn a_tcp_listener_keeps_its_deadline_and_its_shutdown() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    let c = thread::spawn(move || TcpStream::connect(a).unwrap());
    let (conn, peer) = l.accept_until(None).unwrap().expect("a connection");
    assert_eq!(peer, conn.peer());
    drop(c.join().unwrap());
    accept_keeps_its_deadline_and_fails_once_shut_down(&l);
}

fn temp_socket(name: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("s2mmu-tr-{}-{name}.sock", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

#[test]
fn a_unix_listener_keeps_its_deadline_and_its_shutdown() {
    let p = temp_socket("listen");
    let l = UnixListen::bind(&p).unwrap();
    let q = p.clone();
    let c = thread::spawn(move || UnixStream::connect(q).unwrap());
    let (_conn, peer) = l.accept_until(None).unwrap().expect("a connection");
    assert!(peer.contains(&p.display().to_string()), "{peer}");
    drop(c.join().unwrap());
    accept_keeps_its_deadline_and_fails_once_shut_down(&l);
    drop(l);
    assert!(
        !p.exists(),
        "the socket's file is removed with the listener"
    );
}

/// Runs `net`'s handshake over a Unix socket pair and sends 1 MiB each
/// way through the secured connections.
fn secured_over_unix(net: &NetConfig) -> Result<(), MigrateError> {
    let (a, b) = UnixStream::pair().unwrap();
    let snet = net.clone();
    let srv = thread::spawn(move || -> Result<Vec<u8>, MigrateError> {
        let mut c = server(b, &snet)?;
        let mut got = vec![0u8; 1 << 20];
        c.read_exact(&mut got)
            .map_err(|e| MigrateError::io("read", &e))?;
        c.write_all(&got)
            .map_err(|e| MigrateError::io("write", &e))?;
        c.flush().map_err(|e| MigrateError::io("flush", &e))?;
        Ok(got)
    });
    let mut c = client(a, net)?;
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + 3) as u8).collect();
    c.write_all(&data)
        .map_err(|e| MigrateError::io("write", &e))?;
    c.flush().map_err(|e| MigrateError::io("flush", &e))?;
    let mut back = vec![0u8; data.len()];
    c.read_exact(&mut back)
        .map_err(|e| MigrateError::io("read", &e))?;
    assert_eq!(srv.join().unwrap()?, data);
    assert_eq!(back, data);
    Ok(())
}

#[test]
fn tls_and_the_key_run_over_a_unix_socket() {
    let t = Duration::from_secs(5);
    for security in [
        Security::Plain,
        ephemeral_tls().unwrap(),
        psk(b"a key of sixteen bytes or more").unwrap(),
    ] {
        let what = security.describe();
        let net = NetConfig {
            io_timeout: t,
            security,
        };
        secured_over_unix(&net).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

#[test]
fn a_wrong_key_over_a_unix_socket_fails_authentication() {
    let (a, b) = UnixStream::pair().unwrap();
    let t = Duration::from_secs(5);
    let dnet = NetConfig {
        io_timeout: t,
        security: psk(b"the destination's own key").unwrap(),
    };
    let snet = NetConfig {
        io_timeout: t,
        security: psk(b"a different key, the source's").unwrap(),
    };
    let srv = thread::spawn(move || server(b, &dnet).map(|_| ()));
    let c = client(a, &snet);
    assert!(matches!(
        srv.join().unwrap(),
        Err(MigrateError::Auth { .. })
    ));
    assert!(c.is_err());
}

#[test]
fn vectored_reads_of_a_plain_connection_deliver_the_stream_in_order() {
    // Small reads fill the buffer, large vectored ones take what it holds
    // and then go straight to the socket: the bytes still come in order.
    let (mut w, r) = tcp_pair();
    let data: Vec<u8> = (0..(1usize << 20) + 4196)
        .map(|i| (i as u8) ^ (i >> 11) as u8)
        .collect();
    let sent = data.clone();
    let t = thread::spawn(move || w.write_all(&sent).unwrap());
    let mut r = sockbuf::plain(Box::new(r), Duration::from_secs(20)).unwrap();
    let mut got = vec![0u8; data.len()];
    r.read_exact(&mut got[..100]).unwrap();
    let mut at = 100;
    while at < got.len() {
        let mut pages: Vec<std::io::IoSliceMut<'_>> = got[at..]
            .chunks_mut(4096)
            .map(std::io::IoSliceMut::new)
            .collect();
        let n = r.read_vectored(&mut pages).unwrap();
        assert!(n > 0, "the stream ended at {at}");
        at += n;
    }
    t.join().unwrap();
    assert!(got == data, "the bytes differ");
}
