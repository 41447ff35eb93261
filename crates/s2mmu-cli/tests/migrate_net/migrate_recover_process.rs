//! Post-copy recovery by hand between two `s2mmu` processes: the source
//! (`--to`) reaches the destination (`--listen`) through a proxy in this
//! test that cuts every connection once post-copy has run a chosen number
//! of bytes; both sides (`--recovery manual --control PATH`) then stay
//! paused with the memory split, and `s2mmu migrate-ctl` resumes or
//! cancels them. Every peer is on 127.0.0.1, secured by a pre-shared key.
//! Behaviour only: no timing is asserted.

#[path = "../cli_common/mod.rs"]
mod cli_common;
#[path = "../recover_common/mod.rs"]
mod recover_common;

use recover_common::*;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

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
    // `--json`: the answer inside the envelope every subcommand prints.
    let o = ctl(&p.dsock, &["--json", "status"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let env: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON envelope");
    assert_eq!(env["command"], "migrate-ctl");
    assert_eq!(env["params"]["request"], "status");
    assert_eq!(env["results"][0]["answer"], before);
    assert_eq!(env["results"][0]["answer"]["side"], "destination");
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
