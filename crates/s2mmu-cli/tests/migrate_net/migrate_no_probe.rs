//! A migration sends the guest's pages and nothing of the guest's size
//! besides: the bytes between two `s2mmu` processes are counted by a relay
//! between them and compared with the stream bytes the source reports.
//! With `--link-probe` the same count shows the probe (as many bytes as
//! guest memory), so the count can see one. Every peer is on 127.0.0.1.

#[path = "../cli_common/mod.rs"]
mod cli_common;
#[path = "../recover_common/mod.rs"]
mod recover_common;

use recover_common::{bin, spawn_listener, wait_exit, QUICK};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Guest memory of these runs, bytes.
const MEM: u64 = 64 << 20;

/// Handshakes, record headers, the vCPU state, digests and replies: what
/// the source→destination direction carries besides the rounds' stream
/// bytes (well under a tenth of the guest).
const SLACK: u64 = 4 << 20;

/// A relay to `to` on a loopback port of its own: every connection is
/// forwarded both ways, the bytes towards `to` added to the count.
fn counting_relay(to: String) -> (String, Arc<AtomicU64>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let count = Arc::new(AtomicU64::new(0));
    let c = count.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            let Ok(d) = TcpStream::connect(&to) else {
                return;
            };
            let (s2, d2) = (s.try_clone().unwrap(), d.try_clone().unwrap());
            let c = c.clone();
            std::thread::spawn(move || pump(s, d, Some(&c)));
            std::thread::spawn(move || pump(d2, s2, None));
        }
    });
    (addr, count)
}

/// Copies `from` into `into` until either ends, counting into `count`.
fn pump(mut from: TcpStream, mut into: TcpStream, count: Option<&AtomicU64>) {
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(c) = count {
            c.fetch_add(n as u64, Ordering::SeqCst);
        }
        if into.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = into.shutdown(Shutdown::Write);
}

/// One two-process migration through the relay: the bytes relayed towards
/// the destination and the source's JSON result.
fn migrate_counted(extra: &[&str]) -> (u64, serde_json::Value) {
    let more = ["--io-timeout", "10s", "--channels", "2"];
    let args = [&["--mem", "64M"][..], &QUICK[2..], &more].concat();
    let (mut dest, addr, _derr) = spawn_listener(&args);
    let (relay, count) = counting_relay(addr);
    let out = Command::new(bin())
        .args(["migrate", "--to", &relay, "--plot", "", "--json", "-q"])
        .args(&args)
        .args(extra)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(wait_exit(&mut dest, Duration::from_secs(60)).success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    (count.load(Ordering::SeqCst), v["results"][0].clone())
}

#[test]
fn a_migration_sends_no_probe_of_the_guests_size() {
    let (relayed, r) = migrate_counted(&[]);
    let stream = r["bytes"].as_u64().unwrap();
    assert_eq!(r["link_bytes"].as_u64(), Some(0), "{r}");
    assert!(r["link_bytes_per_s"].is_null(), "{r}");
    assert!(r["plain_tcp"]["plain_tcp_bytes"].is_null(), "{r}");
    // The empty probe is still answered, and timed with the connections
    // as the setup before round 0, which the span to the last byte holds.
    let setup = &r["setup_parts_ns"];
    let ns = |v: &serde_json::Value| v.as_u64().unwrap_or_else(|| panic!("{r}"));
    assert!(
        ns(&setup["connect"]) > 0 && ns(&setup["link_probe"]) > 0,
        "{r}"
    );
    assert_eq!(ns(&setup["channel_probe"]), 0, "{r}");
    let to_last = ns(&r["to_last_byte_sent_ns"]);
    assert!(
        to_last > ns(&setup["connect"]) + ns(&setup["link_probe"]),
        "{r}"
    );
    assert!(
        relayed >= stream && relayed <= stream + SLACK,
        "{relayed} bytes relayed for {stream} stream bytes of a {MEM}-byte guest"
    );
}

#[test]
fn with_link_probe_the_count_sees_the_probe() {
    let (relayed, r) = migrate_counted(&["--link-probe"]);
    let stream = r["bytes"].as_u64().unwrap();
    assert_eq!(r["link_bytes"].as_u64(), Some(MEM), "{r}");
    assert!(
        relayed >= stream + MEM,
        "{relayed} bytes relayed: the {MEM}-byte probe and {stream} stream bytes"
    );
}
