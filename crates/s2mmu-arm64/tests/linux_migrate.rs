//! A running Linux guest moves between QEMU machines and goes on: machine
//! A boots Debian's kernel running the guest program `counter` (a counter
//! that only grows and a running hash of its own data), is migrated in
//! this process to machine B, back to A, then snapshotted and restored
//! into a fresh machine D. Every console line of every machine, joined in
//! the order the guest lived, must be the counter's exact sequence (each
//! n once, each hash the one its data gives), and A's guest must not run
//! while B runs it. Damaged and foreign state is refused by name before a
//! destination runs.

mod common;

use common::counter::{check_lives, check_sequence, config, counter_lines, next_hash, wait_lines};
use s2mmu_arm64::linux::migrate::LinuxVm;
use s2mmu_arm64::linux::vm_state::LINUX_KIND;
use s2mmu_migrate::driver::{self, Policy};
use s2mmu_migrate::state::State;
use s2mmu_migrate::{snapshot, MigratableVm, MigrateError, Pausable, VmError, PAGE_SIZE};

/// Two vCPUs (one runs the counter, one idles in WFI): both stop at the
/// pause with their state, and B runs both.
#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn linux_guest_with_two_vcpus_migrates() {
    let _one = common::serial();
    let Some(a) = common::linux_assets() else {
        return;
    };
    let cfg = config(&a, 2);
    let mut vm_a = LinuxVm::boot(&cfg).expect("A boots");
    wait_lines(&vm_a, 0, 3, "A");
    let mut vm_b = LinuxVm::blank(&cfg).expect("B starts");
    let r = driver::migrate(&mut vm_a, &mut vm_b, &Policy::default()).expect("A -> B");
    eprintln!("A -> B, 2 vCPUs: {r:?}");
    let a_text = vm_a.console().contents();
    let b1 = wait_lines(&vm_b, 0, 5, "B");
    check_lives(&[&a_text, &b1]);
    assert!(
        a_text.contains("cpus online 2"),
        "A booted 2 vCPUs:\n{a_text}"
    );
    vm_b.shut_down().expect("B's threads end cleanly");
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn linux_guest_migrates_and_goes_on() {
    let _one = common::serial();
    let Some(a) = common::linux_assets() else {
        return;
    };
    let cfg = config(&a, 1);
    let mut vm_a = LinuxVm::boot(&cfg).expect("A boots");
    let a1 = wait_lines(&vm_a, 0, 3, "A");
    eprintln!("A runs the counter: {} lines", counter_lines(&a1).len());

    // A migration that loses a harvest fails at the digest, before
    // the destination runs, and A's guest goes on.
    let mut vm_c = LinuxVm::blank(&cfg).expect("C starts");
    let mut lossy = LoseHarvests(&mut vm_a, 0);
    let e = driver::migrate(&mut lossy, &mut vm_c, &Policy::default())
        .expect_err("a migration that lost pages");
    assert!(lossy.1 > 0, "the harvests found no page to lose");
    assert!(matches!(e, MigrateError::DigestMismatch { .. }), "{e}");
    drop(vm_c);
    let n0 = counter_lines(&vm_a.console().contents()).len();
    wait_lines(&vm_a, 0, n0 + 2, "A after the failed migration");

    // A -> B.
    let mut vm_b = LinuxVm::blank(&cfg).expect("B starts");
    let r = driver::migrate(&mut vm_a, &mut vm_b, &Policy::default()).expect("A -> B");
    eprintln!("A -> B: {r:?}");
    let a_text = vm_a.console().contents();
    let a_exits = vm_a.stub_exits();
    let b1 = wait_lines(&vm_b, 0, 5, "B");
    check_lives(&[&a_text, &b1]);
    assert_eq!(
        vm_a.console().contents(),
        a_text,
        "A's guest printed after the switch"
    );
    assert_eq!(vm_a.stub_exits(), a_exits, "A's guest ran after the switch");

    // B -> A (A's machine takes the guest back).
    let r = driver::migrate(&mut vm_b, &mut vm_a, &Policy::default()).expect("B -> A");
    eprintln!("B -> A: {r:?}");
    let b_text = vm_b.console().contents();
    let a2 = wait_lines(&vm_a, a_text.len(), 5, "A again");
    check_lives(&[&a_text, &b_text, &a2]);
    assert_eq!(
        vm_b.console().contents(),
        b_text,
        "B's guest printed after the switch"
    );
    vm_b.shut_down().expect("B's threads end cleanly");
    drop(vm_b);

    // A snapshot of A restored into a fresh machine D; damaged or foreign
    // state refused by name first, D unchanged.
    let dir = std::env::temp_dir().join(format!("s2mmu-linux-snap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let snap = dir.join("linux.snap");
    let info = snapshot::save(&mut vm_a, &snap).expect("snapshot of A");
    eprintln!("snapshot: {info:?}");
    // The guest's life so far: A, B, A again.
    let a_again = vm_a.console().contents()[a_text.len()..].to_string();
    let good_state = vm_a.save_state().expect("A's state");
    drop(vm_a);
    let mut vm_d = LinuxVm::blank(&cfg).expect("D starts");
    refusals(&mut vm_d, &snap, &good_state);
    let got = snapshot::restore(&mut vm_d, &snap).expect("restore into D");
    assert_eq!(got.digest, info.digest, "D's memory is the snapshot's");
    vm_d.resume().expect("D resumes");
    let d1 = wait_lines(&vm_d, 0, 5, "D");
    check_lives(&[&a_text, &b_text, &a_again, &d1]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A source whose harvests are all emptied: the pages the guest wrote
/// after round 0 copied them are never copied again (fault injection for
/// the digest check; the counter writes its buffer every step, and round
/// 0 is followed by a wait of three steps).
struct LoseHarvests<'a>(&'a mut LinuxVm, u32);

impl Pausable for LoseHarvests<'_> {
    fn pause(&mut self) -> Result<(), VmError> {
        self.0.pause()
    }
    fn resume(&mut self) -> Result<(), VmError> {
        self.0.resume()
    }
}

impl MigratableVm for LoseHarvests<'_> {
    fn page_count(&self) -> u64 {
        self.0.page_count()
    }
    fn start_dirty_log(&mut self) -> Result<(), VmError> {
        self.0.start_dirty_log()
    }
    fn harvest_dirty(&mut self, out: &mut Vec<u64>) -> Result<(), VmError> {
        if self.1 == 0 {
            // The counter steps (rewriting its buffer) at least once after
            // round 0 copied it, however fast round 0 was.
            std::thread::sleep(std::time::Duration::from_millis(3 * common::counter::MS));
        }
        let n = out.len();
        self.0.harvest_dirty(out)?;
        self.1 += (out.len() - n) as u32;
        out.truncate(n);
        Ok(())
    }
    fn stop_dirty_log(&mut self) -> Result<(), VmError> {
        self.0.stop_dirty_log()
    }
    fn read_page(&self, page: u64, buf: &mut [u8; PAGE_SIZE]) -> Result<(), VmError> {
        self.0.read_page(page, buf)
    }
    fn write_page(&mut self, page: u64, data: &[u8; PAGE_SIZE]) -> Result<(), VmError> {
        self.0.write_page(page, data)
    }
    fn save_state(&mut self) -> Result<Vec<u8>, VmError> {
        self.0.save_state()
    }
    fn restore_state(&mut self, state: &[u8]) -> Result<(), VmError> {
        self.0.restore_state(state)
    }
    fn memory_digest(&self) -> Result<u64, VmError> {
        self.0.memory_digest()
    }
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

/// Damaged and foreign states are refused, naming what is wrong.
fn refusals(vm: &mut LinuxVm, snap: &std::path::Path, good: &[u8]) {
    let refuse = |vm: &mut LinuxVm, bytes: &[u8], want: &str| {
        let e = vm.restore_state(bytes).expect_err(want).to_string();
        assert!(e.contains(want), "refusal {e:?} does not say {want:?}");
    };
    let mut flipped = good.to_vec();
    flipped[good.len() / 2] ^= 0x10;
    refuse(vm, &flipped, "checksum");
    let mut version = good.to_vec();
    version[8] = 9;
    refuse(vm, &version, "version 9");
    let mut kind = good.to_vec();
    kind[12] ^= 1;
    refuse(vm, &kind, "checksum");
    // A well-formed state of another kind of VM (checksum valid).
    let st = State::decode(good, LINUX_KIND).expect("A's state decodes");
    let mut foreign = State::new(LINUX_KIND ^ 0xff);
    for t in st.tags() {
        foreign.push(t, st.section(t).unwrap().to_vec()).unwrap();
    }
    refuse(vm, &foreign.encode(), "VM kind");
    let before = vm.memory_digest().expect("D's digest");
    refuse(vm, &good[..good.len() - 3], "checksum");
    // A damaged snapshot file: one byte in the memory part.
    let bad = snap.with_extension("bad");
    let mut b = std::fs::read(snap).unwrap();
    let mid = b.len() / 3;
    b[mid] ^= 0x01;
    std::fs::write(&bad, &b).unwrap();
    match snapshot::restore(vm, &bad) {
        Err(MigrateError::State(e)) => assert!(e.to_string().contains("checksum"), "{e}"),
        other => panic!("damaged snapshot: {other:?}"),
    }
    assert_eq!(
        vm.memory_digest().expect("D's digest"),
        before,
        "a refused snapshot changed D"
    );
}
