//! The harvest's table scan (`scan_hw_dirty_into`, a whole last-level
//! table at a time with the next one prefetched) against the per-leaf scan
//! (`scan_hw_dirty`), on tables that mix dirty, clean, read-only and
//! invalid entries, blocks beside tables, and the last entry of a table
//! page (which has no next sibling to prefetch), for both formats.

mod common;

use common::{fixture_for, Fixture};
use s2mmu::dirty::DirtyBitmap;
use s2mmu::format::arm64::{Arm64Stage2, Granule};
use s2mmu::format::ept::EptFormat;
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
    fx.pt
        .map(pages_at, 8 * MIB, hpa, Prot::RW, &mut fx.cache, force)
        .unwrap();
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
    mixed_tables_scan_alike(EptFormat::new(4).unwrap());
}

/// Cleaning whole last-level tables at once (one range) changes the same
/// leaves to the same values, counts the same, and invalidates the same
/// range as cleaning page by page (a leaf visit each).
fn clean_by_table_matches_clean_by_page<F: PteFormat + Clone>(fmt: F) {
    let mut whole = fixture_for(fmt.clone());
    let mut by_page = fixture_for(fmt);
    let m = mixed(&mut whole);
    mixed(&mut by_page);
    whole.tlb.take();
    by_page.tlb.take();
    // The tables, then the block: each with its own batch, so the first
    // invalidation ends at the last dirty page of the tables.
    let (mut n, mut k) = (0, 0);
    for (from, len) in [
        (m.start, m.len - 2 * MIB),
        (m.start + m.len - 2 * MIB, 2 * MIB),
    ] {
        let tlb = whole.pt.tlb().clone();
        let mut batch = TlbBatch::new(&*tlb, whole.pt.tlb_policy());
        n += whole
            .pt
            .clean_hw_dirty_batched(from, len, &mut batch)
            .unwrap();
        batch.finish();
        let tlb = by_page.pt.tlb().clone();
        let mut batch = TlbBatch::new(&*tlb, by_page.pt.tlb_policy());
        for p in 0..len / PAGE {
            let ipa = from + p * PAGE;
            k += by_page
                .pt
                .clean_hw_dirty_batched(ipa, PAGE, &mut batch)
                .unwrap();
        }
        batch.finish();
    }
    assert_eq!(n, k, "leaves changed");
    // The dirty pages (the block is one leaf) were changed.
    assert_eq!(n, m.dirtied - 511);
    let leaves = |fx: &Fixture<F>| -> Vec<(u64, u64)> {
        let l = fx.pt.leaves(m.start, m.len).unwrap();
        l.iter().map(|l| (l.ipa, l.pte)).collect()
    };
    assert_eq!(leaves(&whole), leaves(&by_page));
    assert_eq!(whole.tlb.take(), by_page.tlb.take(), "invalidations");
    let none = DirtyBitmap::new(m.len / PAGE, false);
    let found = whole
        .pt
        .scan_hw_dirty_into(m.start, m.len, m.start, &none)
        .unwrap();
    assert_eq!(found, 0, "nothing dirty after cleaning");
}

#[test]
fn clean_by_table_matches_clean_by_page_arm64() {
    clean_by_table_matches_clean_by_page(Arm64Stage2::new(Granule::K4, 40).unwrap());
}

#[test]
fn clean_by_table_matches_clean_by_page_ept() {
    clean_by_table_matches_clean_by_page(EptFormat::new(4).unwrap());
}
