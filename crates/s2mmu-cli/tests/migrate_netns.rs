//! Between hosts: the source and the destination as two processes in two
//! network namespaces joined by a veth pair, which the test makes and
//! removes. It skips, saying why in one line, where namespaces cannot be
//! made (not root, no `ip`, no netns support). The addresses live only in
//! those namespaces.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
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

fn make() -> Result<(Netns, String, String), String> {
    let id = std::process::id();
    let (a, b) = (format!("s2mmu-t{id}-d"), format!("s2mmu-t{id}-s"));
    let mut ns = Netns { names: Vec::new() };
    ip(&["netns", "add", &a])?;
    ns.names.push(a.clone());
    ip(&["netns", "add", &b])?;
    ns.names.push(b.clone());
    let (va, vb) = (format!("s2m{id}d"), format!("s2m{id}s"));
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
fn migration_between_two_network_namespaces() {
    let (ns, dest_ns, src_ns) = match make() {
        Ok(v) => v,
        Err(why) => {
            eprintln!("skipped: cannot make network namespaces here ({why})");
            return;
        }
    };
    let bin = env!("CARGO_BIN_EXE_s2mmu");
    let dir = std::env::temp_dir().join(format!("s2mmu-netns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("psk");
    std::fs::write(&key, "a pre-shared key for the netns test\n").unwrap();
    let key = key.to_str().unwrap().to_string();
    let common = [
        "--mem",
        "32M",
        "-s",
        "anonymous",
        "--warmup",
        "50ms",
        "--run-after",
        "50ms",
        "--plot",
        "",
        "--io-timeout",
        "3s",
        "--psk",
        &key,
    ];
    let mut dest = Command::new("ip")
        .args(["netns", "exec", &dest_ns, bin, "migrate", "--listen"])
        .arg(format!("{DEST_IP}:0"))
        .args(common)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(dest.stderr.take().unwrap());
    let mut line = String::new();
    let addr = loop {
        line.clear();
        if err.read_line(&mut line).unwrap_or(0) == 0 {
            let _ = dest.kill();
            let _ = dest.wait();
            panic!("the destination exited early");
        }
        if let Some(rest) = line.split("destination listening on ").nth(1) {
            break rest.split_whitespace().next().unwrap_or("").to_string();
        }
    };
    assert!(addr.starts_with(DEST_IP), "{addr}");
    let src = Command::new("ip")
        .args(["netns", "exec", &src_ns, bin, "migrate", "--to", &addr])
        .args(common)
        .output()
        .unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = dest.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = dest.kill();
            let _ = dest.wait();
            panic!("the destination hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
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
