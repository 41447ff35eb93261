//! Post-copy recovery by hand between two `s2mmu` processes: the source
//! (`--to`) reaches the destination (`--listen`) through a proxy in this
//! test that cuts every connection once post-copy has run a chosen number
//! of bytes; both sides (`--recovery manual --control PATH`) then stay
//! paused with the memory split, and `s2mmu migrate-ctl` resumes or
//! cancels them. Every peer is on 127.0.0.1, secured by a pre-shared key.
//! Behaviour only: no timing is asserted.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_s2mmu")
}

/// A 16 MiB guest whose link is limited to 8 MiB/s: round 0 and the
/// post-copy background stream take about 2 s each, so a cut armed when
/// post-copy starts lands inside it.
const SMALL: [&str; 10] = [
    "--mem",
    "16M",
    "--warmup",
    "20ms",
    "--run-after",
    "20ms",
    "-s",
    "anonymous",
    "--bandwidth",
    "8M",
];

/// The I/O deadline: 5 s where the operator recovers (the cut shuts the
/// connections down, so it is seen at once; a short deadline only made a
/// loaded machine's stall end the pre-copy phase before the cut), 1 s with
/// `--recovery auto`, whose destination waits 4 deadlines per immediate
/// reconnect before it falls back to the operator.
fn io_timeout(mode: &str) -> &'static str {
    if mode == "auto" {
        "1s"
    } else {
        "5s"
    }
}

/// A TCP proxy to `to` that, once armed, shuts every connection down
/// after `cut_after` more bytes (either way, all connections together);
/// connections after the cut are forwarded untouched, or (`refuse_after`)
/// closed at once.
struct Proxy {
    addr: String,
    armed: Arc<AtomicBool>,
    cut_done: Arc<AtomicBool>,
}

fn proxy(to: String, cut_after: u64, refuse_after: bool) -> Proxy {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let armed = Arc::new(AtomicBool::new(false));
    let cut_done = Arc::new(AtomicBool::new(false));
    let counted = Arc::new(AtomicU64::new(0));
    let live: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
    let (a, c) = (armed.clone(), cut_done.clone());
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            if refuse_after && c.load(Ordering::SeqCst) {
                continue;
            }
            let Ok(d) = TcpStream::connect(&to) else {
                continue;
            };
            let cuttable = !c.load(Ordering::SeqCst);
            if cuttable {
                let mut v = live.lock().unwrap();
                v.push(s.try_clone().unwrap());
                v.push(d.try_clone().unwrap());
            }
            for (from, into) in [(s.try_clone().unwrap(), d.try_clone().unwrap()), (d, s)] {
                let (a, c, n, live) = (a.clone(), c.clone(), counted.clone(), live.clone());
                std::thread::spawn(move || {
                    forward(from, into, cuttable, cut_after, (&a, &c, &n, &live))
                });
            }
        }
    });
    Proxy {
        addr,
        armed,
        cut_done,
    }
}

type Cut<'a> = (
    &'a AtomicBool,
    &'a AtomicBool,
    &'a AtomicU64,
    &'a Mutex<Vec<TcpStream>>,
);

fn forward(mut from: TcpStream, mut into: TcpStream, cuttable: bool, at: u64, cut: Cut<'_>) {
    let (armed, done, counted, live) = cut;
    let mut buf = [0u8; 16384];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if cuttable && armed.load(Ordering::SeqCst) {
            let total = counted.fetch_add(n as u64, Ordering::SeqCst) + n as u64;
            if total >= at && !done.swap(true, Ordering::SeqCst) {
                eprintln!("proxy: cutting every connection after {total} bytes of post-copy");
                for s in live.lock().unwrap().iter() {
                    let _ = s.shutdown(Shutdown::Both);
                }
            }
        }
        if into.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = into.shutdown(Shutdown::Write);
}

/// Starts the destination; returns it with its address. The caller
/// waits for it.
#[allow(clippy::zombie_processes)]
fn spawn_dest(args: &[&str], log: Arc<Mutex<String>>) -> (Child, String) {
    let mut c = Command::new(bin())
        .args(["migrate", "--listen", "127.0.0.1:0", "--plot", ""])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(c.stderr.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "the destination exited early"
        );
        if let Some(rest) = line.split("destination listening on ").nth(1) {
            let addr = rest.split_whitespace().next().unwrap().to_string();
            std::thread::spawn(move || collect(err, &log, None));
            return (c, addr);
        }
    }
}

/// Appends `r`'s lines to `log`; sets `on` when post-copy starts.
fn collect(r: impl BufRead, log: &Mutex<String>, on: Option<&AtomicBool>) {
    for line in r.lines() {
        let Ok(line) = line else { return };
        if line.contains("post-copy: vCPUs paused after round") {
            if let Some(a) = on {
                a.store(true, Ordering::SeqCst);
            }
        }
        let mut l = log.lock().unwrap();
        l.push_str(&line);
        l.push('\n');
    }
}

fn ctl(sock: &Path, args: &[&str]) -> Output {
    Command::new(bin())
        .args(["migrate-ctl", "--control", sock.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap()
}

fn status(sock: &Path) -> serde_json::Value {
    let o = ctl(sock, &["status"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Polls `status` until `phase` (at most 30 s; fails if `c` exits).
fn wait_phase(sock: &Path, c: &mut Child, phase: &str, log: &Mutex<String>) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        if let Some(s) = c.try_wait().unwrap() {
            panic!(
                "{} exited ({s}) before {phase}:\n{}",
                sock.display(),
                log.lock().unwrap()
            );
        }
        let o = ctl(sock, &["status"]);
        if !o.status.success() {
            // It may have exited between the check above and the request.
            if let Some(s) = c.try_wait().unwrap() {
                panic!(
                    "{} exited ({s}) before {phase}:\n{}",
                    sock.display(),
                    log.lock().unwrap()
                );
            }
            panic!("{}", String::from_utf8_lossy(&o.stderr));
        }
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        if v["phase"] == phase {
            return v;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{}: never {phase}, last {v}\n{}",
            sock.display(),
            log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_exit(c: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(s) = c.try_wait().unwrap() {
            return s;
        }
        if t0.elapsed() > limit {
            let _ = c.kill();
            panic!("a migration process hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A destination and a source through a proxy that cuts post-copy after
/// `cut_after` bytes, both paused after the cut.
struct Paused {
    dir: PathBuf,
    dest: Child,
    src: Child,
    dest_addr: String,
    dsock: PathBuf,
    ssock: PathBuf,
    dlog: Arc<Mutex<String>>,
    slog: Arc<Mutex<String>>,
    proxy: Proxy,
}

/// `mode`: `--recovery manual`, or `auto` with a proxy that refuses
/// every connection after the cut (the immediate reconnects fail).
fn run_until_paused(name: &str, cut_after: u64, mode: &str, extra: &[&str]) -> Paused {
    let dir = std::env::temp_dir().join(format!("s2mmu-rec-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("key");
    std::fs::write(&key, b"0123456789abcdef0123456789abcdef").unwrap();
    let (dsock, ssock) = (dir.join("dest.sock"), dir.join("src.sock"));
    let base = [
        &SMALL[..],
        &[
            "--psk",
            key.to_str().unwrap(),
            "--recovery",
            mode,
            "--io-timeout",
            io_timeout(mode),
        ],
        extra,
    ]
    .concat();
    let dlog = Arc::new(Mutex::new(String::new()));
    let (dest, dest_addr) = spawn_dest(
        &[&base[..], &["--control", dsock.to_str().unwrap()]].concat(),
        dlog.clone(),
    );
    let proxy = proxy(dest_addr.clone(), cut_after, mode == "auto");
    let mut src = Command::new(bin())
        .args([
            "migrate",
            "--to",
            &proxy.addr,
            "--plot",
            "",
            "--json",
            "--postcopy",
        ])
        .args(&base)
        .args(["--control", ssock.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let slog = Arc::new(Mutex::new(String::new()));
    let (l, a) = (slog.clone(), proxy.armed.clone());
    let err = BufReader::new(src.stderr.take().unwrap());
    std::thread::spawn(move || collect(err, &l, Some(&a)));
    let mut p = Paused {
        dir,
        dest,
        src,
        dest_addr,
        dsock,
        ssock,
        dlog,
        slog,
        proxy,
    };
    let d = wait_phase(&p.dsock, &mut p.dest, "paused", &p.dlog);
    let s = wait_phase(&p.ssock, &mut p.src, "paused", &p.slog);
    assert!(p.proxy.cut_done.load(Ordering::SeqCst));
    // The memory is split: the destination lacks pages the source holds.
    let missing = d["pages_missing"].as_u64().unwrap();
    assert!(missing > 0, "{d}");
    assert!(s["pages_missing"].as_u64().unwrap() >= missing, "{s} {d}");
    assert_eq!(
        (d["side"].as_str(), s["side"].as_str()),
        (Some("destination"), Some("source"))
    );
    assert!(!d["last_error"].as_str().unwrap().is_empty());
    // Both still alive, and paused: nothing happens until the operator.
    std::thread::sleep(Duration::from_millis(300));
    assert!(p.dest.try_wait().unwrap().is_none() && p.src.try_wait().unwrap().is_none());
    assert_eq!(status(&p.dsock)["phase"], "paused");
    assert_eq!(status(&p.dsock)["pages_missing"].as_u64(), Some(missing));
    p
}

/// Recovers `p` (the source through the proxy again, or straight to the
/// destination) and requires both to finish verified.
fn recover(mut p: Paused, direct: bool) {
    let o = if direct {
        // The destination accepts the recovery on a new address (a port
        // free a moment ago).
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        p.dest_addr = format!("127.0.0.1:{port}");
        ctl(&p.dsock, &["recover", "--listen", &p.dest_addr])
    } else {
        ctl(&p.dsock, &["recover"])
    };
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    if direct {
        // A peer without the key, and one that sends garbage, while the
        // destination waits for the recovery: refused, it keeps waiting.
        let t0 = Instant::now();
        let mut g = loop {
            match TcpStream::connect(&p.dest_addr) {
                Ok(g) => break g,
                Err(e) if t0.elapsed() > Duration::from_secs(10) => panic!("{e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let _ = g.write_all(b"S2MMU-NOT-A-MIGRATION\n");
        drop(g);
    }
    let o = if direct {
        ctl(&p.ssock, &["recover", "--to", &p.dest_addr])
    } else {
        ctl(&p.ssock, &["recover"])
    };
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ss = wait_exit(&mut p.src, Duration::from_secs(60));
    let ds = wait_exit(&mut p.dest, Duration::from_secs(60));
    let mut out = String::new();
    p.src
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(
        ss.success() && ds.success(),
        "source {ss}, destination {ds}\nsource:\n{}\ndestination:\n{}",
        p.slog.lock().unwrap(),
        p.dlog.lock().unwrap()
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let run = &v["results"][0];
    assert_eq!(run["memory_equal"], true, "{run}");
    let pc = &run["postcopy"]["destination"];
    assert_eq!(pc["recoveries"], 1, "{run}");
    assert!(!run["slot_digests"].as_array().unwrap().is_empty(), "{run}");
    assert!(
        !p.dsock.exists() && !p.ssock.exists(),
        "the control sockets are removed"
    );
    std::fs::remove_dir_all(&p.dir).unwrap();
}

fn cut_points(n: usize) -> Vec<u64> {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("cut points from seed {seed:#x}");
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Within the first 2 MiB of the post-copy stream (16 MiB).
            4096 + x % (2 << 20)
        })
        .collect()
}

fn cut_pause_recover(harvest: &str) {
    for (k, at) in cut_points(3).into_iter().enumerate() {
        eprintln!("{harvest}: cut after {at} bytes");
        let p = run_until_paused(
            &format!("{harvest}-{k}"),
            at,
            "manual",
            &["--harvest", harvest],
        );
        recover(p, k % 2 == 1);
    }
}

#[test]
fn a_cut_postcopy_pauses_both_processes_until_the_operator_recovers_it() {
    cut_pause_recover("bitmap");
}

#[test]
fn a_cut_postcopy_with_dirty_rings_pauses_both_until_recovered() {
    cut_pause_recover("ring");
}

#[test]
fn with_auto_recovery_a_side_whose_reconnect_fails_waits_for_the_operator() {
    // The proxy refuses the immediate reconnects: both sides then pause
    // on their control sockets, and the operator recovers them around it.
    let p = run_until_paused("auto", 256 << 10, "auto", &[]);
    assert!(p
        .slog
        .lock()
        .unwrap()
        .contains("resuming over new connections"));
    recover(p, true);
}

/// One raw line to a control socket, and its answer.
fn raw(sock: &Path, line: &[u8]) -> String {
    let mut c = UnixStream::connect(sock).unwrap();
    c.write_all(line).unwrap();
    let mut s = String::new();
    BufReader::new(c).read_line(&mut s).unwrap();
    s
}

#[test]
fn cancel_exits_saying_the_memory_is_split_and_bad_commands_change_nothing() {
    let mut p = run_until_paused("cancel", 64 << 10, "manual", &[]);
    let before = status(&p.dsock);
    // Bad input: a clear error, and the side stays paused as it was.
    assert!(raw(&p.dsock, b"resume now\n").starts_with("error: unknown command"));
    let long = [b'x'; 600];
    assert!(raw(&p.dsock, &[&long[..], b"\n"].concat()).contains("more than 512 bytes"));
    let o = ctl(&p.dsock, &["recover", "--to", "127.0.0.1:1"]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("applies to a source"), "{e}");
    assert!(raw(&p.dsock, b"cancel please\n").starts_with("error: cancel takes no argument"));
    assert_eq!(status(&p.dsock), before);
    // A recovery that cannot connect leaves the source paused.
    let o = ctl(&p.ssock, &["recover", "--to", "127.0.0.1:1"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let t0 = Instant::now();
    loop {
        let s = status(&p.ssock);
        if s["phase"] == "paused"
            && s["last_error"]
                .as_str()
                .unwrap()
                .contains("recovery failed")
        {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{s}");
        std::thread::sleep(Duration::from_millis(20));
    }
    for (c, sock, side) in [
        (&mut p.dest, &p.dsock, "destination"),
        (&mut p.src, &p.ssock, "source"),
    ] {
        assert!(c.try_wait().unwrap().is_none(), "{side} exited");
        let o = ctl(sock, &["cancel"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let st = wait_exit(c, Duration::from_secs(30));
        assert!(!st.success(), "{side}: {st}");
        // The rest of stderr goes to the log thread: wait for its last line.
        let log = if side == "source" { &p.slog } else { &p.dlog };
        let t0 = Instant::now();
        let err = loop {
            let l = log.lock().unwrap().clone();
            if l.contains("s2mmu: ") || t0.elapsed() > Duration::from_secs(10) {
                break l;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        eprintln!("{side}:\n{err}");
        assert!(
            err.contains("SPLIT") && err.contains("cancelled by the operator"),
            "{side}:\n{err}"
        );
    }
    let o = ctl(&p.dsock, &["status"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no such socket"));
    std::fs::remove_dir_all(&p.dir).unwrap();
}
