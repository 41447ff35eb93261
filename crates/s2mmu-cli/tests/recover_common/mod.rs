//! What the tests between two `s2mmu` processes share (a listening
//! destination, a bounded wait for a process), and what the post-copy
//! recovery tests share besides: a cutting TCP proxy, a destination and a source paused after
//! the cut (`--recovery manual --control PATH`), `s2mmu migrate-ctl`, and
//! the recovery that must end with both processes verified.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use s2mmu_migrate::transport::{self as net, NetConfig};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_s2mmu")
}

/// A quick run of a small guest: 16 MiB of anonymous memory, 20 ms of
/// warm-up and of running after the switch.
pub const QUICK: [&str; 8] = [
    "--mem",
    "16M",
    "--warmup",
    "20ms",
    "--run-after",
    "20ms",
    "-s",
    "anonymous",
];

/// [`QUICK`] and one more option with its value.
pub const fn quick_and(flag: &'static str, value: &'static str) -> [&'static str; 10] {
    let q = QUICK;
    [q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7], flag, value]
}

/// The flags of the small simulated guest both sides of a test between
/// network namespaces take: `mem` of anonymous memory, 50 ms of warm-up
/// and of running after the switch, no plot, and `io_timeout` as the I/O
/// deadline.
pub const fn ns_guest(mem: &'static str, io_timeout: &'static str) -> [&'static str; 12] {
    [
        "--mem",
        mem,
        "-s",
        "anonymous",
        "--warmup",
        "50ms",
        "--run-after",
        "50ms",
        "--plot",
        "",
        "--io-timeout",
        io_timeout,
    ]
}

/// A 16 MiB guest whose link is limited to 8 MiB/s: round 0 and the
/// post-copy background stream take about 2 s each, so a cut armed when
/// post-copy starts lands inside it.
pub const SMALL: [&str; 10] = quick_and("--bandwidth", "8M");

/// The I/O deadline: 5 s where the operator recovers (the cut shuts the
/// connections down, so it is seen at once; at 1 s a loaded CI machine's
/// stall ended the pre-copy phase before the cut), 1 s with
/// `--recovery auto`, whose destination waits 4 deadlines per immediate
/// reconnect before it falls back to the operator.
pub fn io_timeout(mode: &str) -> &'static str {
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
pub struct Proxy {
    pub addr: String,
    pub armed: Arc<AtomicBool>,
    pub cut_done: Arc<AtomicBool>,
}

pub fn proxy(to: String, cut_after: u64, refuse_after: bool) -> Proxy {
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

pub type Cut<'a> = (
    &'a AtomicBool,
    &'a AtomicBool,
    &'a AtomicU64,
    &'a Mutex<Vec<TcpStream>>,
);

pub fn forward(mut from: TcpStream, mut into: TcpStream, cuttable: bool, at: u64, cut: Cut<'_>) {
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

/// Starts `s2mmu migrate --listen 127.0.0.1:0 ARGS` and returns it with
/// the address it listens on and the rest of its stderr. The caller waits
/// for it.
pub fn spawn_listener(args: &[&str]) -> (Child, String, BufReader<ChildStderr>) {
    super::cli_common::spawn_listening(
        Command::new(bin())
            .args(["migrate", "--listen", "127.0.0.1:0", "--plot", ""])
            .args(args)
            .stdout(Stdio::null()),
    )
}

/// Starts the destination ([`spawn_listener`]) with its stderr collected
/// into `log`; returns it with its address. The caller waits for it.
pub fn spawn_dest(args: &[&str], log: Arc<Mutex<String>>) -> (Child, String) {
    let (c, addr, err) = spawn_listener(args);
    std::thread::spawn(move || collect(err, &log, None));
    (c, addr)
}

/// Appends `r`'s lines to `log`; sets `on` when post-copy starts.
pub fn collect(r: impl BufRead, log: &Mutex<String>, on: Option<&AtomicBool>) {
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

pub fn ctl(sock: &Path, args: &[&str]) -> Output {
    Command::new(bin())
        .args(["migrate-ctl", "--control", sock.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap()
}

pub fn status(sock: &Path) -> serde_json::Value {
    let o = ctl(sock, &["status"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Polls `status` until `phase` (at most 30 s, every 20 ms; fails if `c`
/// exits).
pub fn wait_phase(
    sock: &Path,
    c: &mut Child,
    phase: &str,
    log: &Mutex<String>,
) -> serde_json::Value {
    let wait = (Duration::from_secs(30), Duration::from_millis(20));
    wait_phase_within(sock, c, phase, log, wait)
}

/// Polls `status` every `wait.1` until `phase`, for at most `wait.0`;
/// fails if `c` exits first or the migration ends (done or failed) in
/// another phase. A status request that fails while `c` runs (its socket
/// not up yet) is asked again.
pub fn wait_phase_within(
    sock: &Path,
    c: &mut Child,
    phase: &str,
    log: &Mutex<String>,
    (limit, every): (Duration, Duration),
) -> serde_json::Value {
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
        let mut last = String::from_utf8_lossy(&o.stderr).into_owned();
        if o.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            if v["phase"] == phase {
                return v;
            }
            assert!(v["phase"] != "done" && v["phase"] != "failed", "{v}");
            last = v.to_string();
        }
        assert!(
            t0.elapsed() < limit,
            "{}: never {phase}, last {last}\n{}",
            sock.display(),
            log.lock().unwrap()
        );
        std::thread::sleep(every);
    }
}

/// Everything `r` gives until its end (a process's stderr).
pub fn rest_of(mut r: impl Read) -> String {
    let mut s = String::new();
    let _ = r.read_to_string(&mut s);
    s
}

/// Starts `s2mmu migrate --to addr --plot "" ARGS`: its stdout dropped,
/// its stderr piped.
pub fn spawn_source(addr: &str, args: &[&str]) -> Child {
    Command::new(bin())
        .args(["migrate", "--to", addr, "--plot", ""])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `c` (see [`wait_exit`]) while a thread reads its stderr:
/// its exit status and what it wrote there.
pub fn exit_and_log(c: &mut Child, limit: Duration) -> (std::process::ExitStatus, String) {
    let err = c.stderr.take().unwrap();
    let log = std::thread::spawn(move || rest_of(err));
    let st = wait_exit(c, limit);
    (st, log.join().unwrap())
}

pub fn wait_exit(c: &mut Child, limit: Duration) -> std::process::ExitStatus {
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

/// The key both processes hold with [`Sec::Psk`].
pub const PSK: &[u8] = b"0123456789abcdef0123456789abcdef";

impl Drop for Paused {
    /// A failed test does not leave both processes paused for
    /// `--recover-wait` (the ones that exited are reaped already).
    fn drop(&mut self) {
        let _ = self.dest.kill();
        let _ = self.src.kill();
        let _ = self.dest.wait();
        let _ = self.src.wait();
    }
}

impl Paused {
    /// The credentials both processes hold, for a peer written in a test.
    pub fn net(&self) -> NetConfig {
        let security = match self.sec {
            Sec::Psk => net::psk(PSK).unwrap(),
            Sec::Tls => {
                let f = |n: &str| self.dir.join(n);
                net::tls_from_files(&f("cert.pem"), &f("key.pem"), &f("ca.pem"), "127.0.0.1")
                    .unwrap()
            }
        };
        NetConfig {
            io_timeout: Duration::from_secs(1),
            security,
        }
    }
}

/// A destination and a source through a proxy that cuts post-copy after
/// `cut_after` bytes, both paused after the cut.
pub struct Paused {
    pub sec: Sec,
    pub dir: PathBuf,
    pub dest: Child,
    pub src: Child,
    pub dest_addr: String,
    pub dsock: PathBuf,
    pub ssock: PathBuf,
    pub dlog: Arc<Mutex<String>>,
    pub slog: Arc<Mutex<String>>,
    pub proxy: Proxy,
}

/// How both processes authenticate each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sec {
    /// `--psk DIR/key`.
    Psk,
    /// Mutual TLS: `--tls-cert DIR/cert.pem --tls-key DIR/key.pem
    /// --tls-ca DIR/ca.pem` (one CA, one certificate for 127.0.0.1).
    Tls,
}

/// Writes a CA and a certificate for localhost/127.0.0.1 it signed into
/// `dir` as `{prefix}cert.pem`, `{prefix}key.pem`, `{prefix}ca.pem`.
pub fn write_pki(dir: &Path, prefix: &str) -> [PathBuf; 3] {
    let (pki, _, _) = net::make_pki(&["localhost", "127.0.0.1"]).unwrap();
    let files = [
        dir.join(format!("{prefix}cert.pem")),
        dir.join(format!("{prefix}key.pem")),
        dir.join(format!("{prefix}ca.pem")),
    ];
    for (f, pem) in files.iter().zip([pki.cert_pem, pki.key_pem, pki.ca_pem]) {
        std::fs::write(f, pem).unwrap();
    }
    files
}

/// `run_until_paused_with` a pre-shared key.
pub fn run_until_paused(name: &str, cut_after: u64, mode: &str, extra: &[&str]) -> Paused {
    run_until_paused_with(name, cut_after, mode, extra, Sec::Psk)
}

/// `mode`: `--recovery manual`, or `auto` with a proxy that refuses
/// every connection after the cut (the immediate reconnects fail).
pub fn run_until_paused_with(
    name: &str,
    cut_after: u64,
    mode: &str,
    extra: &[&str],
    sec: Sec,
) -> Paused {
    let dir = std::env::temp_dir().join(format!("s2mmu-rec-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let auth = auth_args(&dir, sec);
    let auth: Vec<&str> = auth.iter().map(String::as_str).collect();
    let (dsock, ssock) = (dir.join("dest.sock"), dir.join("src.sock"));
    let base = [
        &SMALL[..],
        &auth[..],
        &["--recovery", mode, "--io-timeout", io_timeout(mode)],
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
        sec,
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
    assert_both_paused(&mut p);
    p
}

/// The flags that authenticate both ends with `sec`, its files written
/// into `dir`.
fn auth_args(dir: &Path, sec: Sec) -> Vec<String> {
    match sec {
        Sec::Psk => {
            let key = dir.join("key");
            std::fs::write(&key, PSK).unwrap();
            vec!["--psk".into(), key.to_str().unwrap().into()]
        }
        Sec::Tls => {
            let [c, k, a] = write_pki(dir, "");
            [("--tls-cert", c), ("--tls-key", k), ("--tls-ca", a)]
                .into_iter()
                .flat_map(|(f, p)| [f.to_string(), p.to_str().unwrap().to_string()])
                .collect()
        }
    }
}

/// Waits until both ends report `paused` after the proxy's cut, and checks
/// they stay paused with the memory split between them.
fn assert_both_paused(p: &mut Paused) {
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
}

/// Recovers `p` (the source through the proxy again, or straight to the
/// destination) and requires both to finish verified.
pub fn recover(p: Paused, direct: bool) {
    recover_with(p, direct, |_| {});
}

/// [`recover`], running `between` once the destination waits for the
/// recovery and before the source is told to recover; what it returns is
/// held until both processes ended.
pub fn recover_with<T>(mut p: Paused, direct: bool, between: impl FnOnce(&mut Paused) -> T) {
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
    let _held = between(&mut p);
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
