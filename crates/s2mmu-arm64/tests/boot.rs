//! The machine comes up, every CPU answers, and bad configurations are
//! refused before QEMU starts.

mod common;

use s2mmu_arm64::layout::CMD_PING;
use s2mmu_arm64::machine::{Machine, MachineConfig, MAX_DATA_BYTES};
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
        }) {
            Err(Arm64Error::Config(msg)) => eprintln!("refused: {msg}"),
            other => panic!("{cpus} CPUs, {data} bytes: {:?}", other.err()),
        }
    }
}
