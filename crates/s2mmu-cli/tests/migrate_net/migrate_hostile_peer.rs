//! Peers past the opening that misbehave against a `s2mmu` process: a
//! destination whose REJECTED reason carries escape sequences and forged
//! log lines, a destination answering PROGRESS for ever, a source that
//! drips its stream a byte at a time after its HEADER, and a TLS stream
//! damaged in transit after authentication. Each ends with a named error
//! in bounded time; none holds the other side for ever, and no peer text
//! reaches stderr unescaped. Every peer is on 127.0.0.1; each test bounds
//! its own time. Behaviour only: no timing is asserted.

#[path = "../cli_common/mod.rs"]
mod cli_common;
#[path = "../recover_common/mod.rs"]
mod recover_common;

use recover_common::{exit_and_log, quick_and, rest_of, spawn_listener, spawn_source, wait_exit};
use s2mmu_cli::vm_format::FormatArg;
use s2mmu_migrate::hash::checksum;
use s2mmu_migrate::wire::{tag, Header, WireReader, WireWriter};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

const SMALL: [&str; 10] = quick_and("--io-timeout", "1s");

/// How long a process may take before the test calls it hung.
const LIMIT: Duration = Duration::from_secs(30);

/// Runs a source to `addr` (plain TCP unless `extra` says otherwise): whether it succeeded, its stderr.
fn source(addr: &str, extra: &[&str]) -> (bool, String) {
    let mut c = spawn_source(addr, &[&SMALL[..], extra].concat());
    let (st, log) = exit_and_log(&mut c, LIMIT);
    (st.success(), log)
}

/// A destination written here: reads the source's opening, then runs
/// `then` on the connection.
fn fake_destination(
    then: impl FnOnce(TcpStream) + Send + 'static,
) -> (String, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    l.set_nonblocking(true).unwrap();
    let t = std::thread::spawn(move || {
        let t0 = Instant::now();
        let mut s = loop {
            match l.accept() {
                Ok((s, _)) => break s,
                Err(_) if t0.elapsed() < LIMIT => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => panic!("no source connected: {e}"),
            }
        };
        s.set_nonblocking(false).unwrap();
        WireReader::new(&mut s).unwrap();
        then(s)
    });
    (addr, t)
}

#[test]
fn a_rejected_reason_with_escape_sequences_is_printed_escaped() {
    let (addr, t) = fake_destination(|s| {
        let mut w = WireWriter::replies(s);
        let reason = b"\x1b[2J\x1b[31mno\r\ndestination listening on FORGED\x07\\";
        w.control(tag::REJECTED, reason).unwrap();
        w.flush().unwrap();
        std::thread::sleep(Duration::from_millis(500));
    });
    let (ok, log) = source(&addr, &[]);
    t.join().unwrap();
    assert!(!ok, "{log}");
    assert!(log.contains("rejected the migration"), "{log}");
    assert!(
        !log.contains('\x1b') && !log.contains('\x07') && !log.contains('\r'),
        "control characters reached stderr: {log:?}"
    );
    assert!(
        !log.lines()
            .any(|l| l.starts_with("destination listening on")),
        "a forged line: {log}"
    );
    assert!(log.contains("\\u{1b}[31mno\\r\\n"), "{log}");
}

#[test]
fn a_destination_answering_progress_for_ever_ends_the_source() {
    let (addr, t) = fake_destination(|mut s| {
        let mut w = WireWriter::replies(Vec::new());
        w.control(tag::PROGRESS, &[]).unwrap();
        let progress = w.into_inner();
        let t0 = Instant::now();
        while t0.elapsed() < LIMIT && s.write_all(&progress).is_ok() {
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    let (ok, log) = source(&addr, &[]);
    assert!(!ok, "{log}");
    assert!(log.contains("PROGRESS"), "{log}");
    drop(t);
}

fn header() -> Header {
    Header {
        mem_size: 16 << 20,
        slots: 1,
        gpa_base: 1 << 32,
        vcpus: 1,
        channels: 1,
        backing: "anonymous".into(),
        verify_full: false,
        postcopy: false,
        format: FormatArg::Arm64.into(),
        image: None,
    }
}

#[test]
fn a_source_dripping_its_stream_after_the_header_is_cut_off() {
    let (mut dest, addr, derr) = spawn_listener(&SMALL);
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(&WireWriter::new(Vec::new(), &header()).unwrap().into_inner())
        .unwrap();
    // A valid PROBE of 1 MiB, then its filler a byte every 300 ms.
    let len = 1u64 << 20;
    let mut probe = vec![tag::PROBE];
    probe.extend_from_slice(&len.to_le_bytes());
    probe.extend_from_slice(&checksum(&len.to_le_bytes(), u64::from(tag::PROBE)).to_le_bytes());
    s.write_all(&probe).unwrap();
    let dripper = std::thread::spawn(move || {
        let t0 = Instant::now();
        while t0.elapsed() < LIMIT && s.write_all(&[7]).is_ok() {
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    let st = wait_exit(&mut dest, LIMIT);
    let log = rest_of(derr);
    assert!(!st.success(), "{log}");
    assert!(log.contains("slower than"), "{log}");
    drop(dripper);
}

/// A proxy to `to` that flips one byte of the first connection's
/// source-to-destination direction at byte `at`.
fn flipping_proxy(to: String, at: u64) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for (k, from) in l.incoming().enumerate() {
            let Ok(mut from) = from else { return };
            let Ok(mut out) = TcpStream::connect(&to) else {
                return;
            };
            let (mut back_from, mut back_to) =
                (out.try_clone().unwrap(), from.try_clone().unwrap());
            std::thread::spawn(move || std::io::copy(&mut back_from, &mut back_to));
            std::thread::spawn(move || {
                let (mut pos, mut buf) = (0u64, vec![0u8; 64 << 10]);
                while let Ok(n @ 1..) = from.read(&mut buf) {
                    if k == 0 && pos <= at && at < pos + n as u64 {
                        buf[(at - pos) as usize] ^= 0x40;
                    }
                    pos += n as u64;
                    if out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = out.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    addr
}

#[test]
fn a_tls_stream_damaged_after_authentication_is_a_named_failure_not_a_refused_peer() {
    let d = std::env::temp_dir().join(format!("s2mmu-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let key = d.join("key");
    std::fs::write(&key, "0123456789abcdef0123456789abcdef\n").unwrap();
    let auth = ["--psk", key.to_str().unwrap(), "--channels", "1"];
    let (mut dest, addr, derr) = spawn_listener(&[&SMALL[..], &auth[..]].concat());
    let proxy = flipping_proxy(addr, 6 << 20);
    // Raw pages, so the stream is long enough to reach the flipped byte
    // (compressed, the guest's pages take a fraction of it).
    let (ok, slog) = source(&proxy, &[&auth[..], &["--compress", "off"]].concat());
    // One attempt: the damaged stream ends the destination with an error.
    let st = wait_exit(&mut dest, LIMIT);
    let log = rest_of(derr);
    assert!(!ok, "{slog}");
    assert!(!st.success(), "{log}");
    assert!(log.contains("damaged in transit"), "{log}");
    assert!(!log.contains("refused a peer"), "{log}");
    let _ = std::fs::remove_dir_all(&d);
}
