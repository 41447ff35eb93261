//! A real KVM guest (`s2mmu_kvm::migrate::writer`: one vCPU writing a
//! counter into every page of two RAM regions) live-migrated between two
//! processes over TCP with the migration library, under KVM's own dirty
//! log in both forms: bitmaps with `KVM_CLEAR_DIRTY_LOG`, and dirty rings.
//! The test spawns itself as the destination (the same test, told so by
//! the environment). Checked: every page's hash of the paused source
//! equals the destination's before its vCPU starts (0 differ), the vCPU
//! resumes at the source's counter, and it goes on writing there.
//! Where the build found no usable /dev/kvm the tests are ignored with
//! the reason (`build.rs`).

use s2mmu_kvm::migrate::session_vm::KvmDirtyLog;
use s2mmu_kvm::migrate::writer::{Started, WriterDest, WriterGuest};
use s2mmu_migrate::session::dest::{serve_with, DestConfig};
use s2mmu_migrate::session::policy::Harvest;
use s2mmu_migrate::session::source::{run_source, SourceConfig};
use s2mmu_migrate::transport::{self, NetConfig};
use s2mmu_migrate::vm::SessionVm;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

const ROLE: &str = "S2MMU_KVM_MIGRATE_DEST";
const RING: KvmDirtyLog = KvmDirtyLog::Ring { entries: 4096 };

fn net() -> NetConfig {
    NetConfig::plain(Duration::from_secs(20))
}

/// A line to the source, straight to the standard output (past the test
/// runner's capture).
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .expect("stdout");
}

/// The destination's side: serves one migration, lets the guest run,
/// prints what it started from and how far it went.
fn destination(log: KvmDirtyLog) {
    let listener = transport::bind("127.0.0.1:0").expect("bind");
    say(&format!("LISTEN {}", listener.local()));
    let started: Started = Default::default();
    let factory = WriterDest {
        log,
        started: started.clone(),
    };
    let cfg = DestConfig::with_run_after(Duration::from_millis(500));
    let out = serve_with(&*listener, &factory, &cfg, &net()).expect("the destination's migration");
    let (hashes, counter) = started.lock().unwrap().take().expect("the guest started");
    let passes = out.resumed_progress.first().copied().unwrap_or(0);
    let hashes: Vec<String> = hashes.iter().map(|h| format!("{h:x}")).collect();
    say(&format!("STARTED {counter} PASSES {passes}"));
    say(&format!("HASHES {}", hashes.join(",")));
}

/// The source's side: a guest that runs, migrated to a child process.
fn source(test: &str, log: KvmDirtyLog) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, "1")
        .stdout(Stdio::piped())
        .spawn()
        .expect("the destination process");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = loop {
        let l = lines.next().expect("the destination's address").unwrap();
        // The runner's "test NAME ... " may open the line.
        if let Some(at) = l.find("LISTEN ") {
            break l[at + 7..].trim().to_string();
        }
    };
    let kvm = s2mmu_kvm::open_kvm().unwrap();
    let guest = WriterGuest::start(&kvm, log).unwrap();
    std::thread::sleep(Duration::from_millis(200)); // the guest runs before the migration
    let harvest = match log {
        KvmDirtyLog::Bitmap => Harvest::Bitmap,
        KvmDirtyLog::Ring { .. } => Harvest::Ring,
    };
    let cfg = SourceConfig {
        harvest,
        ..SourceConfig::default()
    };
    let n = net();
    let out = run_source(&guest, &cfg, &mut |_| {
        transport::client(transport::connect(&addr, &n)?, &n)
    });
    if let Err(e) = &out {
        // The destination may still wait for a connection that never came.
        let _ = child.kill();
        let _ = child.wait();
        panic!("source: {e}");
    }
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let status = child.wait().unwrap();
    let out = out.unwrap();
    assert!(status.success(), "the destination failed: {rest:?}");
    assert!(guest.errors().is_empty(), "{:?}", guest.errors());
    // Paused since the switch: hashed as it stopped.
    let here = guest.kvm_vm().ram().page_hashes();
    let counter = guest.registers().unwrap()[0].regs.rax;
    let field = |key: &str| {
        let l = rest
            .iter()
            .find_map(|l| l.find(key).map(|at| &l[at + key.len()..]));
        l.unwrap_or_else(|| panic!("{key} in {rest:?}"))
            .trim()
            .to_string()
    };
    let there: Vec<u64> = field("HASHES ")
        .split(',')
        .map(|h| u64::from_str_radix(h, 16).unwrap())
        .collect();
    let started = field("STARTED ");
    let mut nums = started
        .split_whitespace()
        .filter_map(|w| w.parse::<u64>().ok());
    let (from, passes) = (nums.next().unwrap(), nums.next().unwrap());
    assert_eq!(here.len(), there.len());
    let differ = here.iter().zip(&there).filter(|(a, b)| a != b).count();
    assert_eq!(differ, 0, "{differ} of {} pages differ", here.len());
    assert_eq!(from, counter, "the destination resumed at another counter");
    assert!(from > 0, "the guest never wrote before the migration");
    assert!(passes > 0, "the destination's guest made no pass");
    assert!(!out.rounds.is_empty());
    eprintln!(
        "{log:?}: {} rounds, downtime {:?}, {} pages, counter {from}, {passes} passes on the destination",
        out.rounds.len(),
        out.downtime,
        here.len()
    );
}

fn run(test: &str, log: KvmDirtyLog) {
    if let Some(reason) = s2mmu_kvm::kvm_unusable_reason() {
        panic!("the build opened /dev/kvm but KVM cannot run this crate's guests: {reason}");
    }
    if std::env::var_os(ROLE).is_some() {
        destination(log);
    } else {
        source(test, log);
    }
}

#[test]
#[cfg_attr(
    not(s2mmu_kvm_device),
    ignore = "needs /dev/kvm, read-write (see the build warning)"
)]
fn a_kvm_guest_moves_between_processes_with_the_dirty_bitmap() {
    run(
        "a_kvm_guest_moves_between_processes_with_the_dirty_bitmap",
        KvmDirtyLog::Bitmap,
    );
}

#[test]
#[cfg_attr(
    not(s2mmu_kvm_device),
    ignore = "needs /dev/kvm, read-write (see the build warning)"
)]
fn a_kvm_guest_moves_between_processes_with_the_dirty_ring() {
    run(
        "a_kvm_guest_moves_between_processes_with_the_dirty_ring",
        RING,
    );
}
