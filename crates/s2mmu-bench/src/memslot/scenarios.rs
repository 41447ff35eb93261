//! The selftest's scenarios and the single slot operations, each timed on a
//! prepared VM (the measuring part).

use super::*;
use s2mmu::Gfn;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Map: the guest writes one word per page of one half while the host discards the other.
pub(super) fn scenario_map<S: MemslotStore>(
    vm: &Vm<S>,
    seconds: Duration,
) -> Result<(u64, Duration), String> {
    let half = vm.pages / 2;
    vm.run_loop(
        seconds,
        |vm| {
            let write = |vm: &Vm<S>, cache: &mut VcpuSlotCache, pages: std::ops::Range<u64>| {
                for page in pages {
                    vm.guest_access::<0>(cache, vm.base_gfn() + page, Some(VAL_1));
                }
            };
            vm.in_turns(
                |vm, cache| write(vm, cache, 0..half),
                |vm, cache| write(vm, cache, half..vm.pages),
            );
        },
        |vm| {
            vm.host_discard(vm.page_hva(half), (vm.pages - half) * PAGE_SIZE)?;
            vm.host_sync();
            vm.host_discard(vm.page_hva(0), half * PAGE_SIZE)?;
            vm.host_sync();
            Ok(())
        },
    )
}

/// Unmap: the guest touches one page per half; the host discards each half `chunk` pages
/// at a time.
pub(super) fn scenario_unmap_common<S: MemslotStore>(
    vm: &Vm<S>,
    seconds: Duration,
    chunk: u64,
) -> Result<(u64, Duration), String> {
    let half = vm.pages / 2;
    let touch = move |page: u64| {
        move |vm: &Vm<S>, cache: &mut VcpuSlotCache| {
            vm.guest_access::<0>(cache, vm.base_gfn() + page, Some(VAL_1));
        }
    };
    vm.run_loop(
        seconds,
        |vm| vm.in_turns(touch(0), touch(half)),
        |vm| {
            vm.host_sync();
            for (first, end) in [(0, half), (half, vm.pages)] {
                let mut page = first;
                while page < end {
                    let count = chunk.min(end - page);
                    vm.host_discard(vm.page_hva(page), count * PAGE_SIZE)?;
                    page += count;
                }
                if first == 0 {
                    vm.host_sync();
                }
            }
            Ok(())
        },
    )
}

pub(super) fn scenario_unmap<S: MemslotStore>(
    vm: &Vm<S>,
    seconds: Duration,
) -> Result<(u64, Duration), String> {
    scenario_unmap_common(vm, seconds, 1)
}

pub(super) fn scenario_unmap_chunked<S: MemslotStore>(
    vm: &Vm<S>,
    seconds: Duration,
) -> Result<(u64, Duration), String> {
    scenario_unmap_common(vm, seconds, UNMAP_CHUNK_BYTES / PAGE_SIZE)
}

/// Move: the host moves the last slot past the end of the area and back while the guest
/// writes a window either across the boundary into that slot (active) or just below it
/// (inactive).
pub(super) fn scenario_move<S: MemslotStore>(
    vm: &Vm<S>,
    seconds: Duration,
    active: bool,
) -> Result<(u64, Duration), String> {
    let window = MOVE_WINDOW_BYTES / PAGE_SIZE;
    let last_base = vm.last_slot_base_gfn();
    let window_start = if active {
        last_base - window / 2
    } else {
        last_base - window
    };
    let (home, away) = vm.last_slot_home_and_away();
    vm.run_loop(
        seconds,
        |vm| {
            let mut cache = VcpuSlotCache::new();
            while !vm.exit.load(Ordering::Acquire) {
                for gfn in window_start..window_start + window {
                    vm.guest_access::<0>(&mut cache, gfn, Some(VAL_1));
                }
            }
        },
        |vm| {
            for region in [&away, &home] {
                vm.store
                    .set_memory_region(region, &NoStage2)
                    .map_err(|e| format!("move: {e}"))?;
            }
            Ok(())
        },
    )
}

pub(super) fn scenario_move_active<S: MemslotStore>(
    vm: &Vm<S>,
    seconds: Duration,
) -> Result<(u64, Duration), String> {
    scenario_move(vm, seconds, true)
}

pub(super) fn scenario_move_inactive<S: MemslotStore>(
    vm: &Vm<S>,
    seconds: Duration,
) -> Result<(u64, Duration), String> {
    scenario_move(vm, seconds, false)
}

/// RW: guest and host each write their word of every page, then check and clear the
/// other's.
pub(super) fn scenario_rw<S: MemslotStore>(
    vm: &Vm<S>,
    seconds: Duration,
) -> Result<(u64, Duration), String> {
    let guest_errors = AtomicU64::new(0);
    let result = vm.run_loop(
        seconds,
        |vm| {
            vm.in_turns(
                |vm, cache| {
                    for page in 0..vm.pages {
                        vm.guest_access::<0>(cache, vm.base_gfn() + page, Some(VAL_1));
                    }
                },
                |vm, cache| {
                    for page in 0..vm.pages {
                        let gfn = vm.base_gfn() + page;
                        if vm.guest_access::<HALF_PAGE_WORD>(cache, gfn, None) != Some(VAL_2) {
                            guest_errors.fetch_add(1, Ordering::Relaxed);
                        }
                        vm.guest_access::<HALF_PAGE_WORD>(cache, gfn, Some(0));
                    }
                },
            )
        },
        |vm| {
            // Every page of the area, as 4 KiB pages of words whose bounds
            // the memory checked once: no range check per access.
            let pages = vm.memory.pages();
            for page in pages {
                page[HALF_PAGE_WORD].store(VAL_2, Ordering::Relaxed);
            }
            vm.host_sync();
            let mut wrong = 0;
            for page in pages {
                if page[0].load(Ordering::Relaxed) != VAL_1 {
                    wrong += 1;
                }
                page[0].store(0, Ordering::Relaxed);
            }
            vm.host_sync();
            if wrong > 0 {
                return Err(format!(
                    "rw: host found {wrong} pages without the guest's value"
                ));
            }
            Ok(())
        },
    )?;
    match guest_errors.into_inner() {
        0 => Ok(result),
        wrong => Err(format!(
            "rw: guest found {wrong} pages without the host's value"
        )),
    }
}

/// Single operations on a set-up VM with no guest running: one move of the last slot
/// (there and back, each timed), one delete of it (the re-create untimed), and random gfn
/// lookups.
pub(super) fn single_ops<S: MemslotStore>(
    vm: &Vm<S>,
    nslots: u32,
    params: &MemslotPerfParams,
) -> Result<Vec<CaseResult>, String> {
    let (moves, deletes) = time_moves_and_deletes(vm, params.single_ops.max(1))?;
    let (plain, through_cache, with_snapshot) = time_lookups(vm, nslots, params.lookups)?;
    let policy = S::POLICY;
    let row = |case, samples: &[f64]| {
        CaseResult::from_samples(case, nslots, vm.nslots, policy, samples, 0)
    };
    Ok(vec![
        row("move_slot", &moves),
        row("delete_slot", &deletes),
        row("lookup_gfn", &plain),
        row("lookup_gfn_vcpu", &through_cache),
        row("lookup_gfn_snapshot", &with_snapshot),
    ])
}

/// `ops` moves of the last slot there and back and `ops` deletes of it (the re-create
/// untimed): each operation's time in nanoseconds.
pub(super) fn time_moves_and_deletes<S: MemslotStore>(
    vm: &Vm<S>,
    ops: u32,
) -> Result<(Vec<f64>, Vec<f64>), String> {
    let (home, away) = vm.last_slot_home_and_away();
    let fail = |e: s2mmu::memslot::MemslotError| format!("single op: {e}");
    let mut moves = Vec::new();
    for _ in 0..ops {
        for region in [&away, &home] {
            let start = Instant::now();
            vm.store
                .set_memory_region(region, &NoStage2)
                .map_err(fail)?;
            moves.push(start.elapsed().as_nanos() as f64);
        }
    }
    let mut deletes = Vec::new();
    for _ in 0..ops {
        let start = Instant::now();
        vm.store
            .set_memory_region(&UserMemoryRegion::delete(home.id()), &NoStage2)
            .map_err(fail)?;
        deletes.push(start.elapsed().as_nanos() as f64);
        vm.store.set_memory_region(&home, &NoStage2).map_err(fail)?;
    }
    Ok((moves, deletes))
}

/// Nanoseconds per lookup of random gfns, per batch of 1000: on a held snapshot, through
/// a per-vCPU cache, and with a snapshot taken per lookup.
#[allow(clippy::type_complexity)]
pub(super) fn time_lookups<S: MemslotStore>(
    vm: &Vm<S>,
    nslots: u32,
    lookups: u32,
) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>), String> {
    // Random gfns over the whole area, drawn before timing so the generator is not timed.
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(nslots);
    let gfns: Vec<u64> = (0..3 * u64::from(lookups.max(1000)))
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            vm.base_gfn() + state % vm.pages
        })
        .collect();
    let batch = 1000;
    let mut plain = Vec::new();
    let mut through_cache = Vec::new();
    let mut with_snapshot = Vec::new();
    let mut found = 0u64;
    // Each pass gets its own gfns, so none is warmed by another.
    let third = gfns.len() / 3;
    let passes = gfns[..third]
        .chunks_exact(batch)
        .zip(gfns[third..2 * third].chunks_exact(batch))
        .zip(gfns[2 * third..].chunks_exact(batch));
    for ((plain_chunk, cache_chunk), snapshot_chunk) in passes {
        let snapshot = vm.store.snapshot();
        let start = Instant::now();
        for &gfn in plain_chunk {
            found += u64::from(snapshot.search(black_box(Gfn::new(gfn))).is_some());
        }
        plain.push(start.elapsed().as_nanos() as f64 / batch as f64);

        let mut cache = VcpuSlotCache::new();
        let start = Instant::now();
        for &gfn in cache_chunk {
            found += u64::from(
                snapshot
                    .gfn_to_slot_vcpu(&mut cache, black_box(Gfn::new(gfn)))
                    .is_some(),
            );
        }
        through_cache.push(start.elapsed().as_nanos() as f64 / batch as f64);
        drop(snapshot);

        let start = Instant::now();
        for &gfn in snapshot_chunk {
            let snapshot = vm.store.snapshot();
            found += u64::from(
                snapshot
                    .gfn_to_slot_vcpu(&mut cache, black_box(Gfn::new(gfn)))
                    .is_some(),
            );
        }
        with_snapshot.push(start.elapsed().as_nanos() as f64 / batch as f64);
    }
    let looked_up = 3 * (third / batch * batch) as u64;
    if found != looked_up {
        return Err(format!(
            "lookup: {found} of {looked_up} random gfns found a slot"
        ));
    }
    Ok((plain, through_cache, with_snapshot))
}
