//! `split-perf`'s running and measuring: building the slot's table for a
//! backing, the timed splits (whole, chunked with top-ups, CLEAR-like), one
//! case's runs over every policy, and the plain-store floor.

use super::{Backing, Case, Mode, Sample, Table, POLICIES};
use crate::stats::Samples;
use crate::Progress;
use s2mmu::{HostMmOps, MapOptions, NoTlb, PageCache, PageTable, Prot, PteFormat, SplitPolicy};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use super::bounds::BASE;

/// The sum of no splits: complete, nothing done.
fn no_splits() -> s2mmu::SplitStats {
    s2mmu::SplitStats {
        complete: true,
        ..Default::default()
    }
}

/// Splits the range `(start, len)` and adds what the split did to `total`.
fn split_adding<F: PteFormat>(
    pt: &mut Table<F>,
    cache: &mut PageCache<HostMmOps>,
    (start, len): (u64, u64),
    policy: SplitPolicy,
    total: &mut s2mmu::SplitStats,
) -> Result<(), String> {
    let st = pt
        .split(start, len, cache, policy)
        .map_err(|e| e.to_string())?;
    total.blocks_split += st.blocks_split;
    total.tables += st.tables;
    total.entries += st.entries;
    total.visits += st.visits;
    total.complete &= st.complete;
    Ok(())
}

/// Times `each` on every `chunk` of `[base, base + size)` (its start
/// given), the cache topped up for a chunk's split before each, top-ups
/// inside the timed region; returns the time and the splits' sum.
fn timed_chunks<F: PteFormat>(
    pt: &mut Table<F>,
    cache: &mut PageCache<HostMmOps>,
    (base, size, chunk): (u64, u64, u64),
    mut each: impl FnMut(
        &mut Table<F>,
        &mut PageCache<HostMmOps>,
        u64,
        &mut s2mmu::SplitStats,
    ) -> Result<(), String>,
) -> Result<(Duration, s2mmu::SplitStats), String> {
    let capacity = pt.split_capacity(chunk);
    let mut total = no_splits();
    let t0 = Instant::now();
    let mut c = base;
    while c < base + size {
        cache.top_up(capacity).map_err(|e| e.to_string())?;
        each(pt, cache, c, &mut total)?;
        c += chunk;
    }
    Ok((t0.elapsed(), total))
}

/// The engine's `Mmu::clear_dirty_log` on the table for an all-ones bitmap
/// with initially-set bitmaps: per 64-page word, split the word's range and
/// write-protect it; the cache is topped up before each lock chunk. Timed
/// whole, top-ups included (they are part of the ioctl).
fn clear_like_engine<F: PteFormat>(
    pt: &mut Table<F>,
    cache: &mut PageCache<HostMmOps>,
    (base, size): (u64, u64),
    policy: SplitPolicy,
) -> Result<(Duration, s2mmu::SplitStats), String> {
    let word = 64 * pt.format().page_size();
    let chunk = s2mmu::mmu::LOCK_CHUNK.min(size);
    timed_chunks(pt, cache, (base, size, chunk), |pt, cache, c, total| {
        let mut a = c;
        while a < (c + chunk).min(base + size) {
            split_adding(pt, cache, (a, word), policy, total)?;
            pt.wrprotect(a, word).map_err(|e| e.to_string())?;
            a += word;
        }
        Ok(())
    })
}

/// Splits `[base, base + size)` chunk by chunk, topping the cache up before
/// each chunk as KVM's eager-split driver does between lock holds; the
/// top-ups are inside the timed region.
fn split_chunked<F: PteFormat>(
    pt: &mut Table<F>,
    cache: &mut PageCache<HostMmOps>,
    (base, size, chunk): (u64, u64, u64),
    policy: SplitPolicy,
) -> Result<(Duration, s2mmu::SplitStats), String> {
    timed_chunks(pt, cache, (base, size, chunk), |pt, cache, a, total| {
        split_adding(pt, cache, (a, chunk), policy, total)
    })
}

pub fn build<F: PteFormat>(
    fmt: F,
    mm: &HostMmOps,
    base: u64,
    size: u64,
    backing: Backing,
) -> Result<Table<F>, String> {
    let mut pt =
        PageTable::new(fmt.clone(), mm.clone(), Arc::new(NoTlb)).map_err(|e| e.to_string())?;
    let mut cache = PageCache::new(mm.clone());
    cache
        .top_up(pt.split_capacity(size) + 4)
        .map_err(|e| e.to_string())?;
    // The table maps the slot without touching guest memory: output
    // addresses only need the alignment of the backing.
    let pa = 0x40_0000_0000u64;
    let step = match backing {
        Backing::Pages | Backing::Level1Blocks => size,
        Backing::Level2Blocks => fmt.granule(2),
    };
    let opts = MapOptions {
        force_pages: backing == Backing::Pages,
    };
    let mut a = 0;
    while a < size {
        let n = step.min(size - a);
        pt.map(base + a, n, pa + a, Prot::RW, &mut cache, opts)
            .map_err(|e| e.to_string())?;
        a += n;
    }
    Ok(pt)
}

/// One case: `runs` rounds of every policy, the order rotated each round
/// so no policy always runs first; the samples per policy in `POLICIES`
/// order.
pub fn case<F: PteFormat>(
    fmt: F,
    mm: &HostMmOps,
    size: u64,
    runs: usize,
    case: &Case,
    bar: &dyn Progress,
) -> Result<Vec<Vec<Sample>>, String> {
    super::check(&fmt, size, runs)?;
    let base = BASE;
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); POLICIES.len()];
    // The already-split table does not change under a split, so build
    // it once (a CLEAR write-protects it: fresh tables there).
    let mut shared = if case.backing == Backing::Pages && case.mode != Mode::Clear {
        Some(build(fmt.clone(), mm, base, size, case.backing)?)
    } else {
        None
    };
    let mut cache = PageCache::new(mm.clone());
    for run in 0..runs {
        for k in 0..POLICIES.len() {
            let pi = (k + run) % POLICIES.len();
            let mut fresh;
            let pt = match shared.as_mut() {
                Some(pt) => pt,
                None => {
                    fresh = build(fmt.clone(), mm, base, size, case.backing)?;
                    &mut fresh
                }
            };
            samples[pi].push(one(pt, &mut cache, size, case.mode, POLICIES[pi])?);
        }
        bar.step();
    }
    Ok(samples)
}

/// One timed split of the slot under `policy`.
fn one<F: PteFormat>(
    pt: &mut Table<F>,
    cache: &mut PageCache<HostMmOps>,
    size: u64,
    mode: Mode,
    policy: SplitPolicy,
) -> Result<Sample, String> {
    let base = BASE;
    let (time, st) = match mode {
        Mode::SplitTopup => {
            cache.release_all();
            let chunk = pt.format().granule(2);
            split_chunked(pt, cache, (base, size, chunk), policy)?
        }
        // The engine keeps its split cache across CLEARs.
        Mode::Clear => clear_like_engine(pt, cache, (base, size), policy)?,
        Mode::Split => {
            cache
                .top_up(pt.split_capacity(size))
                .map_err(|e| e.to_string())?;
            let t0 = Instant::now();
            let st = pt
                .split(base, size, cache, policy)
                .map_err(|e| e.to_string())?;
            (t0.elapsed(), st)
        }
    };
    if !st.complete {
        return Err("split ran out of cache pages".into());
    }
    Ok(Sample {
        time,
        entries: st.entries,
        tables: st.tables,
        blocks: st.blocks_split,
    })
}

/// Times writing the last-level tables that splitting `size` bytes of
/// level-2 blocks creates (one page per block, every entry a plain store of
/// a leaf), into pages already faulted in, as the split's cache pages are.
pub fn store_floor<F: PteFormat>(
    fmt: &F,
    mm: &HostMmOps,
    size: u64,
    runs: usize,
) -> Result<Samples, String> {
    use s2mmu::MmOps;
    super::check(fmt, size, runs)?;
    let tables = (size / fmt.granule(2)) as usize;
    let pages: Vec<u64> = (0..tables)
        .map(|_| {
            mm.zalloc_page()
                .ok_or("out of memory for the floor's pages")
        })
        .collect::<Result<_, _>>()?;
    let entries = fmt.entries_per_table();
    let leaf = fmt
        .leaf_pte(0x40_0000_0000, fmt.last_level(), Prot::RW)
        .map_err(|e| e.to_string())?;
    let step = fmt.page_size();
    let mut times = Vec::new();
    // Three warm-up passes fault the pages in and warm the caches, as the
    // split's recycled cache pages are; then at least 20 measured passes.
    for pass in 0..runs.max(20) + 3 {
        let t0 = Instant::now();
        for (t, &pa) in pages.iter().enumerate() {
            // SAFETY: `pa` is a live page of `entries` u64s that only this
            // loop uses.
            let table = unsafe { std::slice::from_raw_parts_mut(mm.phys_to_virt(pa), entries) };
            fill(table, leaf + (t * entries) as u64 * step, step);
        }
        black_box(&pages);
        if pass >= 3 {
            times.push(t0.elapsed());
        }
    }
    for pa in pages {
        // SAFETY: allocated above, never linked into a table.
        unsafe { mm.free_page(pa) };
    }
    Ok(Samples::of(&times))
}

/// The floor's store loop: one leaf per entry, as a split writes them.
#[inline(never)]
fn fill(table: &mut [u64], first: u64, step: u64) {
    let mut leaf = first;
    for e in table.iter_mut() {
        *e = leaf;
        leaf = leaf.wrapping_add(step);
    }
}
