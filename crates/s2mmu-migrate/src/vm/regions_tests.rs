//! [`RamRegions`]' checks and numbering, and [`GuestRam`]'s default
//! copies over two regions (run under Miri too: they read and write
//! through raw host addresses).

use super::regions::{MAX_RAM, MAX_REGIONS};
use super::{GuestRam, RamRegion, RamRegions, RamSlot, RegionError, PAGE_SIZE};
use std::sync::atomic::{AtomicU64, Ordering};

const P: u64 = PAGE_SIZE as u64;

fn r(gpa: u64, host_addr: u64, pages: u64) -> RamRegion {
    RamRegion {
        gpa,
        host_addr,
        size: pages * P,
    }
}

#[test]
fn regions_are_numbered_in_guest_physical_order() {
    // Given out of order: above the hole first.
    let rs = RamRegions::new(&[r(0x1_0000_0000, 0x40_0000, 3), r(0, 0x10_0000, 2)]).unwrap();
    assert_eq!(rs.size(), 5 * P);
    assert_eq!(
        rs.slots(),
        &[
            RamSlot {
                id: 0,
                gpa: 0,
                size: 2 * P,
                mem_offset: 0
            },
            RamSlot {
                id: 1,
                gpa: 0x1_0000_0000,
                size: 3 * P,
                mem_offset: 2 * P
            },
        ]
    );
    assert_eq!(rs.regions()[0].host_addr, 0x10_0000);
    assert_eq!(rs.offset_of(0), Some(0));
    assert_eq!(rs.offset_of(2 * P - 1), Some(2 * P - 1));
    assert_eq!(rs.offset_of(2 * P), None, "in the hole");
    assert_eq!(rs.offset_of(0x1_0000_0000 + P + 8), Some(3 * P + 8));
    assert_eq!(rs.offset_of(0x1_0000_0000 + 3 * P), None, "past the top");
    assert_eq!(rs.gpa_of(3 * P + 8), Some(0x1_0000_0000 + P + 8));
    assert_eq!(rs.gpa_of(5 * P), None);
    assert_eq!(rs.host_span(0), Some((0x10_0000, 2 * P)));
    assert_eq!(rs.host_span(P), Some((0x10_0000 + P, P)));
    assert_eq!(rs.host_span(2 * P), Some((0x40_0000, 3 * P)));
    assert_eq!(rs.host_span(5 * P), None);
    // Every page's offset and address agree both ways.
    for s in rs.slots() {
        for i in 0..s.size / P {
            let gpa = s.gpa + i * P;
            assert_eq!(rs.gpa_of(rs.offset_of(gpa).unwrap()), Some(gpa));
        }
    }
}

#[test]
fn bad_regions_are_refused_by_name() {
    let new = |v: &[RamRegion]| RamRegions::new(v).unwrap_err();
    assert_eq!(new(&[]), RegionError::Empty);
    let unaligned = |gpa, host_addr, size| {
        new(&[
            r(0, 0x1000_0000, 1),
            RamRegion {
                gpa,
                host_addr,
                size,
            },
        ])
    };
    assert_eq!(
        unaligned(0x10_0008, 0, P),
        RegionError::Unaligned {
            index: 1,
            field: "gpa",
            value: 0x10_0008
        }
    );
    assert!(matches!(
        unaligned(P, 8, P),
        RegionError::Unaligned {
            field: "host_addr",
            ..
        }
    ));
    assert!(matches!(
        unaligned(P, 0, 100),
        RegionError::Unaligned { field: "size", .. }
    ));
    assert_eq!(unaligned(P, 0, 0), RegionError::ZeroSize { index: 1 });
    assert_eq!(
        unaligned(u64::MAX - P + 1, 0, P),
        RegionError::Wraps {
            index: 1,
            field: "gpa"
        }
    );
    assert_eq!(
        new(&[r(0, 0, 1), r(0x1000_0000, 0x1000_0000, MAX_RAM / P)]),
        RegionError::TooLarge {
            total: MAX_RAM + P,
            max: MAX_RAM
        }
    );
    assert_eq!(
        new(&[r(0, 0, 4), r(8 * P, 0x10_0000, 2), r(3 * P, 0x20_0000, 1)]),
        RegionError::GuestOverlap {
            first: 0,
            second: 2
        }
    );
    assert_eq!(
        new(&[r(0, 0x10_0000, 4), r(8 * P, 0x10_0000 + 3 * P, 2)]),
        RegionError::HostOverlap {
            first: 0,
            second: 1
        }
    );
    let many: Vec<RamRegion> = (0..=MAX_REGIONS as u64)
        .map(|i| r(i * P, i * P, 1))
        .collect();
    assert_eq!(
        new(&many),
        RegionError::TooMany {
            count: MAX_REGIONS + 1,
            max: MAX_REGIONS
        }
    );
    // Touching is not overlapping; the error names the regions by position.
    assert!(RamRegions::new(&[r(P, 0x10_0000 + P, 1), r(0, 0x10_0000, 1)]).is_ok());
    assert!(new(&[r(0, 0, 1), r(0, P, 1)])
        .to_string()
        .contains("regions 0 and 1"));
}

/// Two regions carved out of one allocation of words, in the opposite
/// order in host memory to their guest-physical order.
struct TwoRegions {
    words: Box<[AtomicU64]>,
    regions: RamRegions,
}

impl TwoRegions {
    fn new() -> TwoRegions {
        // 3 pages plus a page of slack to align to a page.
        let words: Box<[AtomicU64]> = (0..4 * P / 8).map(|_| AtomicU64::new(0)).collect();
        let base = (words.as_ptr() as u64).next_multiple_of(P);
        // gpa 0: one page at host page 2; gpa 0x10000: two pages at host page 0.
        let regions = RamRegions::new(&[r(0, base + 2 * P, 1), r(0x10000, base, 2)]).unwrap();
        TwoRegions { words, regions }
    }

    /// The word at host address `host`.
    fn word(&self, host: u64) -> u64 {
        let i = (host - self.words.as_ptr() as u64) / 8;
        self.words[i as usize].load(Ordering::Relaxed)
    }
}

// SAFETY: every region lies inside `words`, which the value owns
// (page-aligned within it, 8-byte aligned), and only atomic word accesses
// touch it.
unsafe impl GuestRam for TwoRegions {
    fn size(&self) -> u64 {
        self.regions.size()
    }
    fn host_span(&self, offset: u64) -> Option<(u64, u64)> {
        self.regions.host_span(offset)
    }
}

#[test]
fn default_copies_cross_regions_word_by_word() {
    let ram = TwoRegions::new();
    assert_eq!(ram.size(), 3 * P);
    // The last two words of region 0 and the first two of region 1.
    let data: Vec<u8> = (0..32u8).collect();
    assert!(ram.write_from(P - 16, &data));
    let (h0, _) = ram.host_span(P - 16).unwrap();
    let (h1, n1) = ram.host_span(P).unwrap();
    assert_eq!(n1, 2 * P);
    assert_eq!(
        ram.word(h0),
        u64::from_le_bytes(data[..8].try_into().unwrap())
    );
    assert_eq!(
        ram.word(h1 + 8),
        u64::from_le_bytes(data[24..].try_into().unwrap())
    );
    let mut back = [0xffu8; 32];
    assert!(ram.read_into(P - 16, &mut back));
    assert_eq!(&back[..], &data[..]);
    assert_eq!(ram.host_range(P - 16, 16), Some(h0));
    assert_eq!(ram.host_range(P - 16, 24), None, "not in one mapping");
    // Refused, and nothing touched: past the end, unaligned.
    let mut out = [7u8; 16];
    assert!(!ram.read_into(3 * P - 8, &mut out));
    assert!(!ram.read_into(4, &mut out[..8]));
    assert!(!ram.read_into(0, &mut out[..5]));
    assert_eq!(out, [7u8; 16]);
    assert!(!ram.write_from(3 * P - 8, &[1u8; 16]));
    let mut last = [0u8; 8];
    assert!(ram.read_into(3 * P - 8, &mut last));
    assert_eq!(last, [0u8; 8]);
}
