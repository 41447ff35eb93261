//! `scripts/netns_delay_relay.py`, the latency of the shaped links where
//! the kernel has no netem: a ping-pong through it takes at least the RTT
//! it was given and, at its fastest, not a whole millisecond more; a new
//! connection's first exchange pays the TCP handshake's round trip too;
//! a stream through it arrives whole and in order; behind a receiver
//! that does not read, it takes in what a link holds, not a whole stream,
//! and a receiver's reset ends the writer's connection.
//! Needs python3 (the test fails, saying so, without it).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// An echo server on loopback: every byte it reads it writes back.
fn echo() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            std::thread::spawn(move || {
                let mut w = c.try_clone().unwrap();
                let _ = std::io::copy(&mut c, &mut w);
            });
        }
    });
    addr
}

struct Relay(Child, String);

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The relay in front of `to` with `rtt_ms`, and where it listens.
fn relay(to: &str, rtt_ms: &str) -> Relay {
    relay_with(to, rtt_ms, &[])
}

/// [`relay`] with further options.
fn relay_with(to: &str, rtt_ms: &str, more: &[&str]) -> Relay {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/netns_delay_relay.py");
    let mut c = Command::new("python3")
        .arg(script)
        .args(["--listen", "127.0.0.1:0", "--to", to, "--rtt-ms", rtt_ms])
        .args(more)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("the relay needs python3: {e}"));
    let mut line = String::new();
    BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split("listening on ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .unwrap_or_else(|| panic!("the relay said {line:?}"))
        .to_string();
    Relay(c, addr)
}

fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// The shortest of `n` one-byte round trips on `s`, each answer checked.
fn min_round_trip(s: &mut TcpStream, n: u8) -> Duration {
    let mut best = Duration::MAX;
    for i in 0..n {
        let t = Instant::now();
        s.write_all(&[i]).unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).unwrap();
        best = best.min(t.elapsed());
        assert_eq!(b[0], i);
    }
    best
}

#[test]
fn a_ping_pong_through_the_relay_takes_at_least_its_rtt() {
    let e = echo();
    let r = relay(&e, "20");
    let mut s = connect(&r.1);
    // Each direction is held 10 ms: no round trip can be shorter than 20.
    let best = min_round_trip(&mut s, 10);
    assert!(best >= Duration::from_millis(20), "{best:?}");
}

#[test]
fn a_short_rtt_is_held_for_that_long_not_for_a_millisecond_tick() {
    let e = echo();
    let r = relay(&e, "0.2");
    let mut s = connect(&r.1);
    // 0.1 ms each way. A relay whose timer ticks in whole milliseconds
    // holds each direction 1 ms or more: no round trip under 2 ms.
    let best = min_round_trip(&mut s, 100);
    assert!(best < Duration::from_millis(1), "{best:?}");
}

#[test]
fn a_new_connection_pays_the_handshakes_round_trip() {
    let e = echo();
    let r = relay(&e, "20");
    // Over a link of 20 ms RTT: SYN and SYN-ACK (20 ms), the byte out
    // (10) and back (10), from the start of the connect.
    let t = Instant::now();
    let mut s = connect(&r.1);
    s.write_all(&[7]).unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).unwrap();
    let first = t.elapsed();
    assert_eq!(b[0], 7);
    assert!(first >= Duration::from_millis(40), "{first:?}");
}

#[test]
fn a_stream_through_the_relay_arrives_whole_and_in_order() {
    let e = echo();
    let r = relay(&e, "1");
    let mut s = connect(&r.1);
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i * 7 + i / 251) as u8).collect();
    let mut w = s.try_clone().unwrap();
    let sent = data.clone();
    let writer = std::thread::spawn(move || w.write_all(&sent).unwrap());
    let mut got = vec![0u8; data.len()];
    s.read_exact(&mut got).unwrap();
    writer.join().unwrap();
    assert!(got == data, "the relay changed or reordered bytes");
}

/// A server that accepts and never reads (its connections stay open).
fn sink() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        for c in l.incoming() {
            let Ok(c) = c else { return };
            kept.push(c);
        }
    });
    addr
}

/// Bytes a writer gets into a connection through a relay with `more`
/// options to a receiver that never reads, up to `cap`: it stops at the
/// first write that waits 2 s (a relay that reads on is not that late,
/// even on a loaded host).
fn taken_before_blocking(more: &[&str], cap: usize) -> usize {
    let r = relay_with(&sink(), "0.2", more);
    let mut s = connect(&r.1);
    s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let chunk = vec![0x5a_u8; 64 << 10];
    let mut taken = 0;
    while taken < cap {
        match s.write(&chunk) {
            Ok(n) => taken += n,
            Err(_) => break,
        }
    }
    taken
}

#[test]
fn behind_a_receiver_that_does_not_read_it_holds_what_a_link_holds() {
    // The kernel's buffers on the way (the writer's, the relay's both
    // sockets, the receiver's) take some MiB on loopback; the relay itself
    // takes at most its 1 MiB: 9 MiB in all here. Unbounded (the largest
    // --max-held), it takes the whole 96 MiB offered, and the check below
    // fails there.
    let (cap, bound) = (96 << 20, 48 << 20);
    let unbounded = taken_before_blocking(&["--max-held", "1073741824"], cap);
    assert!(
        unbounded >= bound,
        "an unbounded relay took only {} MiB",
        unbounded >> 20
    );
    let bounded = taken_before_blocking(&[], cap);
    assert!(
        bounded < bound,
        "{} MiB taken with a 1 MiB bound",
        bounded >> 20
    );
}

#[test]
fn a_reset_behind_the_relay_ends_the_writers_connection() {
    // A receiver that reads nothing and, after a second, closes: with its
    // received bytes unread, the close is a reset.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let to = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let Ok((c, _)) = l.accept() else { return };
        std::thread::sleep(Duration::from_secs(1));
        drop(c);
    });
    let r = relay(&to, "0.2");
    let mut s = connect(&r.1);
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let chunk = vec![0x5a_u8; 64 << 10];
    // The relay stops reading with its bound full; a relay that then waits
    // for room forever leaves the write blocked until its timeout.
    let err = loop {
        if let Err(e) = s.write(&chunk) {
            break e;
        }
    };
    assert!(
        !matches!(
            err.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
        "the writer waited out its timeout: {err}"
    );
}
