//! Strangers without the key against a destination process (`s2mmu
//! migrate --listen`, one attempt): a scan's connect-and-close, a reset, a
//! connection left silent, a ClientHello dripped a byte at a time, a flood
//! of a thousand idle connections, strangers held open while the real
//! source's channels join. None of them is an attempt of the migration:
//! the real source that comes after (or during) them completes, and the
//! destination exits 0 after it. Every peer is on 127.0.0.1; each test
//! bounds its own time. Behaviour only: no timing is asserted.

#[path = "../cli_common/mod.rs"]
mod cli_common;
#[path = "../recover_common/mod.rs"]
mod recover_common;

use recover_common::{
    exit_and_log, rest_of, spawn_listener, spawn_source, wait_exit, write_pki, QUICK,
};
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, ChildStderr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const SMALL: [&str; 8] = QUICK;

/// The destination's --io-timeout: the deadline that cuts silent and
/// dripping strangers (short, so that the tests see it act), and its reads
/// of the real source's stream (at 1 s, one timed out at load 40).
const DEST_IO: Duration = Duration::from_secs(5);

/// The real source's --io-timeout: long, as the machine's speed and not
/// the behaviour under test decides how fast a loaded destination answers
/// (at 1 s, a source connecting during the flood timed out once in 6 runs
/// at load 20).
const SOURCE_IO: &str = "30s";

/// How long a process may take before the test calls it hung.
const LIMIT: Duration = Duration::from_secs(60);

/// A directory of its own for each test, with a key and a PKI in it.
fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("s2mmu-strangers-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The flags of `mode` ("psk" or "tls"), files written into `d`.
fn auth(mode: &str, d: &std::path::Path) -> Vec<String> {
    let s = |p: &PathBuf| p.to_str().unwrap().to_string();
    if mode == "psk" {
        let key = d.join("key");
        std::fs::write(&key, "0123456789abcdef0123456789abcdef\n").unwrap();
        vec!["--psk".into(), s(&key)]
    } else {
        let [c, k, a] = write_pki(d, "");
        vec![
            "--tls-cert".into(),
            s(&c),
            "--tls-key".into(),
            s(&k),
            "--tls-ca".into(),
            s(&a),
        ]
    }
}

/// A destination with `auth` and `extra`; its address and stderr.
fn destination(auth: &[String], extra: &[&str]) -> (Child, String, BufReader<ChildStderr>) {
    let a: Vec<&str> = auth.iter().map(String::as_str).collect();
    let io = format!("{}s", DEST_IO.as_secs());
    spawn_listener(&[&SMALL[..], &["--io-timeout", &io], &a[..], extra].concat())
}

/// Runs the real source to `addr`; its stderr when it failed.
fn real_source(addr: &str, auth: &[String], extra: &[&str]) -> Result<(), String> {
    let a: Vec<&str> = auth.iter().map(String::as_str).collect();
    let mut c = spawn_source(
        addr,
        &[&SMALL[..], &["--io-timeout", SOURCE_IO], &a[..], extra].concat(),
    );
    let (st, log) = exit_and_log(&mut c, LIMIT);
    if st.success() {
        Ok(())
    } else {
        Err(log)
    }
}

/// The destination exited 0 after the real source; its log.
fn served(mut dest: Child, derr: BufReader<ChildStderr>) -> String {
    let st = wait_exit(&mut dest, LIMIT);
    let log = rest_of(derr);
    assert!(st.success(), "the destination failed: {log}");
    log
}

/// Closes `s` with a reset (SO_LINGER 0) instead of a FIN.
fn reset(s: TcpStream) {
    socket2::SockRef::from(&s)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(s);
}

#[test]
fn a_scan_a_reset_and_a_silent_stranger_are_not_attempts() {
    for mode in ["psk", "tls"] {
        let d = dir(&format!("scan-{mode}"));
        let auth = auth(mode, &d);
        let (dest, addr, derr) = destination(&auth, &[]);
        // A port scan's connect-and-close, a reset, garbage, and a
        // connection left silent past --io-timeout.
        drop(TcpStream::connect(&addr).unwrap());
        reset(TcpStream::connect(&addr).unwrap());
        let mut g = TcpStream::connect(&addr).unwrap();
        g.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let silent = TcpStream::connect(&addr).unwrap();
        std::thread::sleep(DEST_IO + Duration::from_millis(500));
        drop((g, silent));
        real_source(&addr, &auth, &[]).unwrap_or_else(|e| panic!("{mode}: {e}"));
        let log = served(dest, derr);
        assert!(log.contains("refused a connection"), "{log}");
        assert!(!log.contains("the migration failed"), "{log}");
        let _ = std::fs::remove_dir_all(&d);
    }
}

/// Opens `n` connections to `addr` and holds them until `stop`, each
/// sending one byte every `every` (nothing at all when `every` is None);
/// returns how many the destination closed. One that drips stops early
/// once the destination closed all `n`.
fn strangers(
    addr: &str,
    n: usize,
    every: Option<Duration>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<usize> {
    let addr = addr.to_string();
    std::thread::spawn(move || {
        let mut conns: Vec<Option<TcpStream>> =
            (0..n).map(|_| TcpStream::connect(&addr).ok()).collect();
        let mut closed = 0;
        let all_closed = |closed: usize| every.is_some() && closed == n;
        while !stop.load(Ordering::SeqCst) && !all_closed(closed) {
            std::thread::sleep(every.unwrap_or(Duration::from_millis(50)));
            if every.is_none() {
                continue;
            }
            for c in conns.iter_mut() {
                // One byte of a TLS record header at a time.
                if let Some(s) = c {
                    if s.write_all(&[0x16]).is_err() {
                        *c = None;
                        closed += 1;
                    }
                }
            }
        }
        closed
    })
}

fn raise_fd_limit() {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `l` is a valid rlimit for the kernel to fill and read.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut l), 0);
        l.rlim_cur = l.rlim_max.min(8192).max(l.rlim_cur);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &l), 0);
    }
}

#[test]
fn a_flood_of_a_thousand_idle_connections_and_dripped_handshakes_do_not_stop_the_source() {
    raise_fd_limit();
    let d = dir("flood");
    let auth = auth("psk", &d);
    let (dest, addr, derr) = destination(&auth, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    // Twenty ClientHellos dripped a byte every 200 ms, then a thousand
    // idle connections, all held while the real source migrates.
    let drips = strangers(&addr, 20, Some(Duration::from_millis(200)), stop.clone());
    std::thread::sleep(Duration::from_millis(300));
    let idle = strangers(&addr, 1000, None, stop.clone());
    std::thread::sleep(Duration::from_millis(500));
    let r = real_source(&addr, &auth, &[]);
    // The dripped handshakes are cut at their overall deadline (DEST_IO): the
    // drips end once all 20 are closed, or at LIMIT when the destination
    // keeps some open (a fixed 2.5 s here is the machine's speed, not the
    // deadline's).
    let t0 = std::time::Instant::now();
    while !drips.is_finished() && t0.elapsed() < LIMIT {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::SeqCst);
    let (closed, _) = (drips.join().unwrap(), idle.join().unwrap());
    r.unwrap();
    served(dest, derr);
    assert_eq!(closed, 20, "the destination kept dripped handshakes open");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn strangers_held_open_do_not_take_the_capacity_the_sources_channels_need() {
    let d = dir("join");
    let auth = auth("psk", &d);
    let (dest, addr, derr) = destination(&auth, &["--channels", "4"]);
    let stop = Arc::new(AtomicBool::new(false));
    let connected = Arc::new(AtomicUsize::new(0));
    // A new idle stranger every 5 ms all through the migration, each held
    // open: while the source's channels join, far more than the 16
    // authenticating connections of the old cap are strangers.
    let trickle = {
        let (addr, stop, connected) = (addr.clone(), stop.clone(), connected.clone());
        std::thread::spawn(move || {
            let mut held = Vec::new();
            while !stop.load(Ordering::SeqCst) && held.len() < 2000 {
                held.extend(TcpStream::connect(&addr).ok());
                connected.store(held.len(), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(5));
            }
            held.len()
        })
    };
    // The source starts once 41 strangers are held (a fixed 200 ms held
    // fewer on a loaded machine, where a 5 ms sleep takes longer).
    let t0 = std::time::Instant::now();
    while connected.load(Ordering::SeqCst) <= 40 && !trickle.is_finished() {
        assert!(t0.elapsed() < LIMIT, "strangers could not connect");
        std::thread::sleep(Duration::from_millis(5));
    }
    let r = real_source(&addr, &auth, &["--channels", "4"]);
    stop.store(true, Ordering::SeqCst);
    let n = trickle.join().unwrap();
    r.unwrap();
    served(dest, derr);
    assert!(n > 40, "only {n} strangers");
    let _ = std::fs::remove_dir_all(&d);
}
