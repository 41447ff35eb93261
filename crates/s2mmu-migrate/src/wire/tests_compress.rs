//! Compressed pages on the stream: the round trip, the policy's choice
//! per page, and every way a compressed page can be damaged.

use super::*;
use crate::hash::{checksum, page_hash};

/// A page that compresses (one word per 64-byte line, the rest zeros: what
/// the project's dirtier writes).
fn sparse(seed: u8) -> [u8; PAGE_SIZE] {
    let mut p = [0u8; PAGE_SIZE];
    for (i, line) in p.chunks_exact_mut(64).enumerate() {
        line[..8].copy_from_slice(&(i as u64 * 0x0101 + u64::from(seed)).to_le_bytes());
    }
    p
}

/// A page that does not (xorshift bytes).
fn random(seed: u64) -> [u8; PAGE_SIZE] {
    let mut p = [0u8; PAGE_SIZE];
    let mut x = seed | 1;
    for b in p.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = (x >> 24) as u8;
    }
    p
}

/// The pages of the test record, in order: sparse, random, zero, sparse,
/// filled.
fn pages() -> Vec<[u8; PAGE_SIZE]> {
    vec![
        sparse(1),
        random(7),
        [0u8; PAGE_SIZE],
        sparse(2),
        [0x5a; PAGE_SIZE],
    ]
}

fn gpa(k: usize) -> u64 {
    (1 << 32) + k as u64 * PAGE_SIZE as u64
}

/// One PAGES record of [`pages`] written with `c`, and the writer's counts.
fn record(c: Compression, sealed: bool) -> (Vec<u8>, CompressStats) {
    let mut w = WireWriter::replies(Vec::new());
    w.set_compression(c);
    let mut b = if sealed {
        Batch::sealed()
    } else {
        Batch::new()
    };
    for (k, p) in pages().iter().enumerate() {
        b.push(gpa(k), |d| d.copy_from_slice(p));
    }
    w.batch(&mut b).unwrap();
    let written = w.get_mut().len() as u64;
    assert_eq!(w.pos, written);
    let st = w.compression_stats();
    (w.into_inner(), st)
}

/// Where the data of the record (after its head) begins.
const DATA_AT: usize = 3 + 16 * 5 + 8;

#[test]
fn compressed_pages_round_trip_through_every_read() {
    for sealed in [false, true] {
        let (stream, st) = record(Compression::Lz4, sealed);
        // The sparse pages and the filled one compress; the random page
        // was tried and went raw; the zero page is a flag.
        assert_eq!((st.pages, st.tried_raw), (3, 1));
        assert!(st.saved() > 3 * 3000, "{st:?}");
        assert_eq!(
            stream.len() as u64,
            DATA_AT as u64 + 4 * PAGE_SIZE as u64 - st.saved()
        );
        // Checked reads, hashed or over an authenticated connection.
        for authenticated in [false, true] {
            let mut r = WireReader::replies(&stream[..]);
            r.set_authenticated(authenticated);
            assert!(matches!(
                r.next_record().unwrap(),
                Record::Pages { count: 5, .. }
            ));
            let flags: Vec<(bool, bool)> =
                r.entries().iter().map(|e| (e.zero, e.compressed)).collect();
            assert_eq!(
                flags,
                [
                    (false, true),
                    (false, false),
                    (true, false),
                    (false, true),
                    (false, true)
                ]
            );
            for (k, e) in r.entries().iter().enumerate() {
                assert_eq!(e.gpa, gpa(k), "the flags are not part of the address");
            }
            let mut got = vec![[0xeeu8; PAGE_SIZE]; 4];
            let mut bufs: Vec<&mut [u8]> = got.iter_mut().map(|p| &mut p[..]).collect();
            r.read_checked_pages(&mut bufs, 0, &mut ()).unwrap();
            let want: Vec<[u8; PAGE_SIZE]> = pages()
                .into_iter()
                .enumerate()
                .filter(|(k, _)| *k != 2)
                .map(|(_, p)| p)
                .collect();
            assert!(got == want, "authenticated {authenticated}");
            assert_eq!(r.pos, stream.len() as u64);
        }
        // Page by page.
        let mut r = WireReader::replies(&stream[..]);
        r.next_record().unwrap();
        for k in [0, 1, 3, 4] {
            let mut got = [0u8; PAGE_SIZE];
            r.read_page(&mut got).unwrap();
            assert_eq!(got, pages()[k], "page {k}");
            assert_eq!(page_hash(&got, gpa(k)), r.entries()[k].hash);
        }
        assert!(matches!(
            r.read_page(&mut [0u8; PAGE_SIZE]),
            Err(MigrateError::Setup(_))
        ));
        // Vectored, into the caller's buffers.
        let mut r = WireReader::replies(&stream[..]);
        r.next_record().unwrap();
        let mut got = vec![[0u8; PAGE_SIZE]; 4];
        let mut bufs: Vec<std::io::IoSliceMut<'_>> = got
            .iter_mut()
            .map(|p| std::io::IoSliceMut::new(p))
            .collect();
        r.read_pages(&mut bufs).unwrap();
        assert_eq!(got[3], pages()[4]);
    }
}

/// `off` sends the version-4 form: no entry flagged, every data page raw.
#[test]
fn off_sends_no_compressed_entry() {
    let (stream, st) = record(Compression::Off, false);
    assert_eq!(st, CompressStats::default());
    assert_eq!(stream.len(), DATA_AT + 4 * PAGE_SIZE);
    let mut r = WireReader::replies(&stream[..]);
    r.next_record().unwrap();
    assert!(r.entries().iter().all(|e| !e.compressed));
    // A new writer compresses nothing until told to.
    let mut w = WireWriter::replies(Vec::new());
    assert_eq!(w.compression(), Compression::Off);
    w.page(0, &sparse(3)).unwrap();
    assert_eq!(w.into_inner().len(), 3 + 16 + 8 + PAGE_SIZE);
}

/// An incompressible page goes raw even with `lz4`, and a record of only
/// such pages is the uncompressed record, byte for byte.
#[test]
fn an_incompressible_page_goes_raw() {
    let mut plain = WireWriter::replies(Vec::new());
    let mut lz4 = WireWriter::replies(Vec::new());
    lz4.set_compression(Compression::Lz4);
    for w in [&mut plain, &mut lz4] {
        let mut b = Batch::new();
        for k in 0..4 {
            b.push(gpa(k), |d| d.copy_from_slice(&random(k as u64 + 11)));
        }
        w.batch(&mut b).unwrap();
    }
    let st = lz4.compression_stats();
    assert_eq!((st.pages, st.tried_raw), (0, 4));
    assert!(plain.into_inner() == lz4.into_inner());
}

/// The offset in the record of its first compressed page's length word.
fn first_len_at() -> usize {
    DATA_AT
}

#[test]
fn a_corrupt_compressed_page_is_a_typed_error_naming_its_gpa() {
    let (good, _) = record(Compression::Lz4, false);
    let len = u16::from_le_bytes([good[DATA_AT], good[DATA_AT + 1]]) as usize;
    // Bytes that do not decode (an offset before the page's start), and
    // bytes that decode to another page (a literal changed): the first is
    // BadCompressedPage, the second fails its hash as a raw page would.
    // Neither lands in the destination's page.
    let mut undecodable = good.clone();
    for b in &mut undecodable[DATA_AT + 2..DATA_AT + 2 + len] {
        *b = 0xff;
    }
    let mut other_page = good.clone();
    other_page[DATA_AT + 2 + 1] ^= 0x01;
    for (stream, want_checksum) in [(undecodable, false), (other_page, true)] {
        let mut r = WireReader::replies(&stream[..]);
        r.next_record().unwrap();
        let mut got = vec![[0xeeu8; PAGE_SIZE]; 4];
        let mut bufs: Vec<&mut [u8]> = got.iter_mut().map(|p| &mut p[..]).collect();
        match r.read_checked_pages(&mut bufs, 9, &mut ()) {
            Err(MigrateError::BadCompressedPage {
                gpa: g,
                at_byte,
                why,
            }) if !want_checksum => {
                assert_eq!((g, at_byte), (gpa(0), 0));
                let e = MigrateError::BadCompressedPage {
                    gpa: g,
                    at_byte,
                    why,
                };
                assert!(e.to_string().contains("gpa 0x100000000"), "{e}");
            }
            Err(MigrateError::PageChecksum { gpa: g, at_byte: 9 }) if want_checksum => {
                assert_eq!(g, gpa(0))
            }
            other => panic!("{other:?}"),
        }
        assert!(
            got.iter().all(|p| p.iter().all(|&b| b == 0xee)),
            "nothing landed"
        );
    }
}

#[test]
fn a_length_beyond_a_page_is_refused_before_it_is_read() {
    let (good, _) = record(Compression::Lz4, false);
    for bad_len in [PAGE_SIZE as u16 + 1, u16::MAX, 0] {
        let mut stream = good.clone();
        stream[first_len_at()..first_len_at() + 2].copy_from_slice(&bad_len.to_le_bytes());
        let mut r = WireReader::replies(&stream[..]);
        r.next_record().unwrap();
        let mut got = [0xeeu8; PAGE_SIZE];
        match r.read_page(&mut got) {
            Err(MigrateError::BadCompressedPage { gpa: g, why, .. }) => {
                assert_eq!(g, gpa(0));
                assert!(why.contains(&format!("length of {bad_len} bytes")), "{why}");
            }
            other => panic!("{other:?}"),
        }
        // Only the length word was read.
        assert_eq!(r.pos, first_len_at() as u64 + 2);
        assert!(got.iter().all(|&b| b == 0xee));
    }
    // A stream that ends inside a compressed page is truncated there.
    let mut r = WireReader::replies(&good[..DATA_AT + 10]);
    r.next_record().unwrap();
    assert!(matches!(
        r.read_page(&mut [0u8; PAGE_SIZE]),
        Err(MigrateError::Truncated { .. })
    ));
}

/// An entry flagged both zero and compressed, or with a flag this format
/// does not have, is malformed (its record's checksum is right).
#[test]
fn entries_with_impossible_flags_are_malformed() {
    for word in [gpa(0) | ENTRY_ZERO | ENTRY_LZ4, gpa(0) | 4, gpa(0) | 0x800] {
        let mut covered = vec![1u8, 0];
        covered.extend_from_slice(&word.to_le_bytes());
        covered.extend_from_slice(&0u64.to_le_bytes());
        let mut stream = vec![tag::PAGES];
        stream.extend_from_slice(&covered);
        stream.extend_from_slice(&checksum(&covered, u64::from(tag::PAGES)).to_le_bytes());
        let mut r = WireReader::replies(&stream[..]);
        assert!(
            matches!(
                r.next_record(),
                Err(MigrateError::Malformed {
                    record: "PAGES",
                    ..
                })
            ),
            "{word:#x}"
        );
    }
}

/// A bandwidth limit's wait before a batch is told the bytes on the wire,
/// after compression.
#[test]
fn the_pace_is_told_the_compressed_size() {
    let mut w = WireWriter::replies(Vec::new());
    w.set_compression(Compression::Lz4);
    let mut b = Batch::new();
    for k in 0..8 {
        b.push(gpa(k), |d| d.copy_from_slice(&sparse(k as u8)));
    }
    let mut told = 0u64;
    w.batch_paced(&mut b, &mut |n| told += n).unwrap();
    assert_eq!(told, w.pos);
    assert!(told < 8 * PAGE_SIZE as u64 / 4, "{told}");
}
