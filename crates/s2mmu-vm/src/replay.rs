//! The writes a workload's vCPU made between two of its saved states,
//! recomputed: what a migration's source needs to check a destination
//! whose guest ran on after the resume (its memory must be the source's
//! at the stop plus exactly these writes).

use crate::workload::{stamp, Pattern, Rng, VcpuState, WorkloadConfig};

/// `(pass, next access)` with a finished pass written as the next one's
/// start, as the vCPU saves either.
fn normalized(s: VcpuState, pages: u64) -> (u64, u64) {
    if s.next_page >= pages {
        (s.pass + 1, 0)
    } else {
        (s.pass, s.next_page)
    }
}

/// Calls `write(gpa, value)` for every guest write vCPU `vcpu` of a
/// workload with `cfg` (its region starting at `base`) made from state
/// `from` to state `to`, in order, and returns how many there were. A
/// sequential all-writes workload is replayed from its last full region's
/// worth of accesses only (each page's last value is all that the region
/// keeps; the skipped writes are counted, not called). At most
/// `max_accesses` accesses are replayed.
///
/// # Errors
/// A message when `to` is not a state the vCPU can reach from `from`:
/// before it, more than `max_accesses` accesses after it, or with a
/// generator state or write count the replay does not arrive at.
pub fn replay_writes(
    cfg: &WorkloadConfig,
    vcpu: usize,
    base: u64,
    from: VcpuState,
    to: VcpuState,
    max_accesses: u64,
    mut write: impl FnMut(u64, u64),
) -> Result<u64, String> {
    let pages = cfg.bytes_per_vcpu / cfg.page_size.max(1);
    if pages == 0 || from.pass == 0 || to.pass == 0 {
        return Err(format!(
            "vCPU {vcpu}: states at pass {} and {} of a {pages}-page region",
            from.pass, to.pass
        ));
    }
    let (a, b) = (normalized(from, pages), normalized(to, pages));
    let accesses = (b.0 as u128 * pages as u128 + b.1 as u128)
        .checked_sub(a.0 as u128 * pages as u128 + a.1 as u128)
        .ok_or_else(|| {
            format!(
                "vCPU {vcpu}: state (pass {}, access {}) is before (pass {}, access {})",
                b.0, b.1, a.0, a.1
            )
        })?;
    let random = cfg.pattern == Pattern::Random;
    let wp = u64::from(cfg.write_percent);
    // Sequential and all writes: the generator is not used and every
    // access writes, so the last `pages` accesses decide the region.
    let skipped = if !random && wp >= 100 {
        accesses.saturating_sub(u128::from(pages))
    } else {
        0
    };
    let accesses = accesses - skipped;
    if accesses > u128::from(max_accesses) {
        return Err(format!(
            "vCPU {vcpu}: {accesses} accesses between the states, more than the {max_accesses} allowed"
        ));
    }
    let mut rng = Rng(from.rng);
    let start = a.0 as u128 * pages as u128 + a.1 as u128 + skipped;
    let (mut pass, mut i) = (
        (start / u128::from(pages)) as u64,
        (start % u128::from(pages)) as u64,
    );
    let mut writes = skipped as u64;
    while (pass, i) != b {
        let page = if random { rng.next() % pages } else { i };
        if wp >= 100 || rng.next() % 100 < wp {
            write(base + page * cfg.page_size, stamp(vcpu, pass, page));
            writes += 1;
        }
        i += 1;
        if i == pages {
            (pass, i) = (pass + 1, 0);
        }
    }
    if rng.0 != to.rng || from.writes.checked_add(writes) != Some(to.writes) {
        return Err(format!(
            "vCPU {vcpu}: the replay made {writes} writes and left the generator at {:#x}; the state says {} writes and {:#x}",
            rng.0,
            to.writes.wrapping_sub(from.writes),
            to.rng
        ));
    }
    Ok(writes)
}
