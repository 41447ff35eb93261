//! What a split run may ask for: the slot's place and size, the runs,
//! checked against the format and the host's memory before anything is
//! allocated.

use crate::human_bytes;
use s2mmu::PteFormat;

/// Where the slot sits in the IPA space.
pub const BASE: u64 = 1 << 40;

/// The largest slot: the 48-bit IPA space above where the cases map it.
pub const MAX_SIZE: u64 = (1 << 48) - BASE;

/// Checks a run's slot size and runs against the format `fmt` (the size a
/// non-zero multiple of its largest block, at most [`MAX_SIZE`]) and the
/// host's memory, before anything is allocated.
///
/// # Errors
/// A message naming the flag (the setting of the same name) and its limit.
pub fn check<F: PteFormat>(fmt: &F, size: u64, runs: usize) -> Result<(), String> {
    let top_block = if fmt.leaf_allowed(1) {
        fmt.granule(1)
    } else {
        fmt.granule(2)
    };
    if size == 0 || !size.is_multiple_of(top_block) {
        return Err(format!(
            "--mem {}: must be a non-zero multiple of {} (the largest block of this granule)",
            human_bytes(size),
            human_bytes(top_block)
        ));
    }
    if size > MAX_SIZE {
        return Err(format!(
            "--mem {}: at most {} (the 48-bit IPA space above the slot's base)",
            human_bytes(size),
            human_bytes(MAX_SIZE)
        ));
    }
    if runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    // Split to pages, the slot takes one last-level table entry (8 bytes)
    // per page. At the peak a table split to pages, a cache holding as many
    // pages again and the floor's tables are live: allow four times.
    let entries = size / fmt.page_size();
    let need = entries.saturating_mul(8).saturating_mul(4);
    crate::host::check_memory(&format!("--mem {}", human_bytes(size)), need)?;
    Ok(())
}
