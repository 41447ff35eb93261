//! Between hosts: the source and the destination as two processes in two
//! network namespaces joined by a veth pair, which the test makes and
//! removes. Where the build ran without root or without `ip` the tests are
//! reported as ignored with that reason (`build.rs`'s `s2mmu_netns`);
//! where namespaces then cannot be made the test fails, saying why. The addresses live only in
//! those namespaces.

#[path = "../cli_common/mod.rs"]
mod cli_common;
#[path = "../recover_common/mod.rs"]
mod recover_common;

use recover_common::ns_guest;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Two namespaces and the veth pair between them; removed on drop.
struct Netns {
    names: Vec<String>,
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of the veth pair, and the
        // pair with it.
        for n in &self.names {
            let _ = ip(&["netns", "del", n]);
        }
    }
}

const DEST_IP: &str = "10.213.7.1";
const SRC_IP: &str = "10.213.7.2";

/// Namespaces `s2mmu-t<pid><tag>-d` and `-s` (tag: one letter per test).
fn make(tag: &str) -> Result<(Netns, String, String), String> {
    let id = std::process::id();
    let (a, b) = (format!("s2mmu-t{id}{tag}-d"), format!("s2mmu-t{id}{tag}-s"));
    let mut ns = Netns { names: Vec::new() };
    ip(&["netns", "add", &a])?;
    ns.names.push(a.clone());
    ip(&["netns", "add", &b])?;
    ns.names.push(b.clone());
    let (va, vb) = (format!("s2m{id}{tag}d"), format!("s2m{id}{tag}s"));
    ip(&[
        "link", "add", &va, "netns", &a, "type", "veth", "peer", "name", &vb, "netns", &b,
    ])?;
    ip(&[
        "-n",
        &a,
        "addr",
        "add",
        &format!("{DEST_IP}/24"),
        "dev",
        &va,
    ])?;
    ip(&["-n", &b, "addr", "add", &format!("{SRC_IP}/24"), "dev", &vb])?;
    for (n, v) in [(&a, &va), (&b, &vb)] {
        ip(&["-n", n, "link", "set", v, "up"])?;
        ip(&["-n", n, "link", "set", "lo", "up"])?;
    }
    Ok((ns, a, b))
}

#[test]
#[cfg_attr(
    not(s2mmu_netns),
    ignore = "needs root and iproute2's ip for network namespaces"
)]
fn migration_between_two_network_namespaces() {
    let (ns, dest_ns, src_ns) =
        make("a").unwrap_or_else(|why| panic!("cannot make network namespaces here: {why}"));
    let bin = env!("CARGO_BIN_EXE_s2mmu");
    let dir = std::env::temp_dir().join(format!("s2mmu-netns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("psk");
    std::fs::write(&key, "a pre-shared key for the netns test\n").unwrap();
    let key = key.to_str().unwrap().to_string();
    let common = [&ns_guest("32M", "3s")[..], &["--psk", &key]].concat();
    let (mut dest, mut err, addr) = start_dest(&dest_ns, &common);
    assert!(addr.starts_with(DEST_IP), "{addr}");
    let src = Command::new("ip")
        .args(["netns", "exec", &src_ns, bin, "migrate", "--to", &addr])
        .args(&common)
        .output()
        .unwrap();
    let status = wait_bounded(&mut dest);
    let mut dlog = String::new();
    let _ = err.read_to_string(&mut dlog);
    let stdout = String::from_utf8_lossy(&src.stdout);
    assert!(
        src.status.success(),
        "source: {}",
        String::from_utf8_lossy(&src.stderr)
    );
    assert!(status.success(), "destination: {dlog}");
    assert!(
        stdout.contains("per-slot digests equal"),
        "source report: {stdout}"
    );
    assert!(
        dlog.contains(&format!("source connected from {SRC_IP}")),
        "{dlog}"
    );
    drop(ns);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts the destination in namespace `ns`; returns it, its stderr and
/// the address it listens on.
#[allow(clippy::zombie_processes)]
fn start_dest(ns: &str, args: &[&str]) -> (Child, BufReader<ChildStderr>, String) {
    let mut dest = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            env!("CARGO_BIN_EXE_s2mmu"),
            "migrate",
            "--listen",
        ])
        .arg(format!("{DEST_IP}:0"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(dest.stderr.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        if err.read_line(&mut line).unwrap_or(0) == 0 {
            let _ = dest.kill();
            let _ = dest.wait();
            panic!("the destination exited early");
        }
        if let Some(rest) = line.split("destination listening on ").nth(1) {
            let addr = rest.split_whitespace().next().unwrap_or("").to_string();
            return (dest, err, addr);
        }
    }
}

/// Waits for `c` at most a minute; kills it and fails past that.
fn wait_bounded(c: &mut Child) -> ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(s) = c.try_wait().unwrap() {
            return s;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = c.kill();
            let _ = c.wait();
            panic!("a migration process hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
#[cfg_attr(
    not(s2mmu_netns),
    ignore = "needs root and iproute2's ip for network namespaces"
)]
fn a_peer_that_vanishes_from_the_network_ends_both_sides() {
    let (ns, dest_ns, src_ns) =
        make("b").unwrap_or_else(|why| panic!("cannot make network namespaces here: {why}"));
    // Plain TCP (the warning is expected), slowed so the cut lands
    // mid-stream.
    let common = [&ns_guest("64M", "2s")[..], &["--bandwidth", "4M"]].concat();
    let (mut dest, mut derr, addr) = start_dest(&dest_ns, &common);
    let mut src = Command::new("ip")
        .args([
            "netns",
            "exec",
            &src_ns,
            env!("CARGO_BIN_EXE_s2mmu"),
            "migrate",
            "--to",
            &addr,
        ])
        .args(&common)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    loop {
        line.clear();
        if derr.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        if line.contains("source connected") {
            break;
        }
    }
    std::thread::sleep(Duration::from_millis(1000));
    // The destination's host disappears: no FIN, no RST, nothing.
    let dev = format!("s2m{}bd", std::process::id());
    ip(&["-n", &dest_ns, "link", "set", &dev, "down"]).unwrap();
    let serr = src.stderr.take().unwrap();
    let s_status = wait_bounded(&mut src);
    let d_status = wait_bounded(&mut dest);
    let mut slog = String::new();
    let _ = BufReader::new(serr).read_to_string(&mut slog);
    let mut dlog = String::new();
    let _ = derr.read_to_string(&mut dlog);
    assert!(!s_status.success(), "the source succeeded: {slog}");
    assert!(!d_status.success(), "the destination succeeded: {dlog}");
    assert!(slog.contains("timed out"), "source: {slog}");
    assert!(dlog.contains("timed out"), "destination: {dlog}");
    drop(ns);
}
