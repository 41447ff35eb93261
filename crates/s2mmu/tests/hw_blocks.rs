//! Blocks under hardware dirty state (`DirtyMode::Hardware`'s `blocks`): split
//! first (pages logged one by one) or logged whole (no split; a write to a
//! block reports all its pages), for both formats.

use s2mmu::format::arm64::{Arm64Stage2, Granule};
use s2mmu::format::ept::EptStage2;
use s2mmu::memslot::{SlotFlags, TreeMemslots, UserMemoryRegion};
use s2mmu::mmu::{DirtyMode, HwDirtyBlocks, Mmu, MmuPolicy, Protect};
use s2mmu::{Error, Gpa, HostMmOps, Hva, NoTlb, PteFormat};
use std::sync::Arc;

const GPA: u64 = 1 << 30;
/// Host addresses only recorded in the table, never touched.
const HVA: u64 = 0x7000_0000_0000;
const BLOCK: u64 = 2 << 20;
/// Two 2 MiB blocks.
const SIZE: u64 = 2 * BLOCK;
const PAGES: u64 = SIZE / 4096;

type TestMmu<F> = Mmu<F, HostMmOps, TreeMemslots>;

/// An MMU over a fresh host table with `policy`, no slot yet.
fn mmu<F: PteFormat>(fmt: F, policy: MmuPolicy) -> Result<TestMmu<F>, Error> {
    Mmu::new(
        fmt,
        HostMmOps::new(4096).unwrap(),
        Arc::new(NoTlb),
        TreeMemslots::new(),
        policy,
    )
}

/// Hardware dirty state with `blocks`, CLEAR protecting when `manual`.
fn hw_policy(blocks: HwDirtyBlocks, manual: bool) -> MmuPolicy {
    MmuPolicy {
        dirty: DirtyMode::Hardware {
            protect: Protect::manual_if(manual),
            blocks,
        },
        ..MmuPolicy::default()
    }
}

/// Slot 0 at `GPA`, both blocks mapped whole by a write fault each, then
/// dirty-logged.
fn map_blocks_and_log<F: PteFormat>(m: &TestMmu<F>) {
    let r = UserMemoryRegion::new(0, SlotFlags::NONE, Gpa::new(GPA), SIZE, Hva::new(HVA));
    m.set_memory_region(&r, BLOCK).unwrap();
    let mut v = m.new_vcpu().unwrap();
    for b in 0..SIZE / BLOCK {
        m.handle_fault(&mut v, Gpa::new(GPA + b * BLOCK), true)
            .unwrap();
    }
    m.enable_dirty_logging(0).unwrap();
}

/// Both blocks mapped and logged under hardware dirty state.
fn logged<F: PteFormat>(fmt: F, blocks: HwDirtyBlocks, manual: bool) -> TestMmu<F> {
    let m = mmu(fmt, hw_policy(blocks, manual)).unwrap();
    map_blocks_and_log(&m);
    m
}

fn count(bm: &[u64]) -> u64 {
    bm.iter().map(|w| u64::from(w.count_ones())).sum()
}

fn blocks_logged_whole_or_split<F: PteFormat + Copy>(fmt: F) {
    for (blocks, leaves, reported) in [
        (HwDirtyBlocks::SplitFirst, PAGES as usize, 2),
        (HwDirtyBlocks::LogWholeBlocks, 2, 512),
    ] {
        let m = logged(fmt, blocks, true);
        let l = m.with_table(|pt| pt.leaves(GPA, SIZE)).unwrap();
        assert_eq!(l.len(), leaves, "{blocks:?}: split or not");
        let reader = m.reader();
        let mut bm = vec![0u64; (PAGES / 64) as usize];
        assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), 0, "tracked, clean");
        // Two writes into the first block.
        for p in [5u64, 300] {
            reader.hw_dirty_update(GPA + p * 4096).unwrap();
        }
        assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), reported, "{blocks:?}");
        assert_eq!(bm[(SIZE / 2 / 4096 / 64) as usize], 0, "the other block");
        // CLEAR of one 64-page word: a block is cleaned whole, a page
        // alone; the block's other bits stay set until cleared.
        let word = [bm[0], 0];
        let cleared = m.clear_dirty_log(0, 0, 128, &word).unwrap();
        assert_eq!(cleared, u64::from(bm[0].count_ones()));
        assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), reported - cleared);
        m.clear_dirty_log(0, 0, PAGES, &bm).unwrap();
        assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), 0, "all clean");
        // The next write dirties again.
        reader.hw_dirty_update(GPA + 7 * 4096).unwrap();
        let want = if blocks == HwDirtyBlocks::SplitFirst {
            1
        } else {
            512
        };
        assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), want);
        assert_eq!(count(&bm), want);
    }
}

#[test]
fn arm64_dbm_blocks_logged_whole_or_split() {
    blocks_logged_whole_or_split(Arm64Stage2::new(Granule::K4, 40).unwrap());
}

#[test]
fn ept_blocks_logged_whole_or_split() {
    blocks_logged_whole_or_split(EptStage2::new(4).unwrap());
}

#[test]
fn get_without_manual_protect_cleans_a_whole_block() {
    let m = logged(
        EptStage2::new(4).unwrap(),
        HwDirtyBlocks::LogWholeBlocks,
        false,
    );
    let reader = m.reader();
    let mut bm = vec![0u64; (PAGES / 64) as usize];
    reader.hw_dirty_update(GPA + BLOCK + 4096).unwrap();
    assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), 512);
    assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), 0, "cleaned by GET");
    reader.hw_dirty_update(GPA + BLOCK).unwrap();
    assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), 512, "logs again");
}

#[test]
fn initially_set_bitmaps_split_on_clear_without_eager_split() {
    // With initially-set bitmaps enabling logging splits nothing; without
    // an eager-split policy CLEAR must still split for hardware dirty
    // state, whose writes never fault (before, the blocks stayed whole and
    // one write reported 512 pages).
    for blocks in [HwDirtyBlocks::SplitFirst, HwDirtyBlocks::LogWholeBlocks] {
        let policy = MmuPolicy {
            dirty: DirtyMode::Hardware {
                protect: Protect::Manual {
                    initially_set: true,
                },
                blocks,
            },
            eager_split_chunk: None,
            ..MmuPolicy::default()
        };
        let m = mmu(EptStage2::new(4).unwrap(), policy).unwrap();
        map_blocks_and_log(&m);
        let mut bm = vec![0u64; (PAGES / 64) as usize];
        assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), PAGES, "initially set");
        // CLEAR the first 64 pages: their range is split (SplitFirst).
        m.clear_dirty_log(0, 0, 64, &bm[..1]).unwrap();
        let l = m.with_table(|pt| pt.leaves(GPA, SIZE)).unwrap();
        // SplitFirst: the word's range became pages (KVM's split of the
        // range CLEAR protects), the second block is whole.
        if blocks == HwDirtyBlocks::LogWholeBlocks {
            assert_eq!(l.len(), 2, "{blocks:?}");
        } else {
            assert!(l.iter().take(64).all(|x| x.size == 4096), "{blocks:?}");
            assert_eq!(l.last().unwrap().size, BLOCK, "second block untouched");
        }
    }
}
