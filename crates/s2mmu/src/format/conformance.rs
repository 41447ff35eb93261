//! The properties every [`PteFormat`] must have, checked on every format
//! the engine ships (arm64 stage 2 at each granule and IPA size, EPT with 4
//! and 5 levels), the way `dirty/conformance.rs` checks every tracker: the
//! trait's `# Safety` obligations, which the walker's raw-pointer indexing
//! rests on, as proptest properties over addresses, levels, permissions and
//! arbitrary descriptor values. A new format lists its configurations in
//! its own file (`conformance_configs`) and its name in `format/mod.rs`'s
//! `formats!`, and runs them all.

use super::arm64::{Arm64Stage2, Granule};
use super::pte::{Prot, PteFormat};
use alloc::boxed::Box;
use alloc::vec::Vec;
use proptest::prelude::*;

/// One format under test, as the generic checks see it.
pub(super) trait Check {
    fn geometry(&self);
    fn entries(&self, pa_seed: u64, level_seed: u32, prot_bits: u32, offset_seed: u64, any: u64);
}

impl<F: PteFormat + core::fmt::Debug> Check for F {
    fn geometry(&self) {
        geometry(self);
    }
    fn entries(&self, pa_seed: u64, level_seed: u32, prot_bits: u32, offset_seed: u64, any: u64) {
        entries(self, pa_seed, level_seed, prot_bits, offset_seed, any);
    }
}

/// Every format the engine ships, in every configuration it accepts.
fn formats() -> Vec<Box<dyn Check>> {
    super::id::conformance_formats()
}

/// The geometry obligations, and that every address of the IPA space
/// indexes inside the root at the start level.
fn geometry<F: PteFormat + core::fmt::Debug>(f: &F) {
    assert!(matches!(f.page_shift(), 12 | 14 | 16), "{f:?}");
    assert!(f.start_level() <= f.last_level(), "{f:?}");
    assert!((1..=16).contains(&f.root_pages()), "{f:?}");
    assert!(f.ipa_bits() <= 57 && f.pa_bits() <= 52, "{f:?}");
    assert!(f.leaf_allowed(f.last_level()), "{f:?}: pages are leaves");
    // The last address and the first of each root page: the root page
    // number and the index stay in bounds (index() masks, so the page
    // number is what can overflow).
    let limit = f.ipa_limit();
    let span = f.root_page_span();
    for addr in [0, limit - 1, limit / 2, limit.saturating_sub(span)] {
        let page = addr / span;
        assert!(
            page < f.root_pages() as u64,
            "{f:?}: {addr:#x} in root page {page}"
        );
        assert!(f.index(addr, f.start_level()) < f.entries_per_table());
    }
    let covered = span.saturating_mul(f.root_pages() as u64);
    assert!(covered >= limit, "{f:?}: the root covers the IPA space");
}

/// The table and not-a-table obligations for one address, level,
/// permission set and arbitrary value.
fn entries<F: PteFormat + core::fmt::Debug>(
    f: &F,
    pa_seed: u64,
    level_seed: u32,
    prot_bits: u32,
    offset_seed: u64,
    any: u64,
) {
    let last = f.last_level();
    let levels = last - f.start_level() + 1;
    let level = f.start_level() + level_seed % levels;
    let pa_mask = (1u64 << f.pa_bits()) - 1;
    // Tables: every level above the last, any page-aligned address.
    let table_pa = pa_seed & pa_mask & !(f.page_size() - 1);
    if level < last {
        let t = f.table_pte(table_pa);
        assert!(
            f.is_table(t, level) && f.is_valid(t),
            "{f:?}: table at {level}"
        );
        assert_eq!(f.output_address(t), table_pa, "{f:?}");
    }
    // Nothing is a table at the last level, whatever its bits.
    assert!(
        !f.is_table(any, last),
        "{f:?}: {any:#x} a table at the last level"
    );
    for v in [0, f.locked()] {
        assert!(!f.is_valid(v) && !f.is_table(v, level), "{f:?}: {v:#x}");
    }
    assert!(f.is_locked(f.locked()));
    // Leaves and everything the engine derives from them.
    if !f.leaf_allowed(level) {
        return;
    }
    let Ok(prot) = Prot::from_bits(prot_bits & 0x1f) else {
        unreachable!("masked to the known bits")
    };
    let block = f.granule(level);
    let pa = pa_seed & pa_mask & !(block - 1);
    let Ok(leaf) = f.leaf_pte(pa, level, prot) else {
        return; // contradictory permissions: refused, nothing stored
    };
    assert!(f.is_valid(leaf), "{f:?}: leaf {leaf:#x}");
    assert_eq!(f.output_address(leaf), pa, "{f:?}: leaf {leaf:#x}");
    let mut derived = alloc::vec![
        leaf,
        leaf | f.perm_bits(Prot::RWX),
        leaf | f.perm_bits(prot),
        f.with_exec(leaf),
        leaf | f.write_bit(),
        leaf & !f.write_bit(),
        leaf | f.access_flag(),
        leaf & !f.access_flag(),
    ];
    if let Some(hw) = f.hw_dirty_bits() {
        derived.push(hw.clean(leaf));
        derived.push(leaf | hw.update_set);
        derived.push(leaf & !hw.freeze_clear);
        derived.push(hw.clean(leaf) | hw.update_set);
    }
    if level < last {
        // A block's pages: advance by a child-aligned offset inside it.
        let child = f.granule(level + 1);
        let offset = (offset_seed % (block / child)) * child;
        let page = f.advance_leaf(f.relevel_leaf(leaf, level, level + 1), offset);
        assert_eq!(f.output_address(page), pa + offset, "{f:?}: advance");
        assert!(!f.is_table(page, level + 1), "{f:?}: {page:#x}");
        derived.push(f.relevel_leaf(page, level + 1, level));
    }
    for d in derived {
        assert!(
            !f.is_table(d, level),
            "{f:?}: derived leaf {d:#x} is a table at {level}"
        );
    }
}

#[test]
fn every_format_has_its_geometry() {
    let all = formats();
    assert!(
        all.len() > 40,
        "the arm64 granule and IPA sizes and EPT: {}",
        all.len()
    );
    for f in &all {
        f.geometry();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn every_format_keeps_its_safety_obligations(
        pa_seed in any::<u64>(),
        level_seed in any::<u32>(),
        prot_bits in any::<u32>(),
        offset_seed in any::<u64>(),
        any_value in any::<u64>(),
    ) {
        for f in formats() {
            f.entries(pa_seed, level_seed, prot_bits, offset_seed, any_value);
        }
    }
}

/// A format that breaks an obligation (its lock marker looks like a table
/// entry) fails the checks: they can fail.
#[test]
fn a_format_that_breaks_an_obligation_fails() {
    #[derive(Clone, Copy, Debug)]
    struct LockIsATable(Arm64Stage2);
    // SAFETY: never used for a table: only handed to the checks, which
    // call its pure methods.
    unsafe impl PteFormat for LockIsATable {
        fn page_shift(&self) -> u32 {
            self.0.page_shift()
        }
        fn ipa_bits(&self) -> u32 {
            self.0.ipa_bits()
        }
        fn pa_bits(&self) -> u32 {
            self.0.pa_bits()
        }
        fn start_level(&self) -> u32 {
            self.0.start_level()
        }
        fn root_pages(&self) -> usize {
            self.0.root_pages()
        }
        fn leaf_allowed(&self, level: u32) -> bool {
            self.0.leaf_allowed(level)
        }
        fn is_valid(&self, pte: u64) -> bool {
            self.0.is_valid(pte)
        }
        fn is_table(&self, pte: u64, level: u32) -> bool {
            self.0.is_table(pte, level)
        }
        fn table_pte(&self, pa: u64) -> u64 {
            self.0.table_pte(pa)
        }
        fn leaf_pte(&self, pa: u64, level: u32, prot: Prot) -> crate::Result<u64> {
            self.0.leaf_pte(pa, level, prot)
        }
        fn output_address(&self, pte: u64) -> u64 {
            self.0.output_address(pte)
        }
        fn prot(&self, pte: u64) -> Prot {
            self.0.prot(pte)
        }
        fn perm_bits(&self, prot: Prot) -> u64 {
            self.0.perm_bits(prot)
        }
        fn write_bit(&self) -> u64 {
            self.0.write_bit()
        }
        fn access_flag(&self) -> u64 {
            self.0.access_flag()
        }
        fn with_exec(&self, pte: u64) -> u64 {
            self.0.with_exec(pte)
        }
        fn relevel_leaf(&self, pte: u64, from: u32, to: u32) -> u64 {
            self.0.relevel_leaf(pte, from, to)
        }
        fn locked(&self) -> u64 {
            0b11
        }
    }
    let bad = LockIsATable(Arm64Stage2::new(Granule::K4, 40).unwrap());
    let r = std::panic::catch_unwind(|| entries(&bad, 0x4000_0000, 0, 3, 0, 0));
    assert!(
        r.is_err(),
        "a lock marker that is a valid table entry must fail"
    );
}
