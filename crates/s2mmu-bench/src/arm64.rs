//! What the `--arm64` modes share: the model's limits (checked before QEMU
//! starts), starting a machine, and the note that its timings are an
//! emulator's.

use crate::human_bytes;
use s2mmu_arm64::layout;
use s2mmu_arm64::machine::{Machine, MachineConfig, RamPages, MAX_DATA_BYTES};
use std::sync::Arc;

/// Printed with every `--arm64` result.
pub const EMULATOR_NOTE: &str = "note: QEMU timings are an emulator's (TCG translates guest code to host code), not hardware figures: read the counts and the ratios";

/// Most guest vCPUs: QEMU's CPUs (the stub's limit) less the service CPU.
pub const MAX_VCPUS: usize = layout::MAX_CPUS - 1;

/// Most bytes of guest data a machine may have.
pub const MAX_BYTES: u64 = MAX_DATA_BYTES;

/// Why the arm64 model cannot run here, if it cannot.
pub fn unavailable() -> Option<String> {
    s2mmu_arm64::available().err()
}

/// Bytes free on the tmpfs that backs the machine's RAM (`/dev/shm`), if
/// it can be read.
pub fn shm_free() -> Option<u64> {
    let path = c"/dev/shm";
    // SAFETY: `statvfs` fills the zeroed struct we own from a NUL-terminated
    // path; nothing else is touched.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut st) };
    (rc == 0).then(|| (st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// Refuses `bytes` of guest data the guest will touch when `/dev/shm`
/// cannot hold them (QEMU would die of SIGBUS half way through).
///
/// # Errors
/// A message naming `flag` and the limit.
pub fn check_touched(flag: &str, bytes: u64) -> Result<(), String> {
    if let Some(free) = shm_free() {
        // Leave room for the tables and the fixed part of RAM.
        let room = free.saturating_sub(1 << 30);
        if bytes > room {
            return Err(format!(
                "{flag}: the guest writes {} but /dev/shm (which backs the arm64 model's RAM) has {} free; at most {} here",
                human_bytes(bytes),
                human_bytes(free),
                human_bytes(room & !((2 << 20) - 1))
            ));
        }
    }
    Ok(())
}

/// Starts QEMU with `cpus` CPUs (the last serves maintenance) and
/// `data_bytes` of guest data (rounded up to 2 MiB).
///
/// # Errors
/// The model's error, as text.
pub fn start(cpus: usize, data_bytes: u64) -> Result<Arc<Machine>, String> {
    let data_bytes = data_bytes
        .checked_next_multiple_of(2 << 20)
        .ok_or_else(|| format!("{data_bytes} bytes of guest data: more than 64 bits"))?;
    // 4 KiB pages: the benchmarks map large sparse slots and touch a
    // few pages of them; 2 MiB pages would take 512 times the memory.
    Machine::start(&MachineConfig {
        cpus,
        data_bytes,
        ram_pages: RamPages::Shm,
    })
    .map(Arc::new)
    .map_err(|e| e.to_string())
}

/// The table arena of a VM: all the space the layout gives it (the RAM
/// file is sparse, so only table pages in use take memory).
pub const TABLE_BYTES: u64 = layout::DATA - layout::TABLES;
