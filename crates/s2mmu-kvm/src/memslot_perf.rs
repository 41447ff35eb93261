//! The KVM column of memslot-perf: the cost of memslot ioctls on a fresh VM, with the area
//! divided the way `memslot_perf_test` divides it.

use crate::error::Error;
use crate::kvm_handle::open_kvm;
use crate::memory::{Backing, GuestMemory};
use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VmFd;
use s2mmu_stats::median_duration;
use std::time::{Duration, Instant};

/// Where the test area starts (`MEM_GPA` of the selftest: 256 MiB).
pub const MEM_GPA: u64 = 256 << 20;
/// How many timed moves and deletes [`kvm_memslot_ops`] takes the median of.
pub const DEFAULT_REPETITIONS: u32 = 101;
const PAGE: u64 = 4096;

/// What [`kvm_memslot_ops`] measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvmMemslotTimes {
    /// Test slots created (ids 1..=nslots; slot 0 is reserved as in the selftest).
    pub nslots: u32,
    /// Bytes of the whole test area.
    pub total_bytes: u64,
    /// Pages in every slot but the last.
    pub pages_per_slot: u64,
    /// Pages in the last slot (it also takes the remainder).
    pub last_slot_pages: u64,
    /// `KVM_CAP_NR_MEMSLOTS`.
    pub max_memslots: u64,
    /// Creating all `nslots` slots, one `KVM_SET_USER_MEMORY_REGION` each.
    pub setup: Duration,
    /// Median of single moves of the last slot (`KVM_MR_MOVE`, alternately out past the
    /// end of the area and back).
    pub move_median: Duration,
    /// Median of single deletes of the last slot (re-created, untimed, after each).
    pub delete_median: Duration,
    /// Timed moves and timed deletes each.
    pub repetitions: u32,
}

/// How `memslot_perf_test`'s `prepare_vm` splits `total_bytes` into `nslots` slots:
/// `(pages_per_slot, last_slot_pages)`.
///
/// # Errors
/// [`Error::InvalidArgument`] when `nslots` is 0, `total_bytes` is not a multiple of
/// 4 KiB, or a slot would get no page.
pub fn split_area(nslots: u32, total_bytes: u64) -> Result<(u64, u64), Error> {
    if nslots == 0 {
        return Err(Error::invalid("nslots", "must be at least 1"));
    }
    if total_bytes == 0 || !total_bytes.is_multiple_of(PAGE) {
        return Err(Error::invalid(
            "total_bytes",
            format!("{total_bytes} is not a positive multiple of 4096"),
        ));
    }
    let pages = total_bytes / PAGE;
    let per_slot = pages / u64::from(nslots);
    if per_slot == 0 {
        return Err(Error::invalid(
            "nslots",
            format!("{nslots} slots leave no page per slot in {pages} pages"),
        ));
    }
    let last = per_slot + pages % u64::from(nslots);
    Ok((per_slot, last))
}

/// Times memslot setup, move and delete on a fresh VM with [`DEFAULT_REPETITIONS`].
///
/// # Errors
/// As [`kvm_memslot_ops_with`].
pub fn kvm_memslot_ops(nslots: u32, total_bytes: u64) -> Result<KvmMemslotTimes, Error> {
    kvm_memslot_ops_with(nslots, total_bytes, DEFAULT_REPETITIONS)
}

/// Times memslot setup, move and delete on a fresh VM, taking the median over
/// `repetitions` moves and deletes.
///
/// # Errors
/// [`Error::InvalidArgument`] for a bad split or 0 repetitions, [`Error::TooManySlots`]
/// when `nslots + 1` exceeds `KVM_CAP_NR_MEMSLOTS`, environment errors when KVM is
/// unusable, [`Error::Ioctl`] when an ioctl fails.
pub fn kvm_memslot_ops_with(
    nslots: u32,
    total_bytes: u64,
    repetitions: u32,
) -> Result<KvmMemslotTimes, Error> {
    let (pages_per_slot, last_slot_pages) = split_area(nslots, total_bytes)?;
    if repetitions == 0 {
        return Err(Error::invalid("repetitions", "must be at least 1"));
    }
    let kvm = open_kvm()?;
    let max_memslots = kvm.get_nr_memslots() as u64;
    if u64::from(nslots) + 1 > max_memslots {
        return Err(Error::TooManySlots {
            requested: u64::from(nslots),
            max: max_memslots,
        });
    }
    let memory = GuestMemory::new(total_bytes, Backing::Anonymous)?;
    let vm = kvm
        .create_vm()
        .map_err(|e| Error::from_errno("KVM_CREATE_VM", e))?;
    let region = |index: u32| {
        let offset = u64::from(index) * pages_per_slot * PAGE;
        let pages = if index + 1 == nslots {
            last_slot_pages
        } else {
            pages_per_slot
        };
        kvm_userspace_memory_region {
            slot: index + 1,
            flags: 0,
            guest_phys_addr: MEM_GPA + offset,
            memory_size: pages * PAGE,
            userspace_addr: memory.host_addr() + offset,
        }
    };

    let t = Instant::now();
    for index in 0..nslots {
        set_region(&vm, region(index))?;
    }
    let setup = t.elapsed();

    let last = region(nslots - 1);
    let moves = time_moves(&vm, last, MEM_GPA + total_bytes, repetitions)?;
    let deletes = time_deletes(&vm, last, repetitions)?;
    drop(vm);
    drop(memory);
    Ok(KvmMemslotTimes {
        nslots,
        total_bytes,
        pages_per_slot,
        last_slot_pages,
        max_memslots,
        setup,
        move_median: median_duration(&moves).unwrap_or_default(),
        delete_median: median_duration(&deletes).unwrap_or_default(),
        repetitions,
    })
}

/// Moves the `last` slot to `moved_gpa` and back, `repetitions` moves in all, timing
/// each; the slot ends where it started.
fn time_moves(
    vm: &VmFd,
    last: kvm_userspace_memory_region,
    moved_gpa: u64,
    repetitions: u32,
) -> Result<Vec<Duration>, Error> {
    let moved = kvm_userspace_memory_region {
        guest_phys_addr: moved_gpa,
        ..last
    };
    let mut moves = Vec::with_capacity(repetitions as usize);
    for rep in 0..repetitions {
        let target = if rep % 2 == 0 { moved } else { last };
        let t = Instant::now();
        set_region(vm, target)?;
        moves.push(t.elapsed());
    }
    if repetitions % 2 == 1 {
        set_region(vm, last)?;
    }
    Ok(moves)
}

/// Deletes the `last` slot and puts it back, `repetitions` times, timing each delete.
fn time_deletes(
    vm: &VmFd,
    last: kvm_userspace_memory_region,
    repetitions: u32,
) -> Result<Vec<Duration>, Error> {
    let deleted = kvm_userspace_memory_region {
        memory_size: 0,
        ..last
    };
    let mut deletes = Vec::with_capacity(repetitions as usize);
    for _ in 0..repetitions {
        let t = Instant::now();
        set_region(vm, deleted)?;
        deletes.push(t.elapsed());
        set_region(vm, last)?;
    }
    Ok(deletes)
}

fn set_region(vm: &VmFd, region: kvm_userspace_memory_region) -> Result<(), Error> {
    // SAFETY: every region handed here lies inside the `GuestMemory` mapping owned by
    // `kvm_memslot_ops_with`, which drops the VM before the mapping.
    unsafe { vm.set_user_memory_region(region) }
        .map_err(|e| Error::from_errno("KVM_SET_USER_MEMORY_REGION", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_like_memslot_perf_test() {
        // 512 MiB + 4 KiB over 32763 slots: 4 pages each, remainder to the last.
        let pages = ((512 << 20) + 4096) / 4096;
        let (per, last) = split_area(32763, (512 << 20) + 4096).unwrap();
        assert_eq!(per, pages / 32763);
        assert_eq!(last, per + pages % 32763);
        assert_eq!(split_area(4, 16 * 4096).unwrap(), (4, 4));
        assert!(split_area(0, 4096).is_err());
        assert!(split_area(2, 4096).is_err());
        assert!(split_area(1, 4095).is_err());
    }

    #[test]
    fn rejects_bad_arguments_before_touching_kvm() {
        assert!(matches!(
            kvm_memslot_ops_with(1, 4096, 0),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            kvm_memslot_ops(0, 4096),
            Err(Error::InvalidArgument { .. })
        ));
    }
}
