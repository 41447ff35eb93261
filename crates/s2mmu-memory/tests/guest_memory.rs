//! Guest memory as both VMs use it: mapped per backing, refused with a
//! typed error when it cannot be, accessed only inside its bounds, and
//! written concurrently without losing bytes.

use s2mmu_memory::{Backing, GuestMemory, MemoryError, PAGE_WORDS};
use std::sync::atomic::Ordering;
use std::sync::Arc;

const MIB: u64 = 1 << 20;
/// The memory of the tests that walk it through the slices: smaller under
/// Miri, which retags the whole slice on each access.
const MEM: u64 = if cfg!(miri) { 64 << 10 } else { MIB };

#[test]
fn anonymous_memory_reads_back_and_refuses_what_is_outside() {
    let m = GuestMemory::new(MIB, Backing::Anonymous).unwrap();
    assert_eq!((m.size(), m.backing()), (MIB, Backing::Anonymous));
    assert_eq!(m.host_addr(), m.as_ptr() as u64);
    assert!(m.write_u64(4096, 0xdead_beef));
    assert_eq!(m.read_u64(4096), Some(0xdead_beef));
    assert_eq!(m.read_u64(MIB - 8), Some(0), "fresh memory is zero");
    // Misaligned, just outside, and offsets whose end overflows u64.
    for bad in [3, MIB, MIB - 4, u64::MAX - 7, u64::MAX] {
        assert_eq!(m.read_u64(bad), None, "{bad:#x}");
        assert!(!m.write_u64(bad, 1), "{bad:#x}");
    }
    let mut buf = [0u8; 16];
    assert!(m.read_into(4096, &mut buf));
    assert_eq!(
        u64::from_le_bytes(buf[..8].try_into().unwrap()),
        0xdead_beef
    );
    assert!(m.write_from(8192, &buf));
    assert_eq!(m.read_u64(8192), Some(0xdead_beef));
    assert!(!m.read_into(MIB - 8, &mut buf), "runs past the end");
    assert!(!m.read_into(u64::MAX - 7, &mut buf), "end overflows");
    assert!(!m.write_from(4, &buf), "misaligned");
    assert!(!m.write_from(0, &buf[..12]), "length not a multiple of 8");
    assert_eq!(m.read_u64(0), Some(0), "a refused write wrote nothing");
}

#[test]
fn words_and_pages_cover_exactly_the_memory_the_word_accessors_reach() {
    let m = GuestMemory::new(MEM, Backing::Anonymous).unwrap();
    let (words, pages) = (m.words(), m.pages());
    assert_eq!(words.len() as u64, MEM / 8);
    assert_eq!(pages.len() as u64, MEM / 4096);
    assert_eq!(words.as_ptr() as u64, m.host_addr());
    assert_eq!(pages.as_ptr() as u64, m.host_addr());
    // The last word of each page through the slices, read back by offset,
    // and the other way round: the same memory, the same layout.
    for (p, page) in pages.iter().enumerate() {
        page[PAGE_WORDS - 1].store(p as u64 + 1, Ordering::Relaxed);
    }
    for p in 0..MEM / 4096 {
        assert_eq!(m.read_u64(p * 4096 + 4088), Some(p + 1), "page {p}");
    }
    assert!(m.write_u64(MEM - 16, 42));
    assert_eq!(words[words.len() - 2].load(Ordering::Relaxed), 42);
    assert_eq!(
        pages[pages.len() - 1][PAGE_WORDS - 2].load(Ordering::Relaxed),
        42
    );
    assert!(words.get(words.len()).is_none() && pages.get(pages.len()).is_none());
}

#[test]
fn write_bytes_takes_any_alignment_and_keeps_the_neighbours() {
    let m = GuestMemory::new(MEM, Backing::Anonymous).unwrap();
    assert!(m.write_u64(0, u64::MAX) && m.write_u64(8, u64::MAX) && m.write_u64(16, u64::MAX));
    m.write_bytes(3, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14])
        .unwrap();
    let mut got = [0u8; 24];
    assert!(m.read_into(0, &mut got));
    let mut want = [0xffu8; 24];
    want[3..17].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]);
    assert_eq!(got, want);
    m.write_bytes(MEM - 1, &[0x5a]).unwrap();
    assert_eq!(m.read_u64(MEM - 8), Some(0x5a << 56));
    m.write_bytes(MEM, &[]).unwrap();
    for (offset, len) in [(MEM - 1, 2), (MEM, 1), (u64::MAX, 1)] {
        let e = m.write_bytes(offset, &vec![7; len]).unwrap_err();
        let want = MemoryError::OutOfRange {
            offset,
            len: len as u64,
            size: MEM,
        };
        assert_eq!(e, want);
        assert!(e.to_string().contains("overrun"), "{e}");
    }
    assert_eq!(
        m.read_u64(MEM - 8),
        Some(0x5a << 56),
        "a refused write wrote nothing"
    );
}

/// Two threads write the two halves of one word byte-wise: each half must
/// always read back as its writer left it (a read-modify-write that is not
/// one atomic step would put the other half's old bytes back).
#[test]
fn concurrent_partial_writes_to_one_word_lose_nothing() {
    // Miri checks each access for data races: fewer rounds, the same steps.
    // Each access borrows the whole memory as a slice, which Miri retags
    // byte by byte: a smaller memory there too.
    const N: u32 = if cfg!(miri) { 200 } else { 1_000_000 };
    const SIZE: u64 = if cfg!(miri) { 16 << 10 } else { MIB };
    let m = Arc::new(GuestMemory::new(SIZE, Backing::Anonymous).unwrap());
    let start = Arc::new(std::sync::Barrier::new(2));
    let writers: Vec<_> = (0..2u64)
        .map(|half| {
            let (m, start) = (Arc::clone(&m), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                let mut lost = 0;
                for i in 1..=N {
                    m.write_bytes(64 + 4 * half, &i.to_le_bytes()).unwrap();
                    let word = m.read_u64(64).unwrap();
                    if (word >> (32 * half)) as u32 != i {
                        lost += 1;
                    }
                }
                lost
            })
        })
        .collect();
    let lost: u32 = writers.into_iter().map(|w| w.join().unwrap()).sum();
    assert_eq!(
        lost, 0,
        "writes to one half undone by the other half's writer"
    );
    assert_eq!(m.read_u64(64), Some(u64::from(N) | u64::from(N) << 32));
}

#[test]
#[cfg_attr(miri, ignore = "madvise(MADV_DONTNEED) is not supported by Miri")]
fn discarded_pages_read_as_zero_and_the_rest_stay() {
    let m = GuestMemory::new(MIB, Backing::Anonymous).unwrap();
    for page in 0..4 {
        assert!(m.write_u64(page * 4096 + 8, page + 1));
    }
    m.discard(4096, 2 * 4096).unwrap();
    let words: Vec<_> = (0..4).map(|p| m.read_u64(p * 4096 + 8)).collect();
    assert_eq!(words, [Some(1), Some(0), Some(0), Some(4)]);
    assert!(
        m.write_u64(4096 + 8, 7),
        "a discarded page takes writes again"
    );
    assert_eq!(m.read_u64(4096 + 8), Some(7));
    for (offset, len) in [(MIB - 4096, 8192), (100, 4096), (u64::MAX - 4095, 8192)] {
        let e = m.discard(offset, len).unwrap_err();
        assert_eq!(
            e,
            MemoryError::OutOfRange {
                offset,
                len,
                size: MIB
            }
        );
    }
    assert_eq!(m.read_u64(8), Some(1), "a refused discard dropped nothing");
}

#[test]
#[cfg_attr(
    miri,
    ignore = "munmap of part of a mapping and madvise are not supported by Miri"
)]
fn thp_memory_is_2m_aligned() {
    let m = GuestMemory::new(4 * MIB + 4096, Backing::AnonymousThp).unwrap();
    assert_eq!(m.host_addr() % (2 * MIB), 0);
    assert!(m.write_u64(4 * MIB, 9));
    assert_eq!(m.read_u64(4 * MIB), Some(9));
    assert!(m.thp_bytes().is_some(), "its smaps entry is found");
}

#[test]
#[cfg_attr(miri, ignore = "MAP_HUGETLB is not supported by Miri")]
fn bad_sizes_and_missing_hugetlb_pages_are_typed_errors() {
    let cases = [
        (0, Backing::Anonymous, 4096),
        (4097, Backing::Anonymous, 4096),
        (4096, Backing::Hugetlb2M, 2 * MIB),
        (4097, Backing::AnonymousThp, 4096),
        (2 * MIB, Backing::Hugetlb1G, 1 << 30),
    ];
    for (size, backing, multiple) in cases {
        let e = GuestMemory::new(size, backing).unwrap_err();
        assert_eq!(e, MemoryError::BadSize { size, multiple }, "{backing}");
    }
    let huge = !0xfffu64;
    assert_eq!(
        GuestMemory::new(huge, Backing::Anonymous).unwrap_err(),
        MemoryError::TooLarge { size: huge }
    );
    // 1 TiB of 1 GiB pages: no machine here has them reserved.
    match GuestMemory::new(1 << 40, Backing::Hugetlb1G).unwrap_err() {
        e @ MemoryError::HugetlbNotReserved {
            page_size, needed, ..
        } => {
            assert_eq!((page_size, needed), (1 << 30, 1024));
            assert!(
                e.to_string().contains("hugepages-1048576kB/nr_hugepages"),
                "{e}"
            );
        }
        other => panic!("expected HugetlbNotReserved, got {other:?}"),
    }
}
