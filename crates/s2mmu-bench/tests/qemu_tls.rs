//! QEMU's own migration with the benchmark's TLS credentials
//! (`vs_qemu::qemu_tls`): between two QEMU processes given the same
//! pre-shared key it completes, and with different keys it fails, so the
//! connection really is TLS with that key and not plain TCP. The machines
//! have no kernel (nothing to boot: the migration moves their RAM and
//! devices all the same), 64 MiB of RAM each. Needs qemu-system-aarch64
//! (the test fails, saying so, without it).

use s2mmu_bench::vs_qemu::qemu_tls::{self, PskDir};
use s2mmu_bench::vs_qemu::qmp::Qmp;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Both QEMU processes, killed when the test ends.
struct Pair(Vec<Child>);

impl Drop for Pair {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("s2mmu-qemu-tls-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn qemu(qmp: &Path, psk: &PskDir, incoming: Option<&str>) -> Child {
    let mut c = Command::new("qemu-system-aarch64");
    c.args(["-M", "virt", "-cpu", "max", "-m", "64M", "-nodefaults"])
        .args(["-display", "none", "-monitor", "none", "-serial", "none"])
        .arg("-qmp")
        .arg(format!("unix:{},server=on,wait=off", qmp.display()))
        .arg("-object")
        .arg(psk.object(incoming.is_some()));
    if let Some(i) = incoming {
        c.args(["-incoming", i]);
    }
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("qemu-system-aarch64 must be installed (apt-get install qemu-system-arm)")
}

/// Migrates a source holding `src_key` to a destination holding
/// `dst_key`; the source's final status ("completed" or "failed").
fn migrate(name: &str, src_key: &str, dst_key: &str) -> String {
    let dir = tmp(name);
    let sp = PskDir::write(&dir.join("s"), src_key).unwrap();
    let dp = PskDir::write(&dir.join("d"), dst_key).unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr = format!("tcp:127.0.0.1:{port}");
    let (sq, dq) = (dir.join("s.qmp"), dir.join("d.qmp"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut pair = Pair(vec![qemu(&dq, &dp, Some(&addr))]);
    pair.0.push(qemu(&sq, &sp, None));
    let mut d = Qmp::connect(&dq, deadline).unwrap();
    let mut s = Qmp::connect(&sq, deadline).unwrap();
    qemu_tls::use_creds(&mut d).unwrap();
    qemu_tls::use_creds(&mut s).unwrap();
    let p = s.cmd("query-migrate-parameters", json!({})).unwrap();
    assert_eq!(p["tls-creds"], qemu_tls::CREDS_ID, "{p}");
    s.cmd("migrate", json!({ "uri": addr })).unwrap();
    let status = loop {
        let st = s.cmd("query-migrate", json!({})).unwrap();
        if let Some(x @ ("completed" | "failed" | "cancelled")) = st["status"].as_str() {
            break x.to_string();
        }
        assert!(Instant::now() < deadline, "no end by the deadline: {st}");
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(pair);
    let _ = std::fs::remove_dir_all(&dir);
    status
}

#[test]
fn qemu_migrates_with_the_same_key_and_fails_with_another() {
    let key = "5eed".repeat(8);
    assert_eq!(migrate("same", &key, &key), "completed");
    assert_eq!(migrate("other", &key, &"0bad".repeat(8)), "failed");
}
