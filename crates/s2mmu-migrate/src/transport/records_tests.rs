//! The record layer against rustls itself over real sockets: what one
//! side seals the other opens (in both directions, with either side still
//! rustls's own stream), bulk data arrives byte for byte through `read`
//! and `read_vectored`, and a flipped bit in flight is refused.

use super::config::Security;
use super::conn::BoxConn;
use super::records::take_over;
use super::sockbuf::SockBuf;
use super::tls::{ephemeral_tls, tls_client, tls_server};
use rustls::{ClientConnection, ServerConnection, StreamOwned};
use std::io::{IoSliceMut, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

type Client = StreamOwned<ClientConnection, SockBuf>;
type Server = StreamOwned<ServerConnection, SockBuf>;

/// A handshake over loopback TCP through `relay` (which may alter the
/// bytes from the client); both rustls streams, their handshakes done.
fn handshake(flip_at: Option<usize>) -> (Client, Server) {
    let Security::Tls {
        server,
        client,
        server_name,
    } = ephemeral_tls().unwrap()
    else {
        panic!("ephemeral_tls is mutual TLS");
    };
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let r = TcpListener::bind("127.0.0.1:0").unwrap();
    let (l_addr, r_addr) = (l.local_addr().unwrap(), r.local_addr().unwrap());
    thread::spawn(move || relay(r, l_addr, flip_at));
    let srv = thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let deadline = Some(Instant::now() + Duration::from_secs(20));
        tls_server(Box::new(s) as BoxConn, &server, deadline).unwrap()
    });
    let c = TcpStream::connect(r_addr).unwrap();
    let deadline = Some(Instant::now() + Duration::from_secs(20));
    let c = tls_client(Box::new(c) as BoxConn, &client, &server_name, deadline).unwrap();
    let mut s = srv.join().unwrap();
    let mut c = c;
    for sock in [&mut c.sock, &mut s.sock] {
        sock.end_handshake(Duration::from_secs(20)).unwrap();
    }
    (c, s)
}

/// Forwards one connection to `to`, flipping the byte at `flip_at` of the
/// client's direction.
fn relay(l: TcpListener, to: std::net::SocketAddr, flip_at: Option<usize>) {
    let (mut a, _) = l.accept().unwrap();
    let mut b = TcpStream::connect(to).unwrap();
    let (mut a2, mut b2) = (a.try_clone().unwrap(), b.try_clone().unwrap());
    thread::spawn(move || std::io::copy(&mut b2, &mut a2));
    let mut buf = vec![0u8; 64 << 10];
    let mut at = 0usize;
    while let Ok(n) = a.read(&mut buf) {
        if n == 0 {
            break;
        }
        if let Some(f) = flip_at.filter(|f| (at..at + n).contains(f)) {
            buf[f - at] ^= 0x10;
        }
        at += n;
        if b.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = b.shutdown(std::net::Shutdown::Write);
}

/// Bytes no two offsets of which repeat within a record.
fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31) ^ (i >> 9) as u8 ^ seed)
        .collect()
}

/// Sends `data` on `w` from a thread; reads it on `r` in page-sized
/// vectored reads (as the destination does) and returns it.
fn through(mut w: BoxConn, mut r: BoxConn, data: Vec<u8>) -> (Vec<u8>, BoxConn, BoxConn) {
    let n = data.len();
    let t = thread::spawn(move || {
        w.write_all(&data).unwrap();
        w.flush().unwrap();
        w
    });
    let mut got = vec![0u8; n];
    let mut done = 0;
    while done < n {
        let (a, b) = got[done..].split_at_mut((n - done).min(4096 * 3) / 2);
        let k = r
            .read_vectored(&mut [IoSliceMut::new(a), IoSliceMut::new(b)])
            .unwrap();
        assert!(k > 0, "the stream ended at {done} of {n}");
        done += k;
    }
    (got, t.join().unwrap(), r)
}

#[test]
fn records_sealed_here_open_in_rustls_and_back() {
    for (take_client, take_server) in [(true, true), (true, false), (false, true)] {
        let (c, s) = handshake(None);
        let c: BoxConn = match take_client {
            true => Box::new(take_over(c.conn, c.sock).unwrap()),
            false => Box::new(c),
        };
        let s: BoxConn = match take_server {
            true => Box::new(take_over(s.conn, s.sock).unwrap()),
            false => Box::new(s),
        };
        let up = pattern((3 << 20) + 4097, 1);
        let (got, c, s) = through(c, s, up.clone());
        assert!(got == up, "client to server ({take_client}, {take_server})");
        let down = pattern(100_003, 7);
        let (got, _, _) = through(s, c, down.clone());
        assert!(
            got == down,
            "server to client ({take_client}, {take_server})"
        );
    }
}

#[test]
fn a_flipped_bit_in_a_record_is_refused() {
    // Past the handshake (a few KiB): inside the bulk data.
    let (c, s) = handshake(Some(200_000));
    let mut c = take_over(c.conn, c.sock).unwrap();
    let mut s = take_over(s.conn, s.sock).unwrap();
    let data = pattern(1 << 20, 3);
    let t = thread::spawn(move || {
        let _ = c.write_all(&data);
        c
    });
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0;
    let err = loop {
        match s.read(&mut buf[got..]) {
            Ok(0) => panic!("the stream ended at {got} without an error"),
            Ok(n) => got += n,
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{err}");
    assert!(
        got < 200_000,
        "data past the flipped bit was handed out: {got}"
    );
    drop(s);
    let _ = t.join();
}

#[test]
fn data_right_behind_the_handshake_is_not_lost_at_the_switch() {
    // The client queues data before its handshake ends, so rustls sends it
    // in the same write as its Finished: the server's read of Finished
    // brings it along, and the switch must neither lose nor repeat it.
    let Security::Tls {
        server,
        client,
        server_name,
    } = ephemeral_tls().unwrap()
    else {
        panic!("ephemeral_tls is mutual TLS");
    };
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let first = pattern(5000, 9);
    let rest = pattern(300_001, 4);
    let (first2, rest2) = (first.clone(), rest.clone());
    let cl = thread::spawn(move || {
        let s = TcpStream::connect(addr).unwrap();
        let mut sock = SockBuf::framed(Box::new(s), None);
        let name = rustls::pki_types::ServerName::try_from(server_name).unwrap();
        let mut c = ClientConnection::new(client, name).unwrap();
        c.writer().write_all(&first2).unwrap();
        while c.is_handshaking() || c.wants_write() {
            c.complete_io(&mut sock).unwrap();
        }
        let mut r = take_over(c, sock).unwrap();
        r.write_all(&rest2).unwrap();
        r
    });
    let (s, _) = l.accept().unwrap();
    thread::sleep(Duration::from_millis(200));
    let deadline = Some(Instant::now() + Duration::from_secs(20));
    let s = tls_server(Box::new(s) as BoxConn, &server, deadline).unwrap();
    let mut s = take_over(s.conn, s.sock).unwrap();
    let mut got = vec![0u8; first.len() + rest.len()];
    s.read_exact(&mut got).unwrap();
    assert!(
        got[..first.len()] == first[..],
        "the data sent with Finished"
    );
    assert!(got[first.len()..] == rest[..], "the data after the switch");
    drop(cl.join().unwrap());
}
