//! The host side of EL2's break-before-make trace without QEMU: records
//! encoded as EL2 writes them, decoded and replayed into the engine's
//! checker. A block split with its invalidation between break and make is
//! clean; the same split without it is flagged.

use s2mmu::bbm::{Event, Flush, Rule};
use s2mmu::format::arm64::{Arm64Stage2, Granule};
use s2mmu_el2::trace::{self, Record};

/// A 2 MiB block (level 2) at backing 0x4400_0000: valid, AF, read-write.
const BLOCK: u64 = 0x4400_0000 | 1 << 10 | 3 << 6 | 0b01;
/// A level-2 table entry pointing at table page 0x4180_1000.
const TABLE: u64 = 0x4180_1000 | 0b11;

/// The records of a split of the block at 0x8000_0000 in `table`, with or
/// without the invalidation of the break.
fn split(table: usize, invalidate: bool) -> Vec<u8> {
    let start = 0x8000_0000;
    let store = |old, new| {
        Record::Event(Event::Store {
            table,
            start,
            level: 2,
            old,
            new,
        })
    };
    let mut recs = vec![store(BLOCK, 0)];
    if invalidate {
        recs.push(Record::Event(Event::Invalidate {
            table,
            flush: Flush::Range(start, 2 << 20),
        }));
    }
    recs.push(store(0, TABLE));
    recs.iter()
        .flat_map(|r| trace::encode(r).map(u64::to_le_bytes))
        .flatten()
        .collect()
}

fn replay(bytes: &[u8]) -> usize {
    let fmt = Arm64Stage2::new(Granule::K4, 40).unwrap();
    let n = bytes.len() / (trace::WORDS * 8);
    let recs = trace::decode_all(bytes, n).unwrap();
    for r in &recs {
        match r {
            Record::Event(e) => s2mmu::bbm::export::replay(&fmt, e),
            Record::Withheld { table } => s2mmu::bbm::expect_violations(*table),
        }
    }
    n
}

#[test]
fn a_split_is_clean_with_its_invalidation_and_flagged_without() {
    let (good, bad) = (0x7000_0000_usize, 0x7100_0000_usize);
    s2mmu::bbm::expect_violations(bad);
    assert_eq!(replay(&split(good, true)), 3);
    assert_eq!(replay(&split(bad, false)), 2);
    assert_eq!(s2mmu::bbm::take_violations(), vec![]);
    let caught = s2mmu::bbm::take_table_violations(bad);
    assert_eq!(caught.len(), 1, "{caught:?}");
    assert_eq!(caught[0].rule, Rule::MakeBeforeInvalidate);
    assert_eq!(caught[0].ipa, 0x8000_0000);
    assert_eq!(caught[0].level, 2);
}
