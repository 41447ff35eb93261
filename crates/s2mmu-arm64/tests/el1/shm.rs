//! A machine leaves no guest-RAM file in /dev/shm: the file has no path
//! once it is open (QEMU opens it by this process's descriptor), so neither a drop that
//! never runs (the last machines' tables hold the RAM through deferred
//! frees that never run at exit) nor a killed process leaves it behind.

use crate::common;

/// This process's guest-RAM files in /dev/shm.
fn ram_files() -> Vec<String> {
    let prefix = format!("s2mmu-arm64-{}-", std::process::id());
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn a_running_machine_has_no_ram_file_left_to_leak() {
    let _one = common::serial();
    assert_eq!(ram_files(), Vec::<String>::new(), "before");
    let Some(m) = common::machine(2, 4 << 20) else {
        return;
    };
    m.mailbox(0)
        .command(s2mmu_arm64::layout::CMD_PING, &[])
        .unwrap();
    assert_eq!(ram_files(), Vec::<String>::new(), "while it runs");
    // The RAM stays shared with QEMU after the unlink.
    let pa = s2mmu_arm64::layout::DATA;
    m.ram().write(pa, 0x5eed);
    assert_eq!(m.ram().read(pa), 0x5eed);
    drop(m);
    assert_eq!(ram_files(), Vec::<String>::new(), "after");
}
