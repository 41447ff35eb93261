//! The machine comes up, every CPU answers, and bad configurations are
//! refused before QEMU starts.

use crate::common;

use s2mmu_arm64::layout::{mb, CMD_PING, CMD_TLBI, IDLE_BACKOFF_SHIFT, IDLE_SHORT_WAITS};
use s2mmu_arm64::linux::vcpu_state::CMD_STATE;
use s2mmu_arm64::machine::{Machine, MachineConfig, Mailbox, MAX_DATA_BYTES, MAX_PARK};
use s2mmu_arm64::Arm64Error;

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn boots_and_answers_pings() {
    let _one = common::serial();
    let Some(m) = common::machine(3, 64 << 20) else {
        return;
    };
    for cpu in 0..3 {
        let freq = m.mailbox(cpu).command(CMD_PING, &[]).unwrap();
        assert_ne!(freq, 0, "CPU {cpu} reports CNTFRQ_EL0");
    }
    let t = std::time::Instant::now();
    for _ in 0..1000 {
        m.mailbox(1).command(CMD_PING, &[]).unwrap();
    }
    eprintln!("1000 mailbox round trips: {:?}", t.elapsed());
}

/// The idle waits `mbox`'s CPU makes over a window of 300 ms, and on until
/// a wait ended (a loaded machine need not run QEMU's CPU thread within a
/// fixed time; 60 s: a hang), with the window's own length in counter
/// ticks at `freq`, which the callers' bounds are over.
fn idle_window(mbox: &Mailbox<'_>, freq: u64, who: &str) -> (u64, u64) {
    let t = std::time::Instant::now();
    let before = mbox.read(mb::IDLE_WAITS);
    let mut waits = 0;
    while t.elapsed() < std::time::Duration::from_millis(300) || waits == 0 {
        assert!(t.elapsed().as_secs() < 60, "{who}: no idle wait in 60 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
        waits = mbox.read(mb::IDLE_WAITS) - before;
    }
    let elapsed = (t.elapsed().as_nanos() * u128::from(freq) / 1_000_000_000) as u64;
    (waits, elapsed)
}

/// A parked CPU (a blank destination's, `Mailbox::park`) backs off
/// past the usual 640 µs to the park's wait: over an idle window it wakes
/// at most the short waits, the ramp to the park and one per park wait
/// (the stub without the park read makes about 470 in 300 ms, far above
/// the bound of about 140), and it still picks a command up. A park above
/// `MAX_PARK` is refused and changes nothing.
#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn a_parked_cpu_waits_longer_and_still_answers() {
    let _one = common::serial();
    let Some(m) = common::machine(2, 64 << 20) else {
        return;
    };
    let mbox = m.mailbox(1);
    let freq = mbox.command(CMD_PING, &[]).unwrap();
    let e = mbox.park(MAX_PARK * 2).expect_err("a park above MAX_PARK");
    assert!(matches!(e, Arm64Error::Config(_)), "{e:?}");
    assert_eq!(mbox.read(mb::PARK_TICKS), 0, "a refused park changed it");
    let park = std::time::Duration::from_millis(5);
    mbox.park(park).unwrap();
    let park_ticks = mbox.read(mb::PARK_TICKS);
    assert_eq!(park_ticks, freq / 200, "5 ms in counter ticks");
    // A command restarts the CPU's back-off: it ramps up to the park.
    mbox.command(CMD_PING, &[]).unwrap();
    let (waits, elapsed) = idle_window(&mbox, freq, "parked CPU");
    let ramp = u64::from((park_ticks / mbox.read(mb::IDLE_TICKS)).ilog2()) + 1;
    let bound = IDLE_SHORT_WAITS + ramp + elapsed / park_ticks + 2;
    eprintln!("parked CPU: {waits} idle waits in {elapsed} ticks (at most {bound})");
    assert!(
        waits <= bound,
        "{waits} waits in {elapsed} ticks: more than {bound}"
    );
    assert_eq!(mbox.command(CMD_PING, &[]).unwrap(), freq, "it answers");
    mbox.unpark();
    assert_eq!(mbox.read(mb::PARK_TICKS), 0);
    assert_eq!(
        m.mailbox(0).read(mb::PARK_TICKS),
        0,
        "CPU 0 was never parked"
    );
}

/// The host's bell ends a parked CPU's wait at once: with the CPU parked
/// for `MAX_PARK` (100 ms) and the bell routed to it, each of 5 commands,
/// posted and rung just as a whole 100 ms wait has begun, is picked up
/// (the stub's pickup stamp) within a quarter of the park of the counter
/// read just before it on the other CPU; without the bell each waits out
/// that wait (about 100 ms: the check fails every time). The stub took
/// exactly the bytes rung; a CPU the bell is not routed to takes none.
#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn the_bell_ends_a_parked_wait() {
    let _one = common::serial();
    let Some(m) = common::machine(2, 64 << 20) else {
        return;
    };
    let (other, parked) = (m.mailbox(0), m.mailbox(1));
    assert!(!m.ring_in(), "no CPU has the bell yet: nothing is written");
    parked.route_bell_in().unwrap();
    let freq = parked.command(CMD_PING, &[]).unwrap();
    parked.park(MAX_PARK).unwrap();
    let park_ticks = parked.read(mb::PARK_TICKS);
    for i in 0..5 {
        wait_for_a_long_wait(&parked);
        let before = other.command(CMD_STATE, &[0, 0, 0, 0]).unwrap();
        assert_eq!(parked.command_ringing(CMD_PING, &[]).unwrap(), freq);
        let waited = parked.read(mb::T_PICKUP).saturating_sub(before);
        eprintln!(
            "command {i}: picked up {waited} ticks after the counter read (park {park_ticks})"
        );
        assert!(
            waited < park_ticks / 4,
            "command {i} waited {waited} ticks of a {park_ticks}-tick park"
        );
    }
    assert_eq!(m.bells_rung_in(), 5);
    assert_eq!(parked.bells_in(), 5, "the stub took each byte once");
    assert_eq!(other.bells_in(), 0, "CPU 0 has no bell");
}

/// A kick to a CPU in its command loop, outside any guest, ends its parked
/// wait (a restore's command is then picked up at once) and is taken there:
/// its SGI no longer stays pending, which made every later WFI of the
/// loop return at once (hundreds of thousands of idle waits a second, a
/// spinning QEMU thread, where an idle CPU makes a few thousand at most).
#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn a_kick_outside_the_guest_ends_a_parked_wait_and_is_taken() {
    let _one = common::serial();
    let Some(m) = common::machine(2, 64 << 20) else {
        return;
    };
    let sink = s2mmu_arm64::tlbi::HypSink::new(m.clone(), 1);
    let (parked, service) = (m.mailbox(0), m.mailbox(1));
    let freq = parked.command(CMD_PING, &[]).unwrap();
    parked.park(MAX_PARK).unwrap();
    let park_ticks = parked.read(mb::PARK_TICKS);
    wait_for_a_long_wait(&parked);
    let before = service.command(CMD_STATE, &[0, 0, 0, 0]).unwrap();
    let seq = parked.post(CMD_PING, &[]);
    sink.kick(0);
    let t0 = std::time::Instant::now();
    while !parked.done(seq) {
        assert!(t0.elapsed().as_secs() < 10, "the PING was never picked up");
        std::thread::yield_now();
    }
    assert_eq!(parked.read(mb::RET), freq);
    let waited = parked.read(mb::T_PICKUP).saturating_sub(before);
    eprintln!("picked up {waited} ticks after the counter read (park {park_ticks})");
    assert!(
        waited < park_ticks / 4,
        "the kicked CPU waited {waited} ticks of a {park_ticks}-tick park"
    );
    assert_eq!(
        parked.read(mb::KICKS_TAKEN),
        1,
        "the kick was taken in the loop"
    );
    parked.unpark();
    let w0 = parked.read(mb::IDLE_WAITS);
    std::thread::sleep(std::time::Duration::from_millis(200));
    let waits = parked.read(mb::IDLE_WAITS) - w0;
    eprintln!("{waits} idle waits in 200 ms after the kick");
    assert!(
        waits < 2_000,
        "{waits} idle waits in 200 ms: the kick is still pending"
    );
}

/// Returns just after `mbox`'s CPU, parked for `MAX_PARK`, has begun a
/// whole park-long wait: one idle wait ended at least 80 ms after the one
/// before (past the back-off's ramp, which doubles from 20 µs).
fn wait_for_a_long_wait(mbox: &Mailbox<'_>) {
    let t0 = std::time::Instant::now();
    let (mut waits, mut at) = (mbox.read(mb::IDLE_WAITS), t0);
    loop {
        assert!(t0.elapsed().as_secs() < 10, "no long idle wait in 10 s");
        std::thread::sleep(std::time::Duration::from_micros(100));
        let now = mbox.read(mb::IDLE_WAITS);
        if now != waits {
            if at.elapsed().as_millis() >= 80 {
                return;
            }
            (waits, at) = (now, std::time::Instant::now());
        }
    }
}

/// A CPU with no command makes `IDLE_SHORT_WAITS` waits of 20 µs, then
/// backs off to 20 µs << `IDLE_BACKOFF_SHIFT` (640 µs): over an idle window
/// it wakes at most the short waits and the ramp's plus one per longest wait (a wait cannot end before its
/// timer, so load only lowers the count; a fixed 20 µs wait made up to 32
/// times as many), and a command after the idle is served.
#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn idle_cpus_back_off_their_timer_waits() {
    let _one = common::serial();
    let Some(m) = common::machine(2, 64 << 20) else {
        return;
    };
    for cpu in 0..2 {
        let mbox = m.mailbox(cpu);
        let freq = mbox.command(CMD_PING, &[]).unwrap();
        let tick = mbox.read(mb::IDLE_TICKS);
        assert_eq!(tick, freq / 50_000, "CPU {cpu}: the shortest wait is 20 µs");
        let longest = tick << IDLE_BACKOFF_SHIFT;
        let (waits, elapsed) = idle_window(&mbox, freq, &format!("CPU {cpu}"));
        // The short waits, the ramp (40 to 320 µs), one wait per longest,
        // and the waits in flight at either end of the window.
        let bound = IDLE_SHORT_WAITS + u64::from(IDLE_BACKOFF_SHIFT) + elapsed / longest + 2;
        eprintln!("CPU {cpu}: {waits} idle waits in {elapsed} ticks (at most {bound})");
        assert!(waits > 0, "CPU {cpu}: an idle CPU waits on its timer");
        assert!(
            waits <= bound,
            "CPU {cpu}: {waits} idle waits in {elapsed} ticks, more than {bound}"
        );
        assert_eq!(mbox.command(CMD_PING, &[]).unwrap(), freq, "CPU {cpu}");
    }
}

/// The stub stamps its counter when it picks a command up and when it
/// finishes it: after an idle gap (the CPU backed off to its longest wait)
/// a TLBI command's own time is there, no longer than the host's wait
/// around it, and the next command's pickup comes after this one's end.
#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn commands_are_stamped_at_pickup_and_end() {
    let _one = common::serial();
    let Some(m) = common::machine(2, 64 << 20) else {
        return;
    };
    let mbox = m.mailbox(1);
    let freq = mbox.command(CMD_PING, &[]).unwrap();
    assert_eq!(mbox.read(mb::CNTFRQ), freq, "the stub publishes CNTFRQ_EL0");
    // DSB ISHST, 64 x TLBI VMALLS12E1IS, DSB ISH.
    let mut insns = vec![(1, 0)];
    insns.extend(std::iter::repeat_n((0x15, 0), 64));
    insns.push((2, 0));
    let mut last_done = mbox.read(mb::T_DONE);
    for gap_ms in [0, 50] {
        std::thread::sleep(std::time::Duration::from_millis(gap_ms));
        mbox.set_cmd_insns(&insns);
        let t = std::time::Instant::now();
        assert_eq!(
            mbox.command(CMD_TLBI, &[insns.len() as u64, 0, 0]).unwrap(),
            0
        );
        let total = t.elapsed();
        let (picked, done) = (mbox.read(mb::T_PICKUP), mbox.read(mb::T_DONE));
        assert!(
            picked > last_done,
            "gap {gap_ms} ms: picked up at {picked}, the last command ended at {last_done}"
        );
        assert!(
            done > picked,
            "gap {gap_ms} ms: ended at {done}, picked up at {picked}"
        );
        let work = mbox.last_command_time().expect("stamped");
        eprintln!("gap {gap_ms} ms: the stub's work {work:?} of the host's {total:?}");
        assert!(
            work <= total,
            "gap {gap_ms} ms: work {work:?} longer than the round trip {total:?}"
        );
        last_done = done;
    }
}

#[test]
fn bad_configurations_are_refused_before_qemu_starts() {
    for (cpus, data) in [
        (1, 2 << 20),
        (9, 2 << 20),
        (2, 0),
        (2, 4096),
        (2, MAX_DATA_BYTES + (2 << 20)),
    ] {
        match Machine::start(&MachineConfig {
            cpus,
            data_bytes: data,
            ram_pages: Default::default(),
        }) {
            Err(Arm64Error::Config(msg)) => eprintln!("refused: {msg}"),
            other => panic!("{cpus} CPUs, {data} bytes: {:?}", other.err()),
        }
    }
}
