//! A running Linux guest moves between QEMU machines through the
//! migration LIBRARY's session and goes on: machine A boots Debian's
//! kernel running the guest program `counter` (a counter that only grows
//! and a running hash of its own data), is migrated with `run_source` to
//! machine B (built by the session's destination from the HEADER), and
//! back to A's side (a fresh machine there: a QEMU that has run guest code
//! cannot take restored state), then snapshotted with the session's
//! snapshot code (the memory in the simulated guest's snapshot format,
//! the state beside it) and restored into a fresh machine D. Every
//! console line of every machine, joined in the order the guest lived,
//! must be the counter's exact sequence (each n once, each hash the one
//! its data gives), the memories must agree by digest at each switch, and
//! a stopped side must stay silent. Damaged and foreign snapshots are
//! refused by name before any vCPU runs.

mod common;

use common::counter::{check_lives, check_sequence, config, counter_lines, next_hash, wait_lines};
use s2mmu_arm64::linux::migrate::LinuxVm;
use s2mmu_arm64::linux::vm::Engine;
use s2mmu_arm64_migrate::session_dest::LinuxDest;
use s2mmu_arm64_migrate::session_source::{LinuxSessionVm, LinuxSource};
use s2mmu_arm64_migrate::state::linux::LINUX_KIND;
use s2mmu_migrate::session::dest::DestOutcome;
use s2mmu_migrate::session::guest::SourceGuest;
use s2mmu_migrate::session::snapshot::format::SnapshotError;
use s2mmu_migrate::session::snapshot::guest::{
    read_state, restore_guest, save_paused, state_path, write_state,
};
use s2mmu_migrate::session::snapshot::restore::file_name;
use s2mmu_migrate::session::source::{SourceConfig, SourceOutcome};
use s2mmu_migrate::state::State;
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::transport::NetConfig;
use s2mmu_migrate::vm::{GuestRun, SessionVm};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The most guest memory a restore here accepts.
const MAX_MEM: u64 = 1 << 30;

type Outcomes = (
    Result<SourceOutcome, MigrateError>,
    Result<DestOutcome, MigrateError>,
);

/// One migration of `src` into a Linux destination built by `dest`, both
/// ends in this process over loopback TCP.
fn migrate(src: &LinuxSource, dest: &Arc<LinuxDest>) -> Outcomes {
    let net = NetConfig::plain(Duration::from_secs(120));
    let ends = common::migrate_here(src, dest, &SourceConfig::default(), &net);
    (ends.source, ends.dest)
}

/// Migrates `src` into a machine `dest` builds, checks the digests at the
/// switch and that the source stays silent after it, and returns the
/// destination's machine (running on) and the source's console.
fn hop(src: &LinuxSource, dest: &Arc<LinuxDest>, what: &str) -> (Arc<LinuxSessionVm>, String) {
    let (s, d) = migrate(src, dest);
    let (s, d) = (s.expect(what), d.expect(what));
    eprintln!(
        "{what}: downtime {:?}, {} rounds, {} page records",
        s.downtime,
        s.rounds.len(),
        s.page_records
    );
    assert!(!s.slot_digests.is_empty());
    assert_eq!(
        s.slot_digests, d.slot_digests,
        "{what}: memories at the switch"
    );
    let mark = common::at_switch(src.vm());
    let to = dest.built().expect("the destination's machine");
    assert!(
        !to.lock().cpus_parked(),
        "{what}: the destination's CPUs are still parked after the resume"
    );
    // The destination's part of the downtime up to RESUMED's write lies
    // inside it (the reply's end is read after the write, when the
    // source may have read it already), and the restore's clock inside
    // that part's start.
    let (q, rc) = (d.resume_parts, to.lock().restore_clock());
    assert!(
        q.start > Duration::ZERO && q.until_reply() <= s.downtime,
        "{what}: {q:?} in {:?}",
        s.downtime
    );
    assert!(
        rc.counter > Duration::ZERO
            && rc.first_instruction > Duration::ZERO
            && rc.counter + rc.threads + rc.first_instruction <= q.start,
        "{what}: {rc:?} in {q:?}"
    );
    // The first instruction's stamp, placed on the host's clock by the
    // blank machine's counter anchor: never early, late by at most the
    // anchor's round trip. So the placement lies after the resume began
    // and at most that round trip after the host saw the stamp (a host
    // that looked at once sees it placed at its look). A stamp of another
    // clock, or an anchor read wrong, lands outside and fails here.
    assert!(
        rc.first_placed > Duration::ZERO
            && rc.first_placed <= rc.first_seen + rc.anchor_round_trip
            && rc.first_instruction <= rc.first_seen,
        "{what}: the first instruction placed at {:?} ({:?} kept), seen at {:?}, the anchor's \
         round trip {:?}",
        rc.first_placed,
        rc.first_instruction,
        rc.first_seen,
        rc.anchor_round_trip
    );
    // The session let it run for its run_after, then paused it: run on.
    to.lock().resume_vcpus().expect("it runs on");
    wait_lines(&to.lock(), 0, 5, what);
    common::check_silent(src.vm(), &mark, what);
    (to, mark.0)
}

s2mmu_arm64::linux_test! {
    /// A blank machine (a destination's before its stream) parks every CPU
    /// until it is told a state comes.
    fn a_blank_machine_parks_until_unparked() {
        let cfg = s2mmu_arm64::linux::vm::LinuxConfig {
            vcpus: 1,
            mem: s2mmu_arm64::linux::vm::MIN_MEM,
            kernel: PathBuf::new(),
            initrd: PathBuf::new(),
            cmdline: String::new(),
            echo: false,
            timeout: Duration::from_secs(60),
            dirty: Default::default(),
            ram_pages: Default::default(),
            engine: Default::default(),
        };
        let vm = LinuxVm::blank(&cfg).expect("a blank machine");
        assert!(vm.cpus_parked(), "a blank machine's CPUs are parked");
        // What a blank machine does to its RAM before a stream: the kernel
        // takes the advice over the guest's whole RAM.
        assert!(vm.ram().populate_for_writes());
        vm.unpark_cpus();
        assert!(!vm.cpus_parked());
    }
}

s2mmu_arm64::linux_test! {
    /// A one-vCPU source's service CPU parks while round 0 runs (from the
    /// session's hook after the log starts) and is awake again, with nothing
    /// left of the park, at the first harvest, a pause and the log's end; a
    /// two-vCPU source's never parks (it carries their IPIs). The host
    /// placement's: at EL2 the source's service CPU does not park.
    fn a_one_vcpu_source_parks_its_service_cpu_while_logging(a) {
        for vcpus in [1, 2] {
            let mut cfg = config(&a, vcpus);
            cfg.engine = Engine::Host;
            let vm = LinuxVm::boot(&cfg).expect("A boots");
            let src = LinuxSource::new(vm);
            let v = src.vm();
            let parked = || v.lock().cpus_parked();
            let mut bitmap = vec![0u64; (cfg.mem / 4096).div_ceil(64) as usize];
            let slot = s2mmu_arm64::linux::vm::RAM_SLOT;
            v.enable_dirty_logging().unwrap();
            src.begin_hook().unwrap();
            assert_eq!(parked(), vcpus == 1, "{vcpus} vCPUs: parked in round 0");
            v.get_dirty_log(slot, &mut bitmap).unwrap();
            assert!(!parked(), "{vcpus} vCPUs: parked after the first harvest");
            src.begin_hook().unwrap();
            src.pause();
            assert!(!parked(), "{vcpus} vCPUs: parked after a pause");
            src.resume();
            src.begin_hook().unwrap();
            v.disable_dirty_logging().unwrap();
            assert!(!parked(), "{vcpus} vCPUs: parked after the log ended");
            v.lock().shut_down().expect("the threads end cleanly");
        }
    }
}

s2mmu_arm64::linux_test! {
    /// Two vCPUs (one runs the counter, one idles in WFI): both stop at the
    /// pause with their state, and B runs both.
    fn linux_guest_with_two_vcpus_migrates(a) {
        let cfg = config(&a, 2);
        let vm_a = LinuxVm::boot(&cfg).expect("A boots");
        // A booted machine's CPUs serve its harvests and pauses: not parked.
        assert!(!vm_a.cpus_parked(), "a booted machine's CPUs are parked");
        wait_lines(&vm_a, 0, 3, "A");
        let src = LinuxSource::new(vm_a);
        let dest = Arc::new(LinuxDest::new(cfg.echo, cfg.timeout));
        let (b, a_text) = hop(&src, &dest, "A -> B, 2 vCPUs");
        let b_text = b.lock().console().contents();
        check_lives(&[&a_text, &b_text]);
        assert!(
            a_text.contains("cpus online 2"),
            "A booted 2 vCPUs:\n{a_text}"
        );
        b.lock().shut_down().expect("B's threads end cleanly");
    }
}

s2mmu_arm64::linux_test! {
    fn linux_guest_goes_there_and_back_and_restores_from_a_snapshot(a) {
        let cfg = config(&a, 1);
        let vm_a = LinuxVm::boot(&cfg).expect("A boots");
        wait_lines(&vm_a, 0, 3, "A");
        let dest = Arc::new(LinuxDest::new(cfg.echo, cfg.timeout));

        // A -> B, then B -> A's side.
        let src_a = LinuxSource::new(vm_a);
        let (b, a_text) = hop(&src_a, &dest, "A -> B");
        let src_b = LinuxSource::from_session_vm(b);
        let (a2, b_text) = hop(&src_b, &dest, "B -> A");
        drop((src_a, src_b));

        // A snapshot of the guest, paused, through the session's code.
        let dir = std::env::temp_dir().join(format!("s2mmu-linux-snap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let src = LinuxSource::from_session_vm(a2);
        src.pause();
        let saved = save_paused(&src, &dir.join("good")).expect("the snapshot");
        eprintln!("snapshot: {saved:?}");
        let a2_text = src.vm().lock().console().contents();
        src.vm()
            .lock()
            .shut_down()
            .expect("A's threads end cleanly");
        drop(src);

        refusals(&dir, &cfg);
        let d_dest = LinuxDest::new(cfg.echo, cfg.timeout);
        let d = restore_guest(&d_dest, &dir.join("good"), MAX_MEM).expect("restore into D");
        assert_eq!(
            d.slot_digests, saved.slot_digests,
            "D's memory is the snapshot's"
        );
        let d_vm = d_dest.built().expect("D");
        let d_text = wait_lines(&d_vm.lock(), 0, 5, "D");
        check_lives(&[&a_text, &b_text, &a2_text, &d_text]);
        d_vm.lock().shut_down().expect("D's threads end cleanly");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// A copy of the snapshot `dir/good` as `dir/name`, changed by `change`
/// (given the memory file and the state file).
fn damaged(dir: &Path, name: &str, change: impl FnOnce(&Path, &Path)) -> PathBuf {
    let (good, bad) = (dir.join("good"), dir.join(name));
    std::fs::create_dir_all(&bad).unwrap();
    let mem = bad.join(file_name(0));
    std::fs::copy(good.join(file_name(0)), &mem).unwrap();
    std::fs::copy(state_path(&good), state_path(&bad)).unwrap();
    change(&mem, &state_path(&bad));
    bad
}

/// A damaged snapshot and the check its refusal must pass.
type Refusal = (PathBuf, fn(&SnapshotError) -> bool);

/// Damaged and foreign snapshots are refused, naming what is wrong, with
/// no machine built for a damaged file and no vCPU run for a state the
/// guest refuses.
fn refusals(dir: &Path, cfg: &s2mmu_arm64::linux::vm::LinuxConfig) {
    let flip = |path: &Path, at: fn(u64) -> u64| {
        let mut b = std::fs::read(path).unwrap();
        let i = at(b.len() as u64) as usize;
        b[i] ^= 0x10;
        std::fs::write(path, &b).unwrap();
    };
    let cases: Vec<Refusal> = vec![
        (damaged(dir, "flipped", |m, _| flip(m, |n| n / 3)), |e| {
            matches!(e, SnapshotError::Checksum { .. })
        }),
        (
            damaged(dir, "flipped-state", |_, s| flip(s, |n| n / 2)),
            |e| matches!(e, SnapshotError::Checksum { .. }),
        ),
        (
            damaged(dir, "truncated", |m, _| {
                let f = std::fs::OpenOptions::new().write(true).open(m).unwrap();
                f.set_len(f.metadata().unwrap().len() - 4096).unwrap();
            }),
            |e| matches!(e, SnapshotError::Truncated { .. }),
        ),
        (
            // Another file format under the memory file's name.
            damaged(dir, "foreign-memory", |m, _| flip(m, |_| 0)),
            |e| matches!(e, SnapshotError::BadMagic { .. }),
        ),
        (
            // A memory file under the state file's name.
            damaged(dir, "foreign-state", |m, s| {
                std::fs::copy(m, s).unwrap();
            }),
            |e| matches!(e, SnapshotError::BadMagic { .. }),
        ),
    ];
    for (bad, want) in cases {
        let dest = LinuxDest::new(cfg.echo, cfg.timeout);
        let e = restore_guest(&dest, &bad, MAX_MEM)
            .err()
            .unwrap_or_else(|| panic!("{}: restored", bad.display()));
        eprintln!("refused: {e}");
        assert!(want(&e), "{}: refused with {e:?}", bad.display());
        assert!(e.to_string().contains(&*bad.to_string_lossy()), "{e}");
        assert!(dest.built().is_none(), "{e}: a machine was built");
    }
    // A well-formed state of another kind of VM (every checksum valid):
    // the guest's own check refuses it before any vCPU runs.
    let foreign = damaged(dir, "foreign-kind", |_, s| {
        let mut saved = read_state(s).expect("the state file reads");
        let st = State::decode(&saved.body, LINUX_KIND).expect("A's state decodes");
        let mut other = State::new(LINUX_KIND ^ 0xff);
        for t in st.tags() {
            other.push(t, st.section(t).unwrap().to_vec()).unwrap();
        }
        saved.body = other.encode();
        std::fs::remove_file(s).unwrap();
        write_state(s, &saved).expect("the foreign state file");
    });
    let dest = LinuxDest::new(cfg.echo, cfg.timeout);
    let e = restore_guest(&dest, &foreign, MAX_MEM)
        .err()
        .expect("a foreign state restored");
    eprintln!("refused: {e}");
    assert!(
        matches!(&e, SnapshotError::Guest { why, .. } if why.contains("VM kind")),
        "{e:?}"
    );
    let built = dest.built().expect("the machine built for it");
    assert_eq!(built.lock().stub_exits(), 0, "its vCPUs ran");
    assert!(built.lock().console().contents().is_empty());
}

/// The sequence check fails on a skipped step (so it can fail).
#[test]
#[should_panic(expected = "counter line 2")]
fn sequence_check_sees_a_gap() {
    let h1 = next_hash(0xcbf2_9ce4_8422_2325, 1);
    let h2 = next_hash(h1, 2);
    check_sequence(&[(1, h1), (2, h2), (4, next_hash(h2, 4))]);
}

/// The sequence check fails on a wrong hash.
#[test]
#[should_panic(expected = "its data gives")]
fn sequence_check_sees_a_wrong_hash() {
    let h1 = next_hash(0xcbf2_9ce4_8422_2325, 1);
    check_sequence(&[(1, h1), (2, h1)]);
}

/// The counter lines of a console that reports a failed self-check are
/// refused (so the check of the guest's own verdict can fail).
#[test]
#[should_panic(expected = "self-check failed")]
fn a_failed_self_check_is_seen() {
    counter_lines("s2mmu-counter: n=1 hash=1\ns2mmu-counter: FAIL at 2\n");
}
