//! What the host machine offers, read where a size from a caller must be
//! checked against it before anything is allocated.

/// Bytes of memory this host has available (`MemAvailable` of
/// `/proc/meminfo`), if known.
pub(crate) fn available_memory() -> Option<u64> {
    let m = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}
