//! The record layer against rustls itself over real sockets: what one
//! side seals the other opens (in both directions, with either side still
//! rustls's own stream), bulk data arrives byte for byte through `read`
//! and `read_vectored`, and a flipped bit in flight is refused; with a
//! fixed key: the size limit of a record (padding included), the sequence
//! of nonces and the record limit of one key; records sealed in place
//! are the records a copy would have sealed, and refused when damaged.

use super::super::config::Security;
use super::super::conn::{sealed_len, sealed_offset, BoxConn, Connection, Duplex, SharedSink};
use super::super::records::{fixed_key_session, take_over, MAX_CIPHER, MAX_PLAIN, MAX_RECORDS};
use super::super::sockbuf::SockBuf;
use super::super::tls::{ephemeral_tls, tls_client, tls_server};
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
        // Both rustls's stream and the record layer check every record's
        // tag before a byte of it is read: the stream's page hashes need
        // not be checked again.
        assert!(c.authenticates() && s.authenticates());
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

const KEY: [u8; 32] = [0x42; 32];
const IV: [u8; 12] = [0x24; 12];

/// The records the fixed-key session seals for `writes` (one write call
/// each), numbered from `first_seq`; the first write's error, if any.
fn sealed(writes: &[&[u8]], first_seq: u64) -> (Vec<u8>, Option<std::io::Error>) {
    let out = SharedSink::default();
    let sock = Duplex {
        input: std::io::empty(),
        output: out.clone(),
    };
    let mut w = fixed_key_session(Box::new(sock), KEY, IV, false, first_seq).unwrap();
    let err = writes.iter().find_map(|d| w.write_all(d).err());
    let bytes = out.bytes();
    (bytes, err)
}

/// What the fixed-key session opens of `stream` (read `chunk` bytes at a
/// time) from `first_seq`, and the error that ended it.
fn opened(stream: Vec<u8>, first_seq: u64, chunk: usize) -> (Vec<u8>, std::io::Error) {
    let sock = Duplex {
        input: std::io::Cursor::new(stream),
        output: std::io::sink(),
    };
    let mut r = fixed_key_session(Box::new(sock), KEY, IV, false, first_seq).unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; chunk];
    loop {
        match r.read(&mut buf) {
            Ok(0) => panic!("the stream ended without an error (no close_notify was sent)"),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => return (got, e),
        }
    }
}

/// The stream's records, each with its header.
fn split(stream: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 5 <= stream.len() {
        let len = usize::from(u16::from_be_bytes([stream[at + 3], stream[at + 4]]));
        out.push(stream[at..at + 5 + len].to_vec());
        at += 5 + len;
    }
    out
}

/// One record sealed by hand with the fixed key: `inner` is the whole
/// inner plaintext (data, content type, padding); `len` overrides the
/// header's length field.
fn seal_raw(seq: u64, inner: &[u8], len: Option<usize>) -> Vec<u8> {
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &KEY).unwrap());
    let mut nonce = IV;
    for (b, s) in nonce[4..].iter_mut().zip(seq.to_be_bytes()) {
        *b ^= s;
    }
    let len = len.unwrap_or(inner.len() + 16);
    let h = [0x17, 3, 3, (len >> 8) as u8, len as u8];
    let mut body = inner.to_vec();
    key.seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(h), &mut body)
        .unwrap();
    [&h[..], &body].concat()
}

#[test]
fn records_at_the_size_limit_open_and_larger_ones_are_refused() {
    let full = pattern(MAX_PLAIN, 5);
    let (got, e) = opened(
        seal_raw(0, &[&full[..], &[0x17]].concat(), None),
        0,
        1 << 16,
    );
    assert!(got == full, "2^14 bytes of data: one whole record");
    assert!(e.to_string().contains("close_notify"), "{e}");
    // One data byte more: 2^14 + 2 bytes of inner plaintext.
    let over = pattern(MAX_PLAIN + 1, 5);
    let (got, e) = opened(
        seal_raw(0, &[&over[..], &[0x17]].concat(), None),
        0,
        1 << 16,
    );
    assert!(
        got.is_empty() && e.to_string().contains("record_overflow"),
        "{e}"
    );
    // Padding counts: 100 bytes of data, its type and zeros to 2^14 + 2.
    let padded = [
        &pattern(100, 1)[..],
        &[0x17],
        &vec![0u8; MAX_PLAIN + 1 - 100],
    ]
    .concat();
    let (got, e) = opened(seal_raw(0, &padded, None), 0, 1 << 16);
    assert!(
        got.is_empty() && e.to_string().contains("record_overflow"),
        "{e}"
    );
    // The header's length past 2^14 + 256 is refused before any decryption.
    let (got, e) = opened(seal_raw(0, &[1, 0x17], Some(MAX_CIPHER + 1)), 0, 1 << 16);
    assert!(
        got.is_empty() && e.to_string().contains("length out of bounds"),
        "{e}"
    );
}

#[test]
fn records_out_of_sequence_are_refused() {
    let (a, b, c) = (pattern(1000, 1), pattern(2000, 2), pattern(3000, 3));
    let (stream, err) = sealed(&[&a, &b, &c], 0);
    assert!(err.is_none());
    let recs = split(&stream);
    assert_eq!(recs.len(), 3);
    let (got, e) = opened(stream.clone(), 0, 512);
    assert!(got == [&a[..], &b, &c].concat(), "in order: all of it");
    assert!(e.to_string().contains("close_notify"), "{e}");
    for (name, order) in [("swapped", [0, 2, 1]), ("replayed", [0, 0, 1])] {
        let s: Vec<u8> = order.iter().flat_map(|&i| recs[i].clone()).collect();
        let (got, e) = opened(s, 0, 512);
        assert!(got == a, "{name}: only the first record's data");
        assert!(e.to_string().contains("decryption failed"), "{name}: {e}");
    }
    let (got, e) = opened(stream, 1, 512);
    assert!(
        got.is_empty() && e.to_string().contains("decryption failed"),
        "{e}"
    );
}

#[test]
fn one_key_seals_and_opens_at_most_2_pow_24_records() {
    let (stream, err) = sealed(&[b"last", b"one too many"], MAX_RECORDS - 1);
    let err = err.expect("the record past the limit is not sealed");
    assert!(err.to_string().contains("record limit"), "{err}");
    assert_eq!(split(&stream).len(), 1);
    // A peer that seals on past the limit is refused at record 2^24.
    let past = seal_raw(MAX_RECORDS, b"past\x17", None);
    let (got, e) = opened([stream, past].concat(), MAX_RECORDS - 1, 64);
    assert!(got == b"last", "the records below the limit are read");
    assert!(e.to_string().contains("record limit"), "{e}");
}

/// `plain` laid out as `Connection::write_sealed` wants it, the room
/// around each record filled with junk the sealing must overwrite.
fn framed(plain: &[u8]) -> Vec<u8> {
    let mut frames = vec![0xa5u8; sealed_len(plain.len())];
    for (i, &b) in plain.iter().enumerate() {
        frames[sealed_offset(i)] = b;
    }
    frames
}

#[test]
fn records_sealed_in_place_are_those_a_copy_seals_and_open_to_the_same_bytes() {
    let head = pattern(4107, 9);
    // Whole records, and a last one of a page and a half.
    for len in [MAX_PLAIN, 3 * MAX_PLAIN, 2 * MAX_PLAIN + 6144, 100] {
        let plain = pattern(len, 4);
        let (copied, err) = sealed(&[&head, &plain], 3);
        assert!(err.is_none());
        let out = SharedSink::default();
        let sock = Duplex {
            input: std::io::empty(),
            output: out.clone(),
        };
        let mut w = fixed_key_session(Box::new(sock), KEY, IV, false, 3).unwrap();
        assert!(w.seals_in_place());
        let mut frames = framed(&plain);
        frames.extend_from_slice(&[0xa5; 100]);
        w.write_sealed(&head, &mut frames, len).unwrap();
        let stream = out.bytes();
        assert!(
            stream == copied,
            "{len} bytes: not the copying path's records"
        );
        let (got, e) = opened(stream, 3, 5000);
        assert!(got == [&head[..], &plain].concat(), "{len} bytes");
        assert!(e.to_string().contains("close_notify"), "{e}");
    }
}

#[test]
fn a_record_sealed_in_place_and_damaged_is_refused() {
    let head = pattern(4107, 9);
    let plain = pattern(4 * MAX_PLAIN, 4);
    let out = SharedSink::default();
    let sock = Duplex {
        input: std::io::empty(),
        output: out.clone(),
    };
    let mut w = fixed_key_session(Box::new(sock), KEY, IV, false, 0).unwrap();
    w.write_sealed(&head, &mut framed(&plain), plain.len())
        .unwrap();
    let good = out.bytes();
    // The third of the in-place records: its header, ciphertext, tag.
    let third = split(&good)[..3].iter().map(Vec::len).sum::<usize>();
    for at in [third + 2, third + 5 + 7000, third + 5 + MAX_PLAIN + 10] {
        let mut bad = good.clone();
        bad[at] ^= 0x01;
        let (got, e) = opened(bad, 0, 5000);
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{at}: {e}");
        assert!(
            got.len() <= head.len() + 2 * MAX_PLAIN,
            "{at}: past the damage"
        );
    }
    // Frames shorter than the records need: refused, nothing written.
    let before = out.bytes().len();
    let e = w
        .write_sealed(&head, &mut framed(&plain)[..100], plain.len())
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
    assert_eq!(out.bytes().len(), before);
}

/// What the fixed-key session opens of `stream` after `skip` bytes read
/// alone, in vectored reads of 4 KiB buffers asking for `ask` bytes each
/// (the destination's reads of a PAGES record's data), and the error
/// that ended it.
fn opened_in_pages(stream: Vec<u8>, skip: usize, ask: usize) -> (Vec<u8>, std::io::Error) {
    let sock = Duplex {
        input: std::io::Cursor::new(stream),
        output: std::io::sink(),
    };
    let mut r = fixed_key_session(Box::new(sock), KEY, IV, false, 0).unwrap();
    let mut got = vec![0u8; skip];
    r.read_exact(&mut got).unwrap();
    loop {
        let mut pages = vec![0u8; ask];
        let mut iov: Vec<IoSliceMut> = pages.chunks_mut(4096).map(IoSliceMut::new).collect();
        match r.read_vectored(&mut iov) {
            Ok(0) => panic!("the stream ended without an error (no close_notify was sent)"),
            Ok(n) => got.extend_from_slice(&pages[..n]),
            Err(e) => return (got, e),
        }
    }
}

#[test]
fn bulk_vectored_reads_land_every_byte_and_stop_at_damage() {
    let head = pattern(4107, 9);
    let plain = pattern(40 * MAX_PLAIN + 6144, 4);
    let (good, err) = sealed(&[&head, &plain], 0);
    assert!(err.is_none());
    let whole = [&head[..], &plain].concat();
    // Reads small and large enough to take the streaming copy, starting
    // at record and page boundaries and off them.
    for (skip, ask) in [
        (4107, 64 << 10),
        (4107, 1 << 20),
        (5000, 256 << 10),
        (0, 4096),
    ] {
        let (got, e) = opened_in_pages(good.clone(), skip, ask);
        assert!(got == whole, "skip {skip}, ask {ask}: not the bytes sealed");
        assert!(e.to_string().contains("close_notify"), "{e}");
    }
    // A flipped bit in the tenth record: the bytes before it arrive, none
    // of it or after it.
    let tenth = split(&good)[..9].iter().map(Vec::len).sum::<usize>();
    let mut bad = good.clone();
    bad[tenth + 5 + 3000] ^= 0x01;
    let (got, e) = opened_in_pages(bad, 4107, 1 << 20);
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
    let before = head.len() + 8 * MAX_PLAIN;
    assert!(got.len() <= before, "{} bytes: past the damage", got.len());
    assert!(got[..] == whole[..got.len()], "the bytes before the damage");
}
