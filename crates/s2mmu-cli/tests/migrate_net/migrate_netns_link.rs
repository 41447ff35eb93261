//! Two hosts on one machine, over a shaped link: the source and the
//! destination as two processes in two network namespaces that
//! `scripts/netns-link.sh` makes, shapes (1 Gbit/s by `tbf`, 1 % of packets
//! dropped at random by `nft` inside each namespace), cuts and restores,
//! and removes. Pre-copy, post-copy, and a post-copy that recovers after
//! the link was cut and restored, for the simulated guest and for the
//! Linux guest. The addresses (10.213.x.0/24) exist only in those
//! namespaces. Ignored, with the reason, where the build found that
//! namespaces cannot be made (not root, no `ip`: cfg `s2mmu_netns`) or the
//! Linux guest cannot run (cfg `s2mmu_linux_runnable`); a test that then
//! finds it cannot run fails with the reason.

#[path = "../cli_common/mod.rs"]
mod cli_common;
#[path = "../recover_common/mod.rs"]
mod recover_common;

use recover_common::{collect, ctl, ns_guest, wait_exit, wait_phase_within};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Two namespaces and their link, made by the script; removed on drop.
struct Link {
    name: String,
    src_ip: String,
    dest_ip: String,
}

fn script(args: &[&str]) -> Result<String, String> {
    let s = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/netns-link.sh");
    let o = Command::new(&s)
        .args(args)
        .output()
        .map_err(|e| format!("{}: {e}", s.display()))?;
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    if o.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "netns-link.sh {}: {}{}",
            args.join(" "),
            out,
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

impl Link {
    /// Namespaces `t<pid><tag>-s` and `-d`, 1 Gbit/s, 1 % loss.
    fn up(tag: &str) -> Result<Link, String> {
        let name = format!("t{}{tag}", std::process::id() % 100_000);
        script(&["up", &name])?;
        // Removed on drop from here on, whatever fails next.
        let mut link = Link {
            name: name.clone(),
            src_ip: String::new(),
            dest_ip: String::new(),
        };
        let addr = script(&["addr", &name])?;
        let mut ips = addr.split_whitespace().map(String::from);
        link.src_ip = ips.next().unwrap_or_default();
        link.dest_ip = ips.next().unwrap_or_default();
        let shaped = script(&["shape", &name, "--rate", "1gbit", "--loss", "1"])?;
        assert!(shaped.contains("loss 1 %"), "{shaped}");
        Ok(link)
    }

    fn ns(&self, side: &str) -> String {
        format!("{}-{side}", self.name)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = script(&["down", &self.name]);
    }
}

/// The link; fails the test, with the reason, where namespaces cannot be
/// made although the build found they could.
fn link(tag: &str) -> Link {
    Link::up(tag).unwrap_or_else(|why| panic!("cannot make network namespaces here: {why}"))
}

/// `s2mmu` in namespace `ns`.
fn in_ns(ns: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_s2mmu")]);
    c
}

/// A destination listening in `l`'s destination namespace: it, its
/// address, its stderr collected.
#[allow(clippy::zombie_processes)]
fn listen(l: &Link, args: &[String]) -> (Child, String, Arc<Mutex<String>>) {
    let (d, addr, err) = cli_common::spawn_listening(
        in_ns(&l.ns("d"))
            .args(["migrate", "--listen", &format!("{}:0", l.dest_ip)])
            .args(args)
            .stdout(Stdio::piped()),
    );
    let log = Arc::new(Mutex::new(String::new()));
    let l2 = log.clone();
    std::thread::spawn(move || collect(err, &l2, None));
    (d, addr, log)
}

/// A source in `l`'s source namespace to `addr`, its stderr collected.
#[allow(clippy::zombie_processes)]
fn source(l: &Link, addr: &str, args: &[String]) -> (Child, Arc<Mutex<String>>) {
    let mut s = in_ns(&l.ns("s"))
        .args(["migrate", "--to", addr])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = BufReader::new(s.stderr.take().unwrap());
    let log = Arc::new(Mutex::new(String::new()));
    let l2 = log.clone();
    std::thread::spawn(move || collect(err, &l2, None));
    (s, log)
}

/// A scratch directory with a pre-shared key in it.
fn scratch(tag: &str) -> (PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("s2mmu-link-{}{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("psk");
    std::fs::write(&key, "a pre-shared key across the shaped link\n").unwrap();
    (dir, key.display().to_string())
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// The simulated guest's flags on both sides.
fn sim(key: &str, extra: &[&str]) -> Vec<String> {
    let mut v = strings(&["--guest", "sim"]);
    v.extend(strings(&ns_guest("32M", "5s")));
    v.extend(strings(&["--psk", key]));
    v.extend(strings(extra));
    v
}

/// Both processes' ends: each one's exit, stdout and stderr.
fn ended(mut s: Child, d: Child, slog: &Mutex<String>, dlog: &Mutex<String>) -> [Output; 2] {
    let limit = Duration::from_secs(240);
    wait_exit(&mut s, limit);
    let s = s.wait_with_output().unwrap();
    let d = d.wait_with_output().unwrap();
    let with = |mut o: Output, log: &Mutex<String>| {
        o.stderr = log.lock().unwrap().clone().into_bytes();
        o
    };
    [with(s, slog), with(d, dlog)]
}

fn text(o: &Output) -> String {
    format!(
        "exit {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// One migration across `l` with `args` on both sides: both end well.
fn across(l: &Link, args: &[String]) -> [Output; 2] {
    let (d, addr, dlog) = listen(l, args);
    assert!(addr.starts_with(&l.dest_ip), "{addr}");
    let (s, slog) = source(l, &addr, args);
    let [s, d] = ended(s, d, &slog, &dlog);
    assert!(s.status.success(), "source: {}", text(&s));
    assert!(d.status.success(), "destination: {}", text(&d));
    let dl = dlog.lock().unwrap().clone();
    assert!(
        dl.contains(&format!("source connected from {}", l.src_ip)),
        "{dl}"
    );
    [s, d]
}

#[test]
#[cfg_attr(
    not(s2mmu_netns),
    ignore = "needs root and iproute2's ip for network namespaces"
)]
fn sim_precopy_across_a_lossy_link() {
    let l = link("a");
    let (dir, key) = scratch("a");
    let [s, _] = across(&l, &sim(&key, &[]));
    let out = String::from_utf8_lossy(&s.stdout);
    assert!(out.contains("per-slot digests equal"), "{}", text(&s));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
#[cfg_attr(
    not(s2mmu_netns),
    ignore = "needs root and iproute2's ip for network namespaces"
)]
fn sim_postcopy_across_a_lossy_link() {
    let l = link("b");
    let (dir, key) = scratch("b");
    let [s, _] = across(&l, &sim(&key, &["--postcopy"]));
    assert!(text(&s).contains("post-copy"), "{}", text(&s));
    let _ = std::fs::remove_dir_all(dir);
}

/// Post-copy across the lossy link, the link cut while pages are still
/// missing on the destination and restored once both sides paused, then
/// recovered by the operator on both sides: both end well, the
/// destination having paused, the source reporting one recovery.
fn recovers_after_a_cut(l: &Link, dir: &Path, args: &[String], limit: Duration) {
    let (dsock, ssock) = (dir.join("d.sock"), dir.join("s.sock"));
    let with = |sock: &Path| {
        let mut a = args.to_vec();
        a.extend(strings(&["--recovery", "manual", "--recover-wait", "600s"]));
        a.extend(["--control".into(), sock.display().to_string()]);
        a
    };
    let (mut d, addr, dlog) = listen(l, &with(&dsock));
    let (mut s, slog) = source(l, &addr, &with(&ssock));
    let every = Duration::from_millis(50);
    wait_phase_within(&dsock, &mut d, "postcopy", &dlog, (limit, every));
    script(&["cut", &l.name]).unwrap();
    let ds = wait_phase_within(&dsock, &mut d, "paused", &dlog, (limit, every));
    wait_phase_within(&ssock, &mut s, "paused", &slog, (limit, every));
    assert!(ds["pages_missing"].as_u64().unwrap() > 0, "{ds}");
    script(&["restore", &l.name]).unwrap();
    let o = ctl(&dsock, &["recover"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = ctl(&ssock, &["recover", "--to", &addr]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let [s, d] = ended(s, d, &slog, &dlog);
    assert!(s.status.success(), "source: {}", text(&s));
    assert!(d.status.success(), "destination: {}", text(&d));
    assert!(one_recovery(&text(&s)), "source: {}", text(&s));
    assert!(
        text(&d).contains("POST-COPY PAUSED"),
        "destination: {}",
        text(&d)
    );
}

/// Whether a side's report says it recovered once ("1 recoveries" in the
/// Linux guest's words, "recoveries 1:" in the simulated guest's table).
fn one_recovery(t: &str) -> bool {
    let t = t.split_whitespace().collect::<Vec<_>>().join(" ");
    t.contains("1 recoveries") || t.contains("recoveries 1:")
}

#[test]
#[cfg_attr(
    not(s2mmu_netns),
    ignore = "needs root and iproute2's ip for network namespaces"
)]
fn sim_postcopy_recovers_after_the_link_is_cut_and_restored() {
    let l = link("c");
    let (dir, key) = scratch("c");
    // 8 MiB/s: the background stream of 32 MiB takes some 4 s, the cut
    // lands inside it.
    let args = sim(&key, &["--postcopy", "start", "--bandwidth", "8M"]);
    recovers_after_a_cut(&l, &dir, &args, Duration::from_secs(60));
    let _ = std::fs::remove_dir_all(dir);
}

/// The Linux guest's flags on both sides (256 MiB, 1 vCPU), or why it
/// cannot run here.
fn linux(key: &str, extra: &[&str]) -> Vec<String> {
    let r = s2mmu_arm64::available()
        .map_err(|e| e.to_string())
        .and_then(|()| {
            let opts = s2mmu_arm64::linux::assets::AssetOptions::from_env();
            s2mmu_arm64::linux::assets::ensure(&opts).map_err(|e| e.to_string())
        });
    if let Err(why) = &r {
        panic!("the build found the Linux guest but it cannot run now: {why}");
    }
    let mut v = strings(&[
        "--guest",
        "linux",
        "--mem",
        "256M",
        "-v",
        "1",
        "--psk",
        key,
        "--io-timeout",
        "10s",
    ]);
    v.extend(strings(extra));
    v
}

#[test]
#[cfg_attr(
    not(all(s2mmu_netns, s2mmu_linux_runnable)),
    ignore = "needs root and ip for network namespaces, and the Linux guest (scripts/setup.sh)"
)]
fn linux_precopy_of_the_users_guest_across_a_lossy_link() {
    let l = link("d");
    let (dir, key) = scratch("d");
    let mut args = linux(&key, &[]);
    let opts = s2mmu_arm64::linux::assets::AssetOptions::from_env();
    let a = s2mmu_arm64::linux::assets::ensure(&opts).unwrap();
    let cmdline = "quiet s2mmu.run=counter s2mmu.args=kib=4,ms=1000";
    args.extend(["--kernel".into(), a.image.display().to_string()]);
    args.extend(["--initrd".into(), a.initramfs.display().to_string()]);
    args.extend(["--cmdline".into(), cmdline.into()]);
    args.extend([
        "--console-dir".into(),
        dir.join("con").display().to_string(),
    ]);
    let [_, d] = across(&l, &args);
    assert!(
        text(&d).contains("the destination's guest printed"),
        "{}",
        text(&d)
    );
    let src = std::fs::read_to_string(dir.join("con/source.log")).unwrap();
    let dst = std::fs::read_to_string(dir.join("con/dest.log")).unwrap();
    assert!(src.contains("s2mmu-counter") && dst.contains("s2mmu-counter"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
#[cfg_attr(
    not(all(s2mmu_netns, s2mmu_linux_runnable)),
    ignore = "needs root and ip for network namespaces, and the Linux guest (scripts/setup.sh)"
)]
fn linux_postcopy_recovers_after_the_link_is_cut_and_restored() {
    let l = link("e");
    let (dir, key) = scratch("e");
    // 8 MiB/s: the background stream (some 50 MiB of the counter guest)
    // takes seconds, the cut lands inside it.
    let args = linux(&key, &["--postcopy", "start", "--bandwidth", "8M"]);
    recovers_after_a_cut(&l, &dir, &args, Duration::from_secs(300));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
#[cfg_attr(
    not(all(s2mmu_netns, s2mmu_linux_runnable)),
    ignore = "needs root and ip for network namespaces, and the Linux guest (scripts/setup.sh)"
)]
fn linux_postcopy_across_a_lossy_link() {
    let l = link("f");
    let (dir, key) = scratch("f");
    // The guest resumes on the destination after round 0; the pages it
    // faults on and the background stream cross the 1 % loss link.
    let [s, d] = across(&l, &linux(&key, &["--postcopy"]));
    assert!(text(&s).contains("post-copy"), "source: {}", text(&s));
    // The destination's guest went on counting, step by step.
    let dt = text(&d);
    assert!(dt.contains("destination: post-copy:"), "destination: {dt}");
    assert!(
        dt.contains("the first the destination's guest began"),
        "destination: {dt}"
    );
    assert!(dt.contains("more in order"), "destination: {dt}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A relay in `l`'s destination namespace in front of `to`, holding each
/// direction's bytes for half of `rtt_ms` (the latency of a link where
/// the kernel has no netem); it and where it listens.
#[allow(clippy::zombie_processes)]
fn relay(l: &Link, to: &str, rtt_ms: &str) -> (Child, String) {
    let py = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/netns_delay_relay.py");
    let mut r = Command::new("ip")
        .args(["netns", "exec", &l.ns("d"), "python3"])
        .arg(py)
        .args(["--listen", &format!("{}:0", l.dest_ip), "--to", to])
        .args(["--rtt-ms", rtt_ms])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(r.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let at = line
        .split("listening on ")
        .nth(1)
        .and_then(|x| x.split(',').next());
    let at = at.unwrap_or_else(|| panic!("the relay said {line:?}"));
    (r, at.to_string())
}

#[test]
#[cfg_attr(
    not(s2mmu_netns),
    ignore = "needs root and iproute2's ip for network namespaces, and python3"
)]
fn sim_precopy_across_a_lossy_link_with_the_relays_rtt() {
    let l = link("g");
    let (dir, key) = scratch("g");
    let args = sim(&key, &[]);
    let (d, addr, dlog) = listen(&l, &args);
    let (mut r, via) = relay(&l, &addr, "1");
    let (s, slog) = source(&l, &via, &args);
    let [s, d] = ended(s, d, &slog, &dlog);
    let _ = r.kill();
    let _ = r.wait();
    assert!(s.status.success(), "source: {}", text(&s));
    assert!(d.status.success(), "destination: {}", text(&d));
    // The destination saw the relay's connections, not the source's.
    let dl = dlog.lock().unwrap().clone();
    assert!(
        dl.contains(&format!("source connected from {}", l.dest_ip)),
        "{dl}"
    );
    let out = String::from_utf8_lossy(&s.stdout);
    assert!(out.contains("per-slot digests equal"), "{}", text(&s));
    let _ = std::fs::remove_dir_all(dir);
}
