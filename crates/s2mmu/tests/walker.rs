//! The walker's contract: which entries it visits, in what order, and how
//! visitors steer it.

mod common;

use common::fixture;
use s2mmu::format::arm64::Granule;
use s2mmu::walk::{Visit, VisitCtx, WalkAction, WalkFlags};
use s2mmu::{Error, HostMmOps, MapOptions, Prot, PteFormat, SplitPolicy};

type Ctx<'a> = VisitCtx<'a, s2mmu::format::arm64::Arm64Stage2, HostMmOps>;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn mapped_4k(size: u64) -> common::Fixture {
    let mut fx = fixture(Granule::K4, 40);
    fx.cache.top_up(2 + (size >> 21) as usize).unwrap();
    fx.map_pages(GIB, size, 0x10_0000_0000);
    fx
}

#[test]
fn visits_every_entry_of_a_range_in_order() {
    let mut fx = mapped_4k(4 * MIB);
    let mut seen = Vec::new();
    let mut v = |ctx: &Ctx<'_>, visit: Visit| {
        seen.push((ctx.addr, ctx.level, visit));
        Ok(WalkAction::Continue)
    };
    let flags = WalkFlags::LEAF | WalkFlags::TABLE_PRE | WalkFlags::TABLE_POST;
    fx.pt
        .walk(GIB + 2 * MIB - 8192, 16384, flags, &mut v)
        .unwrap();
    let l3: Vec<_> = seen.iter().filter(|s| s.1 == 3).map(|s| s.0).collect();
    assert_eq!(
        l3,
        vec![
            GIB + 2 * MIB - 8192,
            GIB + 2 * MIB - 4096,
            GIB + 2 * MIB,
            GIB + 2 * MIB + 4096
        ]
    );
    // Two level-2 tables, each with a pre and a post visit around its pages.
    let pre = seen
        .iter()
        .filter(|s| s.2 == Visit::TablePre && s.1 == 2)
        .count();
    let post = seen
        .iter()
        .filter(|s| s.2 == Visit::TablePost && s.1 == 2)
        .count();
    assert_eq!((pre, post), (2, 2));
    let first_post = seen.iter().position(|s| s.2 == Visit::TablePost).unwrap();
    assert!(
        seen[..first_post].iter().any(|s| s.1 == 3),
        "post comes after children"
    );
}

#[test]
fn unaligned_range_covers_every_touched_page() {
    // KVM rounds the end from the aligned start and drops the tail page
    // (addr 0x1800 size 0x1000 walks only one page); this walker does not.
    let mut fx = mapped_4k(2 * MIB);
    let mut n = 0;
    let mut v = |_: &Ctx<'_>, _: Visit| {
        n += 1;
        Ok(WalkAction::Continue)
    };
    fx.pt
        .walk(GIB + 0x1800, 0x1000, WalkFlags::LEAF, &mut v)
        .unwrap();
    assert_eq!(n, 2);
}

#[test]
fn walk_starting_inside_a_block_sees_unaligned_address() {
    let mut fx = fixture(Granule::K4, 40);
    fx.cache.top_up(2).unwrap();
    fx.pt
        .map(
            GIB,
            2 * MIB,
            0x4000_0000,
            Prot::RW,
            &mut fx.cache,
            MapOptions::default(),
        )
        .unwrap();
    let mut seen = Vec::new();
    let mut v = |ctx: &Ctx<'_>, _: Visit| {
        seen.push((ctx.addr, ctx.entry_start(), ctx.level));
        Ok(WalkAction::Continue)
    };
    fx.pt
        .walk(GIB + 0x3000, 0x2000, WalkFlags::LEAF, &mut v)
        .unwrap();
    assert_eq!(
        seen,
        vec![(GIB + 0x3000, GIB, 2)],
        "one visit of the block, mid-block address"
    );
}

#[test]
fn skip_siblings_leaves_the_table() {
    let mut fx = mapped_4k(4 * MIB);
    let mut l3 = 0;
    let mut v = |ctx: &Ctx<'_>, _: Visit| {
        if ctx.level == 3 {
            l3 += 1;
            return Ok(WalkAction::SkipSiblings);
        }
        Ok(WalkAction::Continue)
    };
    let st = fx.pt.walk(GIB, 4 * MIB, WalkFlags::LEAF, &mut v).unwrap();
    assert_eq!(l3, 2, "one page per level-3 table");
    assert_eq!(st.visits, 2);
}

#[test]
fn skip_children_skips_the_subtree() {
    let mut fx = mapped_4k(4 * MIB);
    let mut leaves = 0;
    let mut tables = 0;
    let mut v = |ctx: &Ctx<'_>, visit: Visit| {
        match visit {
            Visit::TablePre if ctx.level == 2 => {
                tables += 1;
                return Ok(WalkAction::SkipChildren);
            }
            Visit::Leaf => leaves += 1,
            _ => {}
        }
        Ok(WalkAction::Continue)
    };
    fx.pt
        .walk(GIB, 4 * MIB, WalkFlags::LEAF | WalkFlags::TABLE_PRE, &mut v)
        .unwrap();
    assert_eq!((tables, leaves), (2, 0));
}

#[test]
fn a_table_installed_by_a_leaf_visit_is_descended_into() {
    let mut fx = fixture(Granule::K4, 40);
    fx.cache.top_up(2).unwrap();
    let child = {
        // Map installs a level-2 and a level-3 table from leaf visits of
        // empty entries; it can only reach level 3 by descending into them.
        fx.pt
            .map(
                GIB,
                4096,
                0x1000,
                Prot::R,
                &mut fx.cache,
                MapOptions::default(),
            )
            .unwrap();
        fx.pt.leaves(GIB, 4096).unwrap()[0]
    };
    assert_eq!(
        child.level, 3,
        "map descended through the tables it installed"
    );
    let mut levels = Vec::new();
    let mut v = |ctx: &Ctx<'_>, _: Visit| {
        levels.push(ctx.level);
        Ok(WalkAction::Continue)
    };
    fx.pt.walk(GIB, 4096, WalkFlags::LEAF, &mut v).unwrap();
    assert_eq!(levels, vec![3]);
}

#[test]
fn visitor_errors_stop_the_walk_unless_ignored() {
    let mut fx = mapped_4k(2 * MIB);
    let mut n = 0;
    let mut v = |ctx: &Ctx<'_>, _: Visit| {
        n += 1;
        Err(Error::Again { ipa: ctx.addr })
    };
    let r = fx.pt.walk(GIB, 2 * MIB, WalkFlags::LEAF, &mut v);
    assert_eq!(r, Err(Error::Again { ipa: GIB }));
    assert_eq!(n, 1);
    let mut n = 0;
    let mut v = |ctx: &Ctx<'_>, _: Visit| {
        n += 1;
        Err(Error::Again { ipa: ctx.addr })
    };
    fx.pt
        .walk(
            GIB,
            2 * MIB,
            WalkFlags::LEAF | WalkFlags::IGNORE_AGAIN,
            &mut v,
        )
        .unwrap();
    assert_eq!(n, 512);
}

#[test]
fn walk_outside_the_ipa_space_is_refused() {
    let mut fx = fixture(Granule::K4, 36);
    let mut v = |_: &Ctx<'_>, _: Visit| Ok(WalkAction::Continue);
    let r = fx.pt.walk((1 << 36) - 4096, 8192, WalkFlags::LEAF, &mut v);
    assert!(matches!(r, Err(Error::OutOfRange { limit, .. }) if limit == 1 << 36));
}

#[test]
fn concatenated_roots_are_walked_across() {
    // 4K with 42 IPA bits: 8 concatenated level-1 root pages of 512 GiB each.
    let mut fx = fixture(Granule::K4, 42);
    assert_eq!(fx.pt.format().root_pages(), 8);
    fx.cache.top_up(4).unwrap();
    let a = (512 * GIB) - 2 * MIB;
    fx.pt
        .map(
            a,
            4 * MIB,
            a,
            Prot::RW,
            &mut fx.cache,
            MapOptions::default(),
        )
        .unwrap();
    let leaves = fx.pt.leaves(a, 4 * MIB).unwrap();
    assert_eq!(leaves.len(), 2);
    assert_eq!(
        leaves[1].ipa,
        512 * GIB,
        "second block is in the second root page"
    );
    assert_eq!(fx.pt.translate(512 * GIB + 5).unwrap().pa, 512 * GIB + 5);
}

#[test]
fn split_policies_visit_what_they_should() {
    // Already split to pages: the full walk reads every page entry, the
    // skipping walk one per last-level table.
    let mut full = 0;
    let mut skip = 0;
    let mut flag = 0;
    for (policy, out) in [
        (SplitPolicy::FullWalk, &mut full),
        (SplitPolicy::SkipReturns, &mut skip),
        (SplitPolicy::NoLastLevelTables, &mut flag),
    ] {
        let mut fx = mapped_4k(64 * MIB);
        let st = fx.pt.split(GIB, 64 * MIB, &mut fx.cache, policy).unwrap();
        assert_eq!(st.blocks_split, 0);
        *out = st.entries;
    }
    assert_eq!(full, 1 + 32 + 32 * 512);
    assert_eq!(skip, 1 + 32 + 32);
    assert_eq!(flag, 1 + 32);
}

#[test]
fn split_policies_on_blocks_read_what_they_should() {
    // A 1 GiB block split with a full cache becomes a whole subtree in one
    // step. The skip returns (v1) then skip its children; the level flag
    // (v2) still reads the new level-2 table but none of its page tables;
    // the full walk reads everything it built.
    let mut got = Vec::new();
    for policy in [
        SplitPolicy::FullWalk,
        SplitPolicy::SkipReturns,
        SplitPolicy::NoLastLevelTables,
    ] {
        let mut fx = fixture(Granule::K4, 40);
        fx.cache.top_up(1 + 512).unwrap();
        fx.pt
            .map(
                GIB,
                GIB,
                0x40_0000_0000,
                Prot::RW,
                &mut fx.cache,
                MapOptions::default(),
            )
            .unwrap();
        let st = fx.pt.split(GIB, GIB, &mut fx.cache, policy).unwrap();
        assert_eq!((st.blocks_split, st.tables), (1, 513), "{policy:?}");
        assert_eq!(fx.pt.translate(GIB + 0x5000).unwrap().size, 4096);
        got.push((st.entries, st.visits));
    }
    assert_eq!(got[0], (1 + 512 + 512 * 512, 1 + 512 * 512));
    assert_eq!(got[1], (1, 1));
    assert_eq!(got[2], (1 + 512, 1));
}
