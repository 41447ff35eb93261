//! The harvest's table scan (`scan_hw_dirty_into`, a whole last-level
//! table at a time with the next one prefetched) against the per-leaf scan
//! (`scan_hw_dirty`), on tables that mix dirty, clean, read-only and
//! invalid entries, blocks beside tables, and the last entry of a table
//! page (which has no next sibling to prefetch), for both formats.

mod common;

use common::{fixture_for, Fixture};
use s2mmu::dirty::DirtyBitmap;
use s2mmu::format::arm64::{Arm64Stage2, Granule};
use s2mmu::format::ept::EptStage2;
use s2mmu::tlb::TlbBatch;
use s2mmu::{MapOptions, Prot, PteFormat};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;

/// What `mixed` built: the range, its holes, and the pages the hardware
/// dirtied.
struct Mixed {
    start: u64,
    len: u64,
    holes: Vec<u64>,
    dirtied: u64,
}

/// Pages and a block, cleaned (tracked), then holes punched, read-only
/// pages remapped, and a scattering of pages and the block dirtied.
fn mixed<F: PteFormat>(fx: &mut Fixture<F>) -> Mixed {
    fx.cache.top_up(256).unwrap();
    let force = MapOptions { force_pages: true };
    // 6 MiB of pages up to a 1 GiB boundary (the last three
    // entries of a level-2 table page), then 2 MiB of pages and a 2 MiB
    // block after the boundary.
    let pages_at = 2 * GIB - 6 * MIB;
    let block = 2 * GIB + 2 * MIB;
    let hpa = 0x80_0000_0000;
    fx.map_pages(pages_at, 8 * MIB, hpa);
    fx.pt
        .map(
            block,
            2 * MIB,
            hpa + 8 * MIB,
            Prot::RW,
            &mut fx.cache,
            MapOptions::default(),
        )
        .unwrap();
    let (start, len) = (pages_at, 10 * MIB);
    // Read-only pages: never tracked, so never dirty.
    let ro = start + 700 * PAGE;
    fx.pt.unmap(ro, 40 * PAGE).unwrap();
    fx.pt
        .map(
            ro,
            40 * PAGE,
            hpa + 700 * PAGE,
            Prot::R,
            &mut fx.cache,
            force,
        )
        .unwrap();
    let tlb = fx.pt.tlb().clone();
    let mut batch = TlbBatch::new(&*tlb, fx.pt.tlb_policy());
    fx.pt
        .clean_hw_dirty_batched(start, len, &mut batch)
        .unwrap();
    batch.finish();
    let npages = len / PAGE;
    // Holes (invalid entries) inside full tables.
    let holes: Vec<u64> = (0..npages - 512).filter(|p| p % 97 == 5).collect();
    for &p in &holes {
        fx.pt.unmap(start + p * PAGE, PAGE).unwrap();
    }
    // The hardware dirties a scattering of what is still mapped writable,
    // and the block.
    let reader = fx.pt.reader();
    let mut dirtied = 0;
    for p in (0..npages - 512).filter(|p| p % 5 == 1 || p % 512 == 511) {
        if let Some((_, true)) = reader.hw_dirty_update_reporting(start + p * PAGE) {
            dirtied += 1;
        }
    }
    assert!(matches!(
        reader.hw_dirty_update_reporting(block),
        Some((_, true))
    ));
    dirtied += 512;
    assert!(dirtied > 512, "pages of the tables were dirtied");
    Mixed {
        start,
        len,
        holes,
        dirtied,
    }
}

fn mixed_tables_scan_alike<F: PteFormat>(fmt: F) {
    let mut fx = fixture_for(fmt);
    let Mixed {
        start,
        len,
        holes,
        dirtied,
    } = mixed(&mut fx);
    for (from, base) in [(start, start), (start + 3 * PAGE, start - 64 * PAGE)] {
        let npages = (start + len - base) / PAGE;
        let fast = DirtyBitmap::new(npages, false);
        let slow = DirtyBitmap::new(npages, false);
        let n = fx
            .pt
            .scan_hw_dirty_into(from, start + len - from, base, &fast)
            .unwrap();
        let mut m = 0;
        fx.pt
            .scan_hw_dirty(from, start + len - from, |ipa, size| {
                for p in 0..size / PAGE {
                    slow.mark((ipa - base) / PAGE + p);
                    m += 1;
                }
            })
            .unwrap();
        let (mut a, mut b) = (vec![0u64; fast.words()], vec![0u64; slow.words()]);
        fast.copy_to(&mut a).unwrap();
        slow.copy_to(&mut b).unwrap();
        assert_eq!(a, b, "from {from:#x}, base {base:#x}");
        assert_eq!(n, m, "both count the same pages");
        if from == start {
            assert_eq!(n, dirtied, "every page the hardware dirtied");
        }
        for &p in &holes {
            assert!(!fast.is_set((start - base) / PAGE + p), "hole {p} marked");
        }
        for p in 700..740 {
            assert!(
                !fast.is_set((start - base) / PAGE + p),
                "read-only {p} marked"
            );
        }
    }
}

#[test]
fn table_scan_matches_per_leaf_scan_arm64() {
    mixed_tables_scan_alike(Arm64Stage2::new(Granule::K4, 40).unwrap());
}

#[test]
fn table_scan_matches_per_leaf_scan_ept() {
    mixed_tables_scan_alike(EptStage2::new(4).unwrap());
}

/// Which pages of a clean's range a test cleans: every page as one range
/// (`clean_hw_dirty_batched`, the whole-table loop), or the pages `p` with
/// `p % every == 0` (and never any, for `every` 0) through a bitmap
/// (`clean_hw_dirty_masked`, its set bits a table at a time), the bitmap's
/// first bit `shift` pages below the range.
#[derive(Clone, Copy, Debug)]
enum Pick {
    All,
    Every { every: u64, shift: u64 },
}

impl Pick {
    fn picks(self, p: u64) -> bool {
        match self {
            Pick::All => true,
            Pick::Every { every, .. } => every != 0 && p.is_multiple_of(every),
        }
    }
}

/// The densities and bitmap offsets every format is cleaned with: dense,
/// every other page, one in 3 (a sparse CLEAR), one run per
/// bitmap word, rarer than a table, none; bitmaps aligned to the tables and
/// not.
const PICKS: [Pick; 9] = [
    Pick::All,
    Pick::Every { every: 1, shift: 0 },
    Pick::Every { every: 2, shift: 0 },
    Pick::Every { every: 3, shift: 0 },
    Pick::Every { every: 3, shift: 5 },
    Pick::Every {
        every: 64,
        shift: 0,
    },
    Pick::Every {
        every: 64,
        shift: 37,
    },
    Pick::Every {
        every: 700,
        shift: 0,
    },
    Pick::Every { every: 0, shift: 0 },
];

/// Cleans the picked pages of `[from, from + len)` a last-level table at a
/// time (one range, or a bitmap of the picked pages) in one batch; returns
/// the leaves changed.
fn clean_whole_tables<F: PteFormat>(fx: &mut Fixture<F>, from: u64, len: u64, pick: Pick) -> u64 {
    let pages = len / PAGE;
    let tlb = fx.pt.tlb().clone();
    let mut batch = TlbBatch::new(&*tlb, fx.pt.tlb_policy());
    let n = match pick {
        Pick::All => fx.pt.clean_hw_dirty_batched(from, len, &mut batch),
        Pick::Every { shift, .. } => {
            let mut masks = vec![0u64; (pages + shift).div_ceil(64) as usize];
            for p in (0..pages).filter(|&p| pick.picks(p)) {
                masks[((p + shift) / 64) as usize] |= 1 << ((p + shift) % 64);
            }
            // Bit `p + shift` is page `p`: the range starts `shift`
            // pages lower (pages with no bit set), another alignment
            // of the bitmap to the tables.
            let below = shift * PAGE;
            fx.pt
                .clean_hw_dirty_masked(from - below, len + below, &masks, &mut batch)
        }
    }
    .unwrap();
    batch.finish();
    n
}

/// Cleans the picked pages of `[from, from + len)` one leaf visit each, in
/// one batch; returns the leaves changed and the pages picked.
fn clean_page_by_page<F: PteFormat>(
    fx: &mut Fixture<F>,
    from: u64,
    len: u64,
    pick: Pick,
) -> (u64, u64) {
    let tlb = fx.pt.tlb().clone();
    let mut batch = TlbBatch::new(&*tlb, fx.pt.tlb_policy());
    let (mut changed, mut picked) = (0, 0);
    for p in (0..len / PAGE).filter(|&p| pick.picks(p)) {
        picked += 1;
        let ipa = from + p * PAGE;
        changed += fx.pt.clean_hw_dirty_batched(ipa, PAGE, &mut batch).unwrap();
    }
    batch.finish();
    (changed, picked)
}

/// Cleaning whole last-level tables at once (one range, or a bitmap's
/// pages) changes the same leaves to the same values, counts the same, and
/// invalidates the same range as cleaning the same pages one by one (a leaf
/// visit each); a page not picked keeps its dirty state.
fn clean_by_table_matches_clean_by_page<F: PteFormat + Clone>(fmt: F, pick: Pick) {
    let mut whole = fixture_for(fmt.clone());
    let mut by_page = fixture_for(fmt);
    let m = mixed(&mut whole);
    mixed(&mut by_page);
    whole.tlb.take();
    by_page.tlb.take();
    // The tables, then the block: each with its own batch, so the first
    // invalidation ends at the last dirty page of the tables.
    let (mut n, mut k, mut picked) = (0, 0, 0);
    for (from, len) in [
        (m.start, m.len - 2 * MIB),
        (m.start + m.len - 2 * MIB, 2 * MIB),
    ] {
        n += clean_whole_tables(&mut whole, from, len, pick);
        let (changed, pages) = clean_page_by_page(&mut by_page, from, len, pick);
        (k, picked) = (k + changed, picked + pages);
    }
    assert_eq!(n, k, "leaves changed, {pick:?}");
    if picked == m.len / PAGE {
        // The dirty pages (the block is one leaf) were changed.
        assert_eq!(n, m.dirtied - 511);
    }
    let leaves = |fx: &Fixture<F>| -> Vec<(u64, u64)> {
        let l = fx.pt.leaves(m.start, m.len).unwrap();
        l.iter().map(|l| (l.ipa, l.pte)).collect()
    };
    assert_eq!(leaves(&whole), leaves(&by_page), "{pick:?}");
    assert_eq!(
        whole.tlb.take(),
        by_page.tlb.take(),
        "invalidations, {pick:?}"
    );
    let left = DirtyBitmap::new(m.len / PAGE, false);
    let found = whole
        .pt
        .scan_hw_dirty_into(m.start, m.len, m.start, &left)
        .unwrap();
    let dirty_left = by_page
        .pt
        .scan_hw_dirty_into(
            m.start,
            m.len,
            m.start,
            &DirtyBitmap::new(m.len / PAGE, false),
        )
        .unwrap();
    assert_eq!(found, dirty_left, "dirty pages left, {pick:?}");
    if picked == m.len / PAGE {
        assert_eq!(found, 0, "nothing dirty after cleaning");
    }
    if matches!(pick, Pick::Every { every: 0, .. }) {
        assert_eq!(found, m.dirtied, "nothing cleaned");
    }
}

#[test]
fn clean_by_table_matches_clean_by_page_arm64() {
    for pick in PICKS {
        clean_by_table_matches_clean_by_page(Arm64Stage2::new(Granule::K4, 40).unwrap(), pick);
    }
}

#[test]
fn clean_by_table_matches_clean_by_page_ept() {
    for pick in PICKS {
        clean_by_table_matches_clean_by_page(EptStage2::new(4).unwrap(), pick);
    }
}

/// A bitmap with fewer bits than the range has pages is refused, the table
/// unchanged.
#[test]
fn masked_clean_refuses_a_short_bitmap() {
    let mut fx = fixture_for(EptStage2::new(4).unwrap());
    let m = mixed(&mut fx);
    let before = fx.pt.leaves(m.start, m.len).unwrap();
    let tlb = fx.pt.tlb().clone();
    let mut batch = TlbBatch::new(&*tlb, fx.pt.tlb_policy());
    let masks = vec![!0u64; (m.len / PAGE / 64) as usize - 1];
    let r = fx
        .pt
        .clean_hw_dirty_masked(m.start, m.len, &masks, &mut batch);
    assert!(
        matches!(r, Err(s2mmu::Error::InvalidConfig { .. })),
        "{r:?}"
    );
    batch.finish();
    assert_eq!(fx.pt.leaves(m.start, m.len).unwrap(), before);
}

/// `Mmu::clear_dirty_log` with hardware dirty state, on a slot that starts
/// and ends off a last-level table's bounds: the masked walk (taken above
/// a threshold of runs per table: 0, the default, never) leaves the same
/// leaves, clears the same count, and keeps dirty every page the caller's
/// bitmap did not name, at every density of that bitmap.
fn clear_alike_whatever_the_strategy<F: PteFormat + Clone>(fmt: F) {
    use s2mmu::memslot::{SlotFlags, TreeMemslots, UserMemoryRegion};
    use s2mmu::mmu::{DirtyMode, Mmu, MmuPolicy, SPARSE_CLEAR_RUNS};
    use s2mmu::{Gpa, HostMmOps, Hva, NoTlb};
    use std::sync::Arc;
    // 3 pages above a 2 MiB boundary, 2 MiB and 69 pages long: three
    // tables, none whole, and a last bitmap word of 5 pages.
    let (gpa, npages) = (GIB + 3 * PAGE, 512 + 69);
    let dirtied = |p: u64| p.is_multiple_of(2) || p % 7 == 3 || (200..330).contains(&p);
    for every in [1, 2, 3, 5, 64, 300] {
        let mut after = Vec::new();
        for runs in [0, SPARSE_CLEAR_RUNS, u32::MAX] {
            let policy = MmuPolicy {
                dirty: DirtyMode::HW,
                ..MmuPolicy::default()
            };
            let m = Mmu::new(
                fmt.clone(),
                HostMmOps::new(4096).unwrap(),
                Arc::new(NoTlb),
                TreeMemslots::new(),
                policy,
            )
            .unwrap()
            .with_sparse_clear_runs(runs);
            let hva = Hva::new(0x7000_0000_0000);
            let r = UserMemoryRegion::new(0, SlotFlags::NONE, Gpa::new(gpa), npages * PAGE, hva);
            m.set_memory_region(&r, 4096).unwrap();
            m.populate(0, 0, npages).unwrap();
            m.enable_dirty_logging(0).unwrap();
            let reader = m.reader();
            let mut n = 0;
            for p in (0..npages).filter(|&p| dirtied(p)) {
                reader.hw_dirty_update(gpa + p * PAGE).unwrap();
                n += 1;
            }
            let mut bm = vec![0u64; npages.div_ceil(64) as usize];
            assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), n);
            // The caller clears the pages `p % every == 0` of what it got.
            let mut clear = vec![0u64; bm.len()];
            let mut named = 0;
            for p in (0..npages).filter(|&p| p.is_multiple_of(every) && dirtied(p)) {
                clear[(p / 64) as usize] |= 1 << (p % 64);
                named += 1;
            }
            let cleared = m.clear_dirty_log(0, 0, npages, &clear).unwrap();
            assert_eq!(cleared, named, "every {every}, runs {runs}");
            let leaves = m.with_table(|pt| pt.leaves(gpa, npages * PAGE)).unwrap();
            after.push(leaves.iter().map(|l| (l.ipa, l.pte)).collect::<Vec<_>>());
            // What was not cleared is still dirty in the table, and only
            // that: the next GET finds exactly it.
            let left = m.get_dirty_log(0, &mut bm).unwrap();
            assert_eq!(left, n - named, "every {every}, runs {runs}");
            for p in 0..npages {
                let set = bm[(p / 64) as usize] >> (p % 64) & 1 == 1;
                assert_eq!(
                    set,
                    dirtied(p) && !p.is_multiple_of(every),
                    "page {p}, every {every}"
                );
            }
        }
        assert!(after.windows(2).all(|w| w[0] == w[1]), "every {every}");
    }
}

#[test]
fn clear_alike_whatever_the_strategy_arm64() {
    clear_alike_whatever_the_strategy(Arm64Stage2::new(Granule::K4, 40).unwrap());
}

#[test]
fn clear_alike_whatever_the_strategy_ept() {
    clear_alike_whatever_the_strategy(EptStage2::new(4).unwrap());
}
