//! Collapse: huge mappings made again in place from tables of
//! contiguous pages when dirty logging stops.

mod common;

use common::fixture;
use s2mmu::format::arm64::Granule;
use s2mmu::tlb::TlbCall;
use s2mmu::Prot;

const MIB: u64 = 1 << 20;

/// Collapse: tables of contiguous pages become blocks again in place, with
/// one whole-VMID invalidation per pass, whatever the pages' permissions;
/// tables that are not whole, contiguous or inside the range stay.
#[test]
fn collapse_makes_blocks_of_contiguous_pages_in_place() {
    let mut fx = fixture(Granule::K4, 40);
    let base = 1u64 << 32;
    fx.cache.top_up(64).unwrap();
    // 6 MiB of pages at a 2 MiB-aligned PA; logging left some read-only.
    fx.map_pages(base, 6 * MIB, 0x80_0000_0000);
    fx.pt.wrprotect(base + 0x5000, 0x3000).unwrap();
    // The third 2 MiB: one page maps elsewhere (not contiguous).
    fx.pt.unmap(base + 4 * MIB + 0x1000, 0x1000).unwrap();
    fx.map_pages(base + 4 * MIB + 0x1000, 0x1000, 0x99_0000_0000);
    fx.tlb.take();
    let st = fx.pt.collapse(base, 6 * MIB, 2 * MIB, Prot::RWX).unwrap();
    assert_eq!((st.blocks, st.flushes), (2, 1));
    assert_eq!(
        fx.tlb.take(),
        vec![TlbCall::Vmid],
        "one invalidation for the pass"
    );
    for off in [0, 2 * MIB] {
        let t = fx.pt.translate(base + off + 0x5123).unwrap();
        assert_eq!((t.size, t.pa), (2 * MIB, 0x80_0000_0000 + off + 0x5123));
        assert!(
            t.prot.contains(Prot::RWX),
            "the block gets the slot's permissions"
        );
    }
    assert_eq!(
        fx.pt.translate(base + 4 * MIB).unwrap().size,
        4096,
        "not contiguous: stays"
    );
    assert!(fx.mm.flush_deferred());
    fx.assert_no_leak();
    // A range that cuts a table leaves it alone; nothing to do, no flush.
    let st = fx
        .pt
        .collapse(base + 4 * MIB + 4096, MIB, 2 * MIB, Prot::RWX)
        .unwrap();
    assert_eq!(st, s2mmu::CollapseStats::default());
    assert!(fx.tlb.take().is_empty());
}

#[test]
fn collapse_climbs_to_1g_blocks_in_two_passes() {
    let mut fx = fixture(Granule::K4, 40);
    let base = 1u64 << 30;
    fx.cache.top_up(fx.pt.split_capacity(1 << 30) + 8).unwrap();
    fx.map_pages(base, 1 << 30, 0x40_0000_0000);
    let st = fx.pt.collapse(base, 1 << 30, 1 << 30, Prot::RW).unwrap();
    assert_eq!((st.blocks, st.flushes), (512 + 1, 2));
    let t = fx.pt.translate(base + 12345).unwrap();
    assert_eq!((t.size, t.level), (1 << 30, 1));
    assert!(fx.mm.flush_deferred());
    fx.assert_no_leak();
    // At most 2 MiB: the 1 GiB block is not split back, and a table of
    // pages only becomes 2 MiB blocks.
    let mut fx = fixture(Granule::K4, 40);
    fx.cache.top_up(fx.pt.split_capacity(4 * MIB) + 8).unwrap();
    fx.map_pages(base, 4 * MIB, 0x40_0000_0000);
    let st = fx.pt.collapse(base, 4 * MIB, 2 * MIB, Prot::RW).unwrap();
    assert_eq!((st.blocks, st.flushes), (2, 1));
}
