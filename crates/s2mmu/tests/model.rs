//! Property tests: random operation sequences on the table and on a plain
//! reference model must agree on every leaf, on errors, on invalidations,
//! and must leak no table page; for arm64 stage 2 at every granule and for
//! x86 EPT with 4 and 5 levels.

mod common;

use common::model::{apply, block_pages, Model, Op};
use proptest::prelude::*;
use s2mmu::format::arm64::{Arm64Stage2, Granule};
use s2mmu::format::ept::EptStage2;
use s2mmu::PteFormat;

fn op_strategy(window_pages: u64, block: u64) -> impl Strategy<Value = Op> {
    let page = 0..window_pages;
    let bpage = (0..window_pages / block).prop_map(move |b| b * block);
    let anypage = prop_oneof![page.clone(), bpage];
    let pages = prop_oneof![1..16u64, (1..3u64).prop_map(move |n| n * block)];
    prop_oneof![
        4 => (anypage.clone(), pages.clone(), 0..8u64, any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(move |(page, pages, pa, pa_block, writable, force)| Op::Map {
                page,
                pages,
                pa_page: if pa_block { pa * block } else { pa * 3 },
                writable,
                force,
            }),
        2 => (anypage.clone(), pages.clone()).prop_map(|(page, pages)| Op::Unmap { page, pages }),
        2 => (anypage.clone(), pages.clone()).prop_map(|(page, pages)| Op::Wrprotect { page, pages }),
        2 => page.prop_map(|page| Op::Relax { page }),
        2 => (anypage, pages, any::<u8>()).prop_map(|(page, pages, policy)| Op::Split { page, pages, policy }),
        1 => (0..40usize).prop_map(|pages| Op::TopUp { pages }),
    ]
}

fn run(granule: Granule, ops: &[Op]) {
    let fmt = Arm64Stage2::new(granule, 40).unwrap();
    run_format(fmt, block_pages(granule), ops);
}

/// The same operations on a table of any format and on the model of that
/// format (the walker, the operations and split are format-agnostic; this
/// is what shows it): `block` pages to the second-smallest leaf.
fn run_format<F: PteFormat>(fmt: F, block: u64, ops: &[Op]) {
    let page = fmt.page_size();
    let window = 4 * block * page;
    let base = 1u64 << 32;
    let mut fx = common::fixture_for(fmt.clone());
    let mut m = Model::with_format(fmt, base, window);
    fx.cache.top_up(8).unwrap();
    for op in ops {
        apply(&mut fx, &mut m, op);
    }
    drop(fx.cache);
    drop(fx.pt);
    assert!(fx.mm.flush_deferred(), "deferred frees ran");
    assert_eq!(
        fx.mm.stats().live_pages,
        0,
        "every table page is freed at the end"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_ops_4k(ops in prop::collection::vec(op_strategy(4 * 512, 512), 1..40)) {
        run(Granule::K4, &ops);
    }

    #[test]
    fn random_ops_ept_4_level(ops in prop::collection::vec(op_strategy(4 * 512, 512), 1..40)) {
        run_format(EptStage2::new(4).unwrap(), 512, &ops);
    }

    #[test]
    fn random_ops_ept_5_level(ops in prop::collection::vec(op_strategy(4 * 512, 512), 1..40)) {
        run_format(EptStage2::new(5).unwrap(), 512, &ops);
    }

    #[test]
    fn random_ops_16k(ops in prop::collection::vec(op_strategy(4 * 2048, 2048), 1..25)) {
        run(Granule::K16, &ops);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn random_ops_64k(ops in prop::collection::vec(op_strategy(4 * 8192, 8192), 1..12)) {
        run(Granule::K64, &ops);
    }
}
