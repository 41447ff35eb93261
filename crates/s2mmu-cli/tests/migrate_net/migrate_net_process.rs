//! The migration between two `s2mmu` processes: a source or destination
//! process that is killed, stopped or fails, the pre-shared key across
//! processes, and the channel sweep's table. Every peer is on 127.0.0.1.
//! Behaviour only: no timing is asserted.

#[path = "../cli_common/mod.rs"]
mod cli_common;
#[path = "../recover_common/mod.rs"]
mod recover_common;

use recover_common::{
    bin, exit_and_log, quick_and, rest_of, spawn_listener, spawn_source, wait_exit,
};
use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::Duration;

/// Asserts that the process behind `out` succeeded, showing its stderr
/// otherwise.
fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits up to `secs` seconds for the destination `dest` to exit: its exit
/// status and the rest of its stderr `derr`.
fn finish(dest: &mut Child, derr: impl Read, secs: u64) -> (ExitStatus, String) {
    let st = wait_exit(dest, Duration::from_secs(secs));
    (st, rest_of(derr))
}

/// A small, quick run. Its socket deadline (5 s, 1 s before) is what the
/// stopped-destination test waits for; 1 s expired under load elsewhere
/// (`migrate_strangers`: 4 of 12 loaded runs) where no peer had stopped.
const SMALL: [&str; 10] = quick_and("--io-timeout", "5s");

/// `s2mmu migrate --to ADDR` with [`SMALL`] and `extra`, run to its end.
fn source(addr: &str, extra: &[&str]) -> Output {
    Command::new(bin())
        .args(["migrate", "--to", addr, "--plot", ""])
        .args(extra)
        .args(SMALL)
        .output()
        .unwrap()
}

#[test]
fn a_killed_source_process_ends_the_destination_which_then_serves_the_next() {
    // The destination serves up to two sources.
    let (mut dest, addr, mut derr) = spawn_listener(&[&SMALL[..], &["--attempts", "2"]].concat());
    // A source slowed to 4 MiB/s (its 16 MiB take 4 s), killed mid-stream:
    // once the destination admitted it, not after a fixed time, which a
    // loaded machine may spend before the source connects.
    let mut src = Command::new(bin())
        .args(["migrate", "--to", &addr, "--plot", "", "--bandwidth", "4M"])
        .args(SMALL)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    while !line.contains("source connected") {
        line.clear();
        assert!(
            derr.read_line(&mut line).unwrap() > 0,
            "the destination exited before the source connected"
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    src.kill().unwrap();
    src.wait().unwrap();
    // The next source completes; the destination exits 0 after it.
    let out = source(&addr, &[]);
    assert_ok(&out);
    let (st, log) = finish(&mut dest, derr, 60);
    assert!(st.success(), "{log}");
    assert!(
        log.contains("the migration failed (1 of --attempts 2)"),
        "{log}"
    );
}

#[test]
fn garbage_before_the_opening_is_refused_and_the_destination_serves_the_real_source() {
    // With plain TCP the opening is the only check there is: a connection
    // that fails it is a stranger (a probe, a scan), not an attempt.
    let (mut dest, addr, derr) = spawn_listener(&SMALL);
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let out = source(&addr, &[]);
    assert_ok(&out);
    let (st, log) = finish(&mut dest, derr, 30);
    assert!(st.success(), "{log}");
    assert!(log.contains("not an s2mmu migration stream"), "{log}");
    assert!(!log.contains("the migration failed"), "{log}");
    // Plain TCP has no authentication to fail: the opening was refused.
    assert!(log.contains("was refused: "), "{log}");
    assert!(!log.contains("failed authentication"), "{log}");
}

/// A plain-TCP source refused at its opening (by a destination that expects
/// a pre-shared key) is told it was refused, not that its stream was
/// truncated; the destination goes on to serve the real source.
#[test]
fn a_plain_source_refused_at_its_opening_says_so() {
    let dir = std::env::temp_dir().join(format!("s2mmu-plain-refused-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("key");
    std::fs::write(&key, "0123456789abcdef0123456789abcdef\n").unwrap();
    let psk = ["--psk", key.to_str().unwrap()];
    let (mut dest, addr, derr) = spawn_listener(&[&SMALL[..], &psk].concat());
    let out = source(&addr, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("refuses a plain-TCP source"), "{err}");
    assert!(!err.contains("corrupt stream"), "{err}");
    assert!(!err.contains("truncated stream"), "{err}");
    let out = source(&addr, &psk);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let (st, log) = finish(&mut dest, derr, 60);
    assert!(st.success(), "{log}");
    assert!(log.contains("refused a connection"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_authenticated_source_that_fails_ends_a_single_attempt_destination_with_an_error() {
    let (mut dest, addr, derr) = spawn_listener(&SMALL);
    // A valid opening for more memory than the destination accepts.
    let out = Command::new(bin())
        .args(["migrate", "--to", &addr, "--plot", ""])
        .args(["--mem", "32M"])
        .args(&SMALL[2..])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let (st, log) = finish(&mut dest, derr, 30);
    assert!(!st.success(), "{log}");
    assert!(
        log.contains("the migration failed (1 of --attempts 1)"),
        "{log}"
    );
}

#[test]
fn a_stopped_destination_process_ends_the_source_with_a_timeout() {
    let (mut dest, addr, _derr) = spawn_listener(&SMALL);
    let pid = dest.id().to_string();
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    let mut src = spawn_source(&addr, &SMALL);
    let (st, log) = exit_and_log(&mut src, Duration::from_secs(60));
    let _ = Command::new("kill").args(["-CONT", &pid]).status();
    let _ = dest.kill();
    let _ = dest.wait();
    assert!(!st.success());
    assert!(log.contains("timed out"), "{log}");
}

#[test]
fn psk_between_two_processes_and_a_wrong_key_is_refused() {
    let dir = std::env::temp_dir().join(format!("s2mmu-psk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (good, bad) = (dir.join("good"), dir.join("bad"));
    std::fs::write(&good, "0123456789abcdef0123456789abcdef\n").unwrap();
    std::fs::write(&bad, "fedcba9876543210fedcba9876543210\n").unwrap();
    let (mut dest, addr, derr) =
        spawn_listener(&[&SMALL[..], &["--psk", good.to_str().unwrap()]].concat());
    // The wrong key: refused, and the destination keeps listening.
    let out = source(&addr, &["--psk", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("authentication failed"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = source(&addr, &["--psk", good.to_str().unwrap()]);
    assert_ok(&out);
    let (st, log) = finish(&mut dest, derr, 60);
    assert!(st.success(), "{log}");
    assert!(log.contains("refused a connection"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_channel_sweep_prints_its_table() {
    let out = Command::new(bin())
        .args(["migrate", "--plot", "", "--channels", "1,2", "--no-tls"])
        .args(&SMALL[..8])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_ok(&out);
    assert!(stdout.contains("Round 0 by channel count"), "{stdout}");
    assert!(stdout.contains("% of link"), "{stdout}");
}

#[test]
fn a_destination_on_ept_refuses_an_arm64_source_by_name_then_takes_an_ept_one() {
    let (mut dest, addr, derr) =
        spawn_listener(&[&SMALL[..], &["--format", "ept", "--attempts", "2"]].concat());
    let source = |format: &str| source(&addr, &["--json", "--format", format]);
    let out = source("arm64");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(
            "stage-2 format mismatch: the stream's guest runs on format arm64, this destination on format ept"
        ),
        "{err}"
    );
    // The refusal counted as one failed attempt: the destination serves
    // the next source, on its own format.
    let out = source("ept");
    assert_ok(&out);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["params"]["format"], "ept", "{report}");
    let (st, log) = finish(&mut dest, derr, 60);
    assert!(st.success(), "{log}");
    assert!(log.contains("stage-2 format mismatch"), "{log}");
}

/// The TCP ports `pid` listens on, from its sockets' inodes in
/// /proc/PID/fd and the LISTEN rows (state 0A) of /proc/net/tcp and tcp6.
fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for row in text.lines().skip(1) {
            let f: Vec<&str> = row.split_whitespace().collect();
            if f.len() > 9 && f[3] == "0A" && inodes.iter().any(|i| i == f[9]) {
                let port = f[1].rsplit(':').next().unwrap();
                ports.push(u16::from_str_radix(port, 16).unwrap());
            }
        }
    }
    ports
}

/// A `--listen` destination listens on the port it was given and on no
/// other (no sink beside it for a link figure): the source migrates over
/// that one port, and its report has no plain-TCP figure rather than one
/// measured against a port the destination opened unasked.
#[test]
fn a_listening_destination_opens_only_the_port_it_was_given() {
    let (mut dest, addr, derr) = spawn_listener(&SMALL);
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(listening_ports(dest.id()), vec![port], "{addr}");
    let out = source(&addr, &["--json", "--link-probe"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let (st, log) = finish(&mut dest, derr, 60);
    assert!(st.success(), "{log}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pt = &v["results"][0]["plain_tcp"];
    assert!(pt["plain_tcp_bytes_per_s"].is_null(), "{v}");
}

/// Over a Unix socket the migration runs, and the plain-TCP figure is
/// null, not made up.
#[test]
fn over_a_unix_socket_plain_tcp_is_not_measured_and_the_migration_runs() {
    let dir = std::env::temp_dir().join(format!("s2mmu-plain-unix-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let addr = format!("unix:{}", dir.join("m.sock").display());
    let mut dest = Command::new(bin())
        .args(["migrate", "--listen", &addr, "--plot", ""])
        .args(SMALL)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut derr = std::io::BufReader::new(dest.stderr.take().unwrap());
    let mut head = String::new();
    while !head.contains("destination listening on") {
        let mut line = String::new();
        use std::io::BufRead;
        assert!(derr.read_line(&mut line).unwrap() > 0, "{head}");
        head.push_str(&line);
    }
    let out = source(&addr, &["--json", "--link-probe"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(wait_exit(&mut dest, Duration::from_secs(60)).success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pt = &v["results"][0]["plain_tcp"];
    assert!(pt["plain_tcp_bytes_per_s"].is_null(), "{v}");
    assert!(pt["round0_pct_of_plain_tcp"].is_null(), "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}
