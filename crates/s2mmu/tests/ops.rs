//! Operations: their results, their errors, and what they leave behind.

mod common;

use common::{fixture, Fixture};
use s2mmu::format::arm64::Granule;
use s2mmu::tlb::TlbCall;
use s2mmu::{Error, MapOptions, Prot, PteFormat, SplitPolicy};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
/// Every split walk: the full walk, the RFC's skip returns (v1) and the
/// skip-level flag (v2).
const SPLIT_POLICIES: [SplitPolicy; 3] = [
    SplitPolicy::SkipReturns,
    SplitPolicy::FullWalk,
    SplitPolicy::NoLastLevelTables,
];

#[test]
fn map_uses_the_largest_blocks_alignment_allows() {
    let mut fx = fixture(Granule::K4, 40);
    fx.cache.top_up(8).unwrap();
    // [1G - 4K, 2G + 2M + 4K): a page, a 1G block, a 2M block, a page.
    let ipa = GIB - 4096;
    let size = GIB + 2 * MIB + 8192;
    fx.pt
        .map(
            ipa,
            size,
            ipa,
            Prot::RW,
            &mut fx.cache,
            MapOptions::default(),
        )
        .unwrap();
    let sizes: Vec<u64> = fx
        .pt
        .leaves(ipa, size)
        .unwrap()
        .iter()
        .map(|l| l.size)
        .collect();
    assert_eq!(sizes, vec![4096, GIB, 2 * MIB, 4096]);
    // A pa misaligned to 2M forces pages for the same ipa range.
    let mut fx = fixture(Granule::K4, 40);
    fx.cache.top_up(8).unwrap();
    fx.pt
        .map(
            GIB,
            2 * MIB,
            0x1000,
            Prot::RW,
            &mut fx.cache,
            MapOptions::default(),
        )
        .unwrap();
    assert_eq!(fx.pt.leaves(GIB, 2 * MIB).unwrap().len(), 512);
    fx.assert_no_leak();
}

/// Maps refused for their arguments or for what is mapped (a 2 MiB block at
/// 1 GiB): each error got, with the one expected.
fn refused_maps(fx: &mut Fixture) -> Vec<(Error, Error)> {
    let d = MapOptions::default();
    vec![
        (
            fx.pt
                .map(GIB + 1, 4096, 0, Prot::R, &mut fx.cache, d)
                .unwrap_err(),
            Error::Misaligned {
                what: "ipa",
                value: GIB + 1,
                align: 4096,
            },
        ),
        (
            fx.pt
                .map(0, 4095, 0, Prot::R, &mut fx.cache, d)
                .unwrap_err(),
            Error::Misaligned {
                what: "size",
                value: 4095,
                align: 4096,
            },
        ),
        (
            fx.pt
                .map(0, 4096, 7, Prot::R, &mut fx.cache, d)
                .unwrap_err(),
            Error::Misaligned {
                what: "pa",
                value: 7,
                align: 4096,
            },
        ),
        (
            fx.pt.map(0, 0, 0, Prot::R, &mut fx.cache, d).unwrap_err(),
            Error::EmptyRange { ipa: 0, size: 0 },
        ),
        (
            fx.pt
                .map((1 << 40) - 4096, 8192, 0, Prot::R, &mut fx.cache, d)
                .unwrap_err(),
            Error::OutOfRange {
                ipa: (1 << 40) - 4096,
                size: 8192,
                limit: 1 << 40,
            },
        ),
        (
            fx.pt
                .map(GIB - 4096, 8192, 0, Prot::R, &mut fx.cache, d)
                .unwrap_err(),
            Error::AlreadyMapped { ipa: GIB },
        ),
        (
            fx.pt
                .map(0, 4096, 1 << 48, Prot::R, &mut fx.cache, d)
                .unwrap_err(),
            Error::PhysOutOfRange {
                pa: 1 << 48,
                pa_bits: 48,
            },
        ),
        (
            fx.pt
                .map(0, 4096, 0, Prot::RWX | Prot::DEVICE, &mut fx.cache, d)
                .unwrap_err(),
            Error::InvalidProt {
                bits: (Prot::RWX | Prot::DEVICE).bits(),
            },
        ),
    ]
}

/// Unmap, relax and write-protect refused against the same table.
fn refused_changes(fx: &mut Fixture) -> Vec<(Error, Error)> {
    vec![
        (
            fx.pt.unmap(GIB, 4096).unwrap_err(),
            Error::SplitsBlock {
                block_ipa: GIB,
                block_size: 2 * MIB,
            },
        ),
        (
            fx.pt.relax_perms(2 * GIB, Prot::RW).unwrap_err(),
            Error::NotMapped { ipa: 2 * GIB },
        ),
        (
            fx.pt.wrprotect(GIB, 123).unwrap_err(),
            Error::Misaligned {
                what: "size",
                value: 123,
                align: 4096,
            },
        ),
    ]
}

#[test]
fn bad_input_is_refused_and_leaves_the_table_alone() {
    let mut fx = fixture(Granule::K4, 40);
    fx.cache.top_up(4).unwrap();
    let d = MapOptions::default();
    fx.pt
        .map(GIB, 2 * MIB, GIB, Prot::RW, &mut fx.cache, d)
        .unwrap();
    let before = fx.pt.leaves(0, 1 << 40).unwrap();
    let cache_before = fx.cache.len();
    let mut cases = refused_maps(&mut fx);
    cases.extend(refused_changes(&mut fx));
    for (got, want) in cases {
        assert_eq!(got, want);
        assert!(!got.to_string().is_empty());
    }
    assert_eq!(fx.pt.leaves(0, 1 << 40).unwrap(), before);
    assert_eq!(fx.cache.len(), cache_before);
    fx.assert_no_leak();
}

#[test]
fn map_refuses_when_the_cache_is_short() {
    let mut fx = fixture(Granule::K4, 40);
    fx.cache.top_up(1).unwrap();
    let r = fx
        .pt
        .map(GIB, 4096, 0, Prot::R, &mut fx.cache, MapOptions::default());
    assert_eq!(
        r,
        Err(Error::CacheExhausted {
            needed: 2,
            available: 1
        })
    );
    assert!(fx.pt.leaves(0, 1 << 40).unwrap().is_empty());
    assert_eq!(fx.pt.table_pages(), 0);
}

#[test]
fn unmap_frees_emptied_tables_and_invalidates() {
    let mut fx = fixture(Granule::K4, 40);
    fx.cache.top_up(8).unwrap();
    fx.map_pages(GIB, 4 * MIB, 0);
    assert_eq!(fx.pt.table_pages(), 3, "one level-2 and two level-3 tables");
    fx.tlb.take();
    let st = fx.pt.unmap(GIB, 2 * MIB).unwrap();
    assert_eq!((st.leaves, st.tables_freed), (512, 1));
    assert_eq!(fx.pt.table_pages(), 2);
    assert_eq!(
        fx.tlb.take(),
        vec![TlbCall::Range {
            ipa: GIB,
            size: 2 * MIB
        }]
    );
    let st = fx.pt.unmap(GIB, 4 * MIB).unwrap();
    assert_eq!((st.leaves, st.tables_freed), (512, 2));
    assert_eq!(fx.pt.table_pages(), 0);
    fx.assert_no_leak();
    // Unmapping nothing is not an error and issues nothing.
    fx.tlb.take();
    let st = fx.pt.unmap(GIB, 4 * MIB).unwrap();
    assert_eq!(st.leaves, 0);
    assert!(fx.tlb.take().is_empty());
}

#[test]
fn write_protect_then_relax() {
    let mut fx = fixture(Granule::K4, 40);
    fx.cache.top_up(8).unwrap();
    fx.map_pages(GIB, 2 * MIB, 0);
    fx.tlb.take();
    assert_eq!(fx.pt.wrprotect(GIB, 2 * MIB).unwrap(), 512);
    assert_eq!(
        fx.tlb.take(),
        vec![TlbCall::Range {
            ipa: GIB,
            size: 2 * MIB
        }]
    );
    assert_eq!(
        fx.pt.wrprotect(GIB, 2 * MIB).unwrap(),
        0,
        "already protected"
    );
    assert_eq!(fx.pt.translate(GIB + 4096).unwrap().prot, Prot::R);
    let w = fx.pt.format().write_bit();
    let o = fx.pt.relax_perms(GIB + 4096 + 17, Prot::RW).unwrap();
    assert!(o.became_writable(w));
    assert_eq!(o.leaf_ipa, GIB + 4096);
    assert_eq!(
        fx.tlb.take(),
        vec![TlbCall::IpaLocal {
            ipa: GIB + 4096 + 17,
            level: Some(3)
        }]
    );
    let o = fx.pt.relax_perms(GIB + 4096, Prot::RW).unwrap();
    assert!(!o.became_writable(w), "second relax finds it writable");
    assert!(
        fx.tlb.take().is_empty(),
        "nothing changed, nothing to invalidate"
    );
    assert_eq!(fx.pt.translate(GIB + 4096).unwrap().prot, Prot::RW);
    assert_eq!(fx.pt.translate(GIB + 8192).unwrap().prot, Prot::R);
}

#[test]
fn access_flag() {
    let mut fx = fixture(Granule::K4, 40);
    fx.cache.top_up(8).unwrap();
    fx.pt
        .map(GIB, 8192, 0, Prot::RW, &mut fx.cache, MapOptions::default())
        .unwrap();
    assert!(
        fx.pt.test_clear_young(GIB, 8192, true).unwrap(),
        "new mappings are young"
    );
    assert!(!fx.pt.test_clear_young(GIB, 8192, false).unwrap());
    fx.pt.mkyoung(GIB + 4096).unwrap();
    assert!(fx.pt.test_clear_young(GIB, 8192, false).unwrap());
    assert!(!fx.pt.test_clear_young(GIB, 4096, false).unwrap());
    assert_eq!(
        fx.pt.mkyoung(2 * GIB),
        Err(Error::NotMapped { ipa: 2 * GIB })
    );
}

#[test]
fn split_1g_block_with_a_full_cache_is_one_step() {
    for policy in SPLIT_POLICIES {
        let mut fx = fixture(Granule::K4, 40);
        fx.cache.top_up(2).unwrap();
        fx.pt
            .map(
                GIB,
                GIB,
                0x80_0000_0000,
                Prot::R,
                &mut fx.cache,
                MapOptions::default(),
            )
            .unwrap();
        fx.cache.top_up(fx.pt.split_capacity(GIB)).unwrap();
        assert_eq!(fx.cache.len(), 513);
        fx.tlb.take();
        let st = fx.pt.split(GIB, GIB, &mut fx.cache, policy).unwrap();
        assert!(st.complete);
        assert_eq!((st.blocks_split, st.tables), (1, 513), "{policy:?}");
        // Break-before-make: one invalidation of the block at its level.
        assert_eq!(
            fx.tlb.take(),
            vec![TlbCall::Ipa {
                ipa: GIB,
                level: Some(1)
            }]
        );
        let leaves = fx.pt.leaves(GIB, GIB).unwrap();
        assert_eq!(leaves.len(), 262144);
        assert!(leaves.iter().enumerate().all(|(i, l)| l.size == 4096
            && l.pa == 0x80_0000_0000 + i as u64 * 4096
            && l.prot == Prot::R));
        fx.assert_no_leak();
    }
}

#[test]
fn split_is_best_effort_when_the_cache_runs_dry() {
    // With a short cache a 1G block becomes a table of 2M blocks, which
    // every walk, the skip-level flag included, must descend into.
    for policy in SPLIT_POLICIES {
        let mut fx = fixture(Granule::K4, 40);
        fx.cache.top_up(2).unwrap();
        fx.pt
            .map(GIB, GIB, 0, Prot::RW, &mut fx.cache, MapOptions::default())
            .unwrap();
        fx.cache.release_all();
        fx.cache.top_up(3).unwrap();
        // Three pages: one turns the 1G block into 2M blocks, two split two of them.
        let st = fx.pt.split(GIB, GIB, &mut fx.cache, policy).unwrap();
        assert!(!st.complete);
        assert_eq!(st.blocks_split, 3, "{policy:?}");
        let leaves = fx.pt.leaves(GIB, GIB).unwrap();
        assert_eq!(leaves.len(), 2 * 512 + 510);
        for l in &leaves {
            assert_eq!(
                fx.pt.translate(l.ipa).unwrap().pa,
                l.ipa - GIB,
                "translation unchanged"
            );
        }
        fx.assert_no_leak();
        // Topping up and splitting again finishes the job.
        fx.cache.top_up(fx.pt.split_capacity(GIB)).unwrap();
        let st = fx.pt.split(GIB, GIB, &mut fx.cache, policy).unwrap();
        assert!(st.complete);
        assert_eq!(st.blocks_split, 510, "{policy:?}");
        assert_eq!(fx.pt.leaves(GIB, GIB).unwrap().len(), 262144);
    }
}

#[test]
fn shared_map_loses_races_cleanly() {
    let mut fx = fixture(Granule::K4, 40);
    fx.cache.top_up(8).unwrap();
    fx.pt
        .map_shared(GIB, 4096, 0, Prot::R, &mut fx.cache, MapOptions::default())
        .unwrap();
    let r = fx
        .pt
        .map_shared(GIB, 4096, 0, Prot::R, &mut fx.cache, MapOptions::default());
    assert_eq!(r, Err(Error::AlreadyMapped { ipa: GIB }));
}

#[test]
fn concurrent_faults_map_each_page_once() {
    // Two threads race to map the same pages under "the read lock"
    // (shared walks); every page ends up mapped exactly once, the
    // losers see AlreadyMapped or Again, and no table page leaks.
    use std::sync::Barrier;
    let fx = fixture(Granule::K4, 40);
    let barrier = Barrier::new(2);
    let pt = &fx.pt;
    let mm = fx.mm.clone();
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let barrier = &barrier;
            let mm = mm.clone();
            s.spawn(move || {
                let mut cache = s2mmu::PageCache::new(mm);
                barrier.wait();
                for i in 0..2048u64 {
                    let ipa = GIB + ((i * 7 + t) % 2048) * 4096;
                    cache.top_up(3).unwrap();
                    loop {
                        match pt.map_shared(
                            ipa,
                            4096,
                            ipa,
                            Prot::RW,
                            &mut cache,
                            MapOptions::default(),
                        ) {
                            Ok(_) | Err(Error::AlreadyMapped { .. }) => break,
                            Err(Error::Again { .. }) => continue,
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
            });
        }
    });
    let leaves = fx.pt.leaves(GIB, 8 * MIB).unwrap();
    assert_eq!(leaves.len(), 2048);
    assert!(leaves.iter().all(|l| l.pa == l.ipa));
    fx.assert_no_leak();
}

#[test]
fn other_granules_map_their_blocks() {
    let granules = [(Granule::K16, 47, 32 * MIB), (Granule::K64, 48, 512 * MIB)];
    for ((g, bits, block), policy) in granules
        .into_iter()
        .flat_map(|g| SPLIT_POLICIES.map(|p| (g, p)))
    {
        let mut fx = fixture(g, bits);
        fx.cache.top_up(4).unwrap();
        fx.pt
            .map(
                GIB,
                2 * block,
                GIB,
                Prot::RW,
                &mut fx.cache,
                MapOptions::default(),
            )
            .unwrap();
        let leaves = fx.pt.leaves(GIB, 2 * block).unwrap();
        assert_eq!(leaves.len(), 2);
        assert!(leaves.iter().all(|l| l.size == block && l.level == 2));
        fx.cache.top_up(fx.pt.split_capacity(2 * block)).unwrap();
        let st = fx.pt.split(GIB, 2 * block, &mut fx.cache, policy).unwrap();
        assert_eq!(st.blocks_split, 2, "{g:?} {policy:?}");
        let page = fx.pt.format().page_size();
        assert_eq!(
            fx.pt.leaves(GIB, 2 * block).unwrap().len() as u64,
            2 * block / page
        );
        fx.assert_no_leak();
    }
}

/// The harvest's fast scan (a word of the bitmap per 64 last-level
/// entries) finds exactly what the per-leaf scan finds, for blocks, for
/// tables partly inside the range and for a bitmap base that is not
/// 64-page aligned.
#[test]
fn fast_hardware_dirty_scan_matches_the_per_leaf_scan() {
    use s2mmu::dirty::DirtyBitmap;
    use s2mmu::tlb::TlbBatch;
    let mut fx = fixture(Granule::K4, 40);
    let base = 1u64 << 32;
    fx.cache.top_up(64).unwrap();
    // 6 MiB of pages, then a 2 MiB block.
    fx.map_pages(base, 6 * MIB, 0x80_0000_0000);
    let block = base + 6 * MIB;
    fx.pt
        .map(
            block,
            2 * MIB,
            0x90_0000_0000,
            Prot::RW,
            &mut fx.cache,
            MapOptions::default(),
        )
        .unwrap();
    let tlb = fx.pt.tlb().clone();
    let mut batch = TlbBatch::new(&*tlb, fx.pt.tlb_policy());
    fx.pt
        .clean_hw_dirty_batched(base, 8 * MIB, &mut batch)
        .unwrap();
    batch.finish();
    // The hardware dirties a scattering of pages and the block.
    let dirtied: Vec<u64> = (0..1536u64)
        .filter(|p| p % 7 == 3 || p % 64 == 63)
        .collect();
    for &p in &dirtied {
        fx.pt.relax_perms(base + p * 4096, Prot::RW).unwrap();
    }
    fx.pt.relax_perms(block, Prot::RW).unwrap();
    for (from, len, bm_base) in [
        (base, 8 * MIB, base),
        (base + 4096, 8 * MIB - 4096, base + 4096),
        (base + 3 * 4096, 3 * MIB, base),
        (base, 2 * MIB, base - 64 * 4096),
    ] {
        let npages = (from + len - bm_base) / 4096;
        let fast = DirtyBitmap::new(npages, false);
        let slow = DirtyBitmap::new(npages, false);
        let n = fx.pt.scan_hw_dirty_into(from, len, bm_base, &fast).unwrap();
        let mut m = 0;
        fx.pt
            .scan_hw_dirty(from, len, |ipa, size| {
                for p in 0..size / 4096 {
                    slow.mark((ipa - bm_base) / 4096 + p);
                    m += 1;
                }
            })
            .unwrap();
        let (mut a, mut b) = (vec![0u64; fast.words()], vec![0u64; slow.words()]);
        fast.copy_to(&mut a).unwrap();
        slow.copy_to(&mut b).unwrap();
        assert_eq!(a, b, "range {from:#x}+{len:#x}, base {bm_base:#x}");
        assert!(n > 0 && a.iter().any(|w| *w != 0));
        assert_eq!(n, m, "both count the same pages");
    }
}
