//! Post-copy recovery by hand of `s2mmu migrate --guest linux` between two
//! processes: the source (`--to`, `--postcopy start`: every page missing
//! on the destination at the resume) reaches the destination (`--listen`)
//! through a proxy in this test that shuts every connection down 8 MiB
//! into the post-copy stream, and then refuses
//! new connections. Both sides (`--recovery manual --control PATH`) must
//! pause with the destination still lacking pages; `s2mmu migrate-ctl
//! recover` on the destination and `recover --to ADDR` (its own address,
//! around the proxy) on the source resume them, and the migration
//! completes: one recovery on each side, the source's check of FINAL
//! passing and the destination's counter going on in order. Pre-shared
//! key. Behaviour only: no timing is asserted. Skips (saying why) where
//! QEMU, the EL2 image or the kernel are missing; fails there under
//! `S2MMU_REQUIRE_ARM64`.

#[path = "../cli_common/mod.rs"]
mod cli_common;
#[path = "../recover_common/mod.rs"]
mod recover_common;

use cli_common::{require_linux, spawn_listening};
use recover_common::{bin, collect, ctl, proxy, wait_exit, wait_phase_within, PSK};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Bytes through the proxy before the cut: before the switch the source
/// sends a few KiB of records (no link probe unless asked for) but no
/// page; the background stream of the 256 MiB counter guest is some 50
/// MiB. 8 MiB into it.
const CUT_AFTER: u64 = 8 << 20;

/// The flags both sides share: the Linux guest of 256 MiB and 1 vCPU,
/// the pre-shared key in `key`, manual recovery on the control socket
/// `sock`.
fn side_args(key: &Path, sock: &Path) -> Vec<String> {
    [
        "migrate",
        "--guest",
        "linux",
        "--mem",
        "256M",
        "-v",
        "1",
        "--psk",
        key.to_str().unwrap(),
        "--recovery",
        "manual",
        "--recover-wait",
        "600s",
        "--control",
        sock.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec()
}

/// A process's stderr, collected on a thread of its own.
fn collected(err: impl BufRead + Send + 'static) -> Arc<Mutex<String>> {
    let log = Arc::new(Mutex::new(String::new()));
    let l = log.clone();
    std::thread::spawn(move || collect(err, &l, None));
    log
}

/// The destination (`--listen`), its address and its stderr.
#[allow(clippy::zombie_processes)]
fn start_dest(key: &Path, sock: &Path) -> (Child, String, Arc<Mutex<String>>) {
    let (dest, addr, err) = spawn_listening(
        Command::new(bin())
            .args(side_args(key, sock))
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped()),
    );
    (dest, addr, collected(err))
}

/// The source (`--to to --postcopy start`) and its stderr.
#[allow(clippy::zombie_processes)]
fn start_source(key: &Path, sock: &Path, to: &str) -> (Child, Arc<Mutex<String>>) {
    let mut src = Command::new(bin())
        .args(side_args(key, sock))
        .args(["--to", to, "--postcopy", "start"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the source starts");
    let err = BufReader::new(src.stderr.take().unwrap());
    (src, collected(err))
}

/// Both processes ended well after one recovery each, the source's check
/// of FINAL passing and the destination's counter going on.
fn completed(mut src: Child, dest: Child, slog: &Mutex<String>, dlog: &Mutex<String>) {
    let s_status = wait_exit(&mut src, Duration::from_secs(600));
    let d = dest.wait_with_output().expect("the destination ends");
    let (s_log, d_log) = (slog.lock().unwrap().clone(), dlog.lock().unwrap().clone());
    let d_out = String::from_utf8_lossy(&d.stdout).to_string();
    let all =
        format!("source:\n{s_log}\ndestination stdout:\n{d_out}\ndestination stderr:\n{d_log}");
    assert!(s_status.success(), "{all}");
    assert!(d.status.success(), "{all}");
    assert!(s_log.contains("post-copy from the start"), "{all}");
    assert!(
        s_log.contains("; 1 recoveries;"),
        "the source's recoveries: {all}"
    );
    assert!(
        d_out.contains("1 recoveries"),
        "the destination's recoveries: {all}"
    );
    assert!(
        s_log.contains("did not write equal the source's"),
        "the source checked FINAL: {all}"
    );
    assert!(
        d_out.contains("was the first the destination's guest began, then"),
        "the destination's counter went on: {all}"
    );
}

#[test]
#[cfg_attr(
    not(s2mmu_linux_runnable),
    ignore = "needs the Linux guest: QEMU, the EL2 image, the cross compiler, dtc and the kernel packages (scripts/setup.sh)"
)]
fn a_cut_linux_postcopy_pauses_both_processes_until_the_operator_recovers_it() {
    require_linux();
    let dir = std::env::temp_dir().join(format!("s2mmu-linux-recover-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("key");
    std::fs::write(&key, PSK).unwrap();
    let (dsock, ssock) = (dir.join("dest.sock"), dir.join("src.sock"));
    let (mut dest, addr, dlog) = start_dest(&key, &dsock);
    // Counting from the source's first byte; new connections after the
    // cut are refused: only `recover --to ADDR` gets through.
    let p = proxy(addr.clone(), CUT_AFTER, true);
    p.armed.store(true, Ordering::SeqCst);
    let (mut src, slog) = start_source(&key, &ssock, &p.addr);

    // The guest boots and streams under TCG first: minutes, polled gently.
    let (limit, every) = (Duration::from_secs(600), Duration::from_millis(100));
    let ds = wait_phase_within(&dsock, &mut dest, "paused", &dlog, (limit, every));
    let ss = wait_phase_within(&ssock, &mut src, "paused", &slog, (limit, every));
    assert!(
        p.cut_done.load(Ordering::SeqCst),
        "paused without the cut: {ds} {ss}"
    );
    assert!(
        ds["pages_missing"].as_u64().unwrap() > 0,
        "the destination lacked no page at the cut: {ds}"
    );
    let o = ctl(&dsock, &["recover"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = ctl(&ssock, &["recover", "--to", &addr]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    completed(src, dest, &slog, &dlog);
    std::fs::remove_dir_all(&dir).unwrap();
}
