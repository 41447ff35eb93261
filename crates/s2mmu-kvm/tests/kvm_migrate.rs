//! A real KVM guest (`s2mmu_kvm::migrate::writer`: vCPUs writing a
//! counter into every page of two RAM regions, checking their SSE state
//! and TSC) live-migrated between two processes over TCP with the
//! migration library, under KVM's own dirty log in both forms: bitmaps
//! with `KVM_CLEAR_DIRTY_LOG`, and dirty rings. The test spawns itself as
//! the destination (the same test, told so by the environment). Checked:
//! every page's hash of the paused source equals the destination's before
//! its vCPUs start (0 differ); the destination's vCPU state, read back
//! through KVM after the restore, equals the paused source's (registers,
//! XSAVE area, XCRs, MSRs, LAPIC, events, debug registers, run state; the
//! TSC and the KVM clock not behind it); the guest's own checks pass and
//! it goes on writing there. A planted fault (the destination drops the
//! XSAVE area) must be caught by the guest's SSE check.
//! Where the build found no usable /dev/kvm the tests are ignored with
//! the reason (`build.rs`).

use s2mmu_kvm::migrate::cpu_state::{KvmState, VcpuState};
use s2mmu_kvm::migrate::session_vm::KvmDirtyLog;
use s2mmu_kvm::migrate::writer::{marks_of, vmm_marks, WriterGuest};
use s2mmu_kvm::migrate::writer_dest::{Started, WriterDest};
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

/// How the destination misbehaves, for the test that must catch it.
const DROP_XSAVE: &str = "drop-xsave";

/// The destination's side: serves one migration, lets the guest run,
/// prints what it started from and how far it went.
fn destination(log: KvmDirtyLog, drop_xsave: bool) {
    let listener = transport::bind("127.0.0.1:0").expect("bind");
    say(&format!("LISTEN {}", listener.local()));
    let started: Started = Default::default();
    let factory = WriterDest {
        log,
        started: started.clone(),
        drop_xsave,
    };
    // Long enough for a pass on a host loaded many times over (its first
    // touch of each page is a shadow-MMU fault).
    let cfg = DestConfig::with_run_after(Duration::from_secs(3));
    let out = serve_with(&*listener, &factory, &cfg, &net()).expect("the destination's migration");
    let r = started.lock().unwrap().take().expect("the guest started");
    let passes = out.resumed_progress.iter().sum::<u64>();
    let hashes: Vec<String> = r.hashes.iter().map(|h| format!("{h:x}")).collect();
    let state: String = r
        .state
        .encode()
        .unwrap()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    say(&format!("PASSES {passes}"));
    say(&format!("ERRORS {}", r.errors.join(" | ")));
    say(&format!("STATE {state}"));
    say(&format!("HASHES {}", hashes.join(",")));
}

/// What the destination printed.
struct Dest {
    hashes: Vec<u64>,
    state: KvmState,
    passes: u64,
    errors: String,
}

fn parse_dest(rest: &[String], vcpus: usize) -> Dest {
    let field = |key: &str| {
        let l = rest
            .iter()
            .find_map(|l| l.find(key).map(|at| &l[at + key.len()..]));
        l.unwrap_or_else(|| panic!("{key} in {rest:?}"))
            .trim()
            .to_string()
    };
    let hex = field("STATE ");
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    Dest {
        hashes: field("HASHES ")
            .split(',')
            .map(|h| u64::from_str_radix(h, 16).unwrap())
            .collect(),
        state: KvmState::decode(&bytes, vcpus).expect("the destination's state"),
        passes: field("PASSES ").parse().unwrap(),
        errors: rest
            .iter()
            .find_map(|l| l.find("ERRORS").map(|at| l[at + 6..].trim().to_string()))
            .unwrap_or_default(),
    }
}

/// The parts of a vCPU's state that must arrive as they left, the
/// time-driven MSRs (TSC, TSC deadline) left out.
fn fixed_parts(v: &VcpuState) -> VcpuState {
    let mut v = v.clone();
    v.msrs.retain(|(i, _)| *i != 0x10 && *i != 0x6e0);
    v
}

fn tsc(v: &VcpuState) -> u64 {
    v.msrs
        .iter()
        .find(|(i, _)| *i == 0x10)
        .expect("the TSC MSR")
        .1
}

/// The destination's state against the one the source sent. (On
/// kvm_pvm the guest's TSC is the host's and writes to it are ignored,
/// so only the order is checked.)
fn check_state(here: &KvmState, there: &KvmState) {
    assert_eq!(here.vcpus.len(), there.vcpus.len());
    for (i, (a, b)) in here.vcpus.iter().zip(&there.vcpus).enumerate() {
        assert_eq!(marks_of(b), Some(vmm_marks(i)), "vCPU {i}'s marks");
        assert!(b.fpu.is_some() && b.lapic.is_some() && b.events.is_some());
        assert_eq!(fixed_parts(a), fixed_parts(b), "vCPU {i}'s state differs");
        assert!(
            tsc(b) >= tsc(a),
            "vCPU {i}'s TSC went back: {:#x} to {:#x}",
            tsc(a),
            tsc(b)
        );
    }
    assert!(
        there.clock.clock_ns >= here.clock.clock_ns,
        "the KVM clock went back"
    );
}

/// The source's side: a guest that runs, migrated to a child process.
/// Returns what the destination reported, checked when `expect_ok`.
fn source(test: &str, log: KvmDirtyLog, vcpus: u32, drop_xsave: bool) -> Dest {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE, if drop_xsave { DROP_XSAVE } else { "1" })
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
    let guest = WriterGuest::start(&kvm, log, vcpus).unwrap();
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
    let state = guest.sent_state().expect("the source sent its state");
    let dest = parse_dest(&rest, vcpus as usize);
    assert_eq!(here.len(), dest.hashes.len());
    let differ = here
        .iter()
        .zip(&dest.hashes)
        .filter(|(a, b)| a != b)
        .count();
    assert_eq!(differ, 0, "{differ} of {} pages differ", here.len());
    assert!(
        state.vcpus.iter().all(|v| v.regs.rax > 0),
        "the guest never wrote"
    );
    assert!(!out.rounds.is_empty());
    if !drop_xsave {
        check_state(&state, &dest.state);
    }
    eprintln!(
        "{log:?}, {vcpus} vCPUs: {} rounds, downtime {:?}, {} pages, {} passes on the destination",
        out.rounds.len(),
        out.downtime,
        here.len(),
        dest.passes
    );
    dest
}

fn run(test: &str, log: KvmDirtyLog, vcpus: u32) {
    if let Some(reason) = s2mmu_kvm::kvm_unusable_reason() {
        panic!("the build opened /dev/kvm but KVM cannot run this crate's guests: {reason}");
    }
    match std::env::var(ROLE) {
        Ok(role) => destination(log, role == DROP_XSAVE),
        Err(_) => {
            let dest = source(test, log, vcpus, false);
            assert!(
                dest.errors.is_empty(),
                "the guest's checks failed: {}",
                dest.errors
            );
            assert!(dest.passes > 0, "the destination's guest made no pass");
        }
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
        1,
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
        1,
    );
}

#[test]
#[cfg_attr(
    not(s2mmu_kvm_device),
    ignore = "needs /dev/kvm, read-write (see the build warning)"
)]
fn a_two_vcpu_kvm_guest_moves_with_its_full_state() {
    run(
        "a_two_vcpu_kvm_guest_moves_with_its_full_state",
        KvmDirtyLog::Bitmap,
        2,
    );
}

#[test]
#[cfg_attr(
    not(s2mmu_kvm_device),
    ignore = "needs /dev/kvm, read-write (see the build warning)"
)]
fn a_destination_that_drops_the_xsave_area_is_caught_by_the_guest() {
    let test = "a_destination_that_drops_the_xsave_area_is_caught_by_the_guest";
    if std::env::var_os(ROLE).is_some() {
        return run(test, KvmDirtyLog::Bitmap, 2);
    }
    let dest = source(test, KvmDirtyLog::Bitmap, 2, true);
    assert!(
        dest.errors.contains("vCPU 0: state check: xmm0 lost")
            && dest.errors.contains("vCPU 1: state check: xmm0 lost"),
        "the guest did not notice its lost SSE state: {:?}",
        dest.errors
    );
    assert_eq!(dest.passes, 0, "a vCPU without its SSE state made a pass");
}
