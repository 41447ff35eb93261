//! The host's memory: what a run may use before it allocates (a run
//! asks for no more than `MemAvailable`, so it is refused by name instead
//! of swapping or being killed), and the simulated guest's shape.

use crate::human_bytes;

/// The memory the host can give without swapping (`MemAvailable` in
/// /proc/meminfo), if it says.
pub fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Refuses a run that needs `need` bytes of memory when the host has less
/// available; `what` names the flag and its value, as the user typed it
/// (`--mem 1T`).
///
/// # Errors
/// `"{what}: needs about N of memory; the host has M available"`.
pub fn check_memory(what: &str, need: u64) -> Result<(), String> {
    match available_memory() {
        Some(have) if need > have => Err(format!(
            "{what}: needs about {} of memory; the host has {} available",
            approx_bytes(need),
            approx_bytes(have)
        )),
        _ => Ok(()),
    }
}

/// A byte count rounded to one decimal in the largest binary unit.
pub fn approx_bytes(b: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if b >= 1 << shift {
            return format!("{:.1} {unit}", b as f64 / (1u64 << shift) as f64);
        }
    }
    format!("{b} B")
}

/// The most guest memory `dirty-views` and `snapshot` simulate.
pub const MAX_GUEST_MEM: u64 = 16 << 30;

/// The simulated guest of `dirty-views` and `snapshot`: 1 to 64 vCPUs, and
/// memory a non-zero multiple of 2 MiB per vCPU, at most
/// [`MAX_GUEST_MEM`].
///
/// # Errors
/// A message naming `--vcpus` or `--mem` and its bounds.
pub fn check_guest(vcpus: usize, mem: u64) -> Result<(), String> {
    if !(1..=64).contains(&vcpus) {
        return Err(format!("--vcpus {vcpus}: must be 1..=64"));
    }
    let unit = (2 << 20) * vcpus as u64;
    if mem == 0 || !mem.is_multiple_of(unit) || mem > MAX_GUEST_MEM {
        return Err(format!(
            "--mem {mem}: must be a non-zero multiple of {} (2M per vCPU), at most {}",
            human_bytes(unit),
            human_bytes(MAX_GUEST_MEM)
        ));
    }
    Ok(())
}
