//! Fuzzes sequences of table operations against the reference model shared
//! with the property tests (`crates/s2mmu/tests/common`): every leaf,
//! error, invalidation and table page must agree.
//!
//! `cargo +nightly fuzz run ops` (install with `cargo install cargo-fuzz`).
#![no_main]

#[path = "../../crates/s2mmu/tests/common/mod.rs"]
mod common;

use common::model::{apply, block_pages, Model, Op};
use libfuzzer_sys::fuzz_target;
use s2mmu::format::arm64::Granule;

fuzz_target!(|data: &[u8]| {
    let granule = match data.first().map(|b| b % 3) {
        Some(1) => Granule::K16,
        Some(2) => Granule::K64,
        _ => Granule::K4,
    };
    let block = block_pages(granule);
    let page = 1u64 << granule.shift();
    let window_pages = 4 * block;
    let mut fx = common::fixture(granule, 40);
    let mut m = Model::new(granule, 40, 1 << 32, window_pages * page);
    for chunk in data.get(1..).unwrap_or(&[]).chunks(8).take(32) {
        if let Some(op) = Op::from_bytes(chunk, window_pages, block) {
            apply(&mut fx, &mut m, &op);
        }
    }
});
