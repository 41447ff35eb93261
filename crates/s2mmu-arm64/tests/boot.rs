use s2mmu_arm64::layout::CMD_PING;
use s2mmu_arm64::machine::{Machine, MachineConfig};

#[test]
fn boots_and_answers_pings() {
    if let Err(why) = s2mmu_arm64::available() {
        eprintln!("skipped: {why}");
        return;
    }
    let m = Machine::start(&MachineConfig {
        cpus: 3,
        data_bytes: 64 << 20,
    })
    .unwrap();
    for cpu in 0..3 {
        assert_ne!(
            m.mailbox(cpu).command(CMD_PING, &[]).unwrap(),
            0,
            "CNTFRQ_EL0 is set"
        );
    }
    let t = std::time::Instant::now();
    for _ in 0..1000 {
        m.mailbox(1).command(CMD_PING, &[]).unwrap();
    }
    eprintln!("1000 pings: {:?}", t.elapsed());
}
