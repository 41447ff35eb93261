use super::*;
use s2mmu::format::arm64::Arm64Stage2;
use s2mmu::format::FormatId;

fn header() -> Header {
    Header {
        mem_size: 1 << 20,
        slots: 2,
        gpa_base: 1 << 32,
        vcpus: 2,
        channels: 1,
        backing: "anonymous".into(),
        verify_full: true,
        postcopy: false,
        format: FormatId::of::<Arm64Stage2>(),
        image: None,
    }
}

#[test]
fn the_header_carries_the_stage2_format() {
    for &format in FormatId::ALL {
        let h = Header { format, ..header() };
        let body = h.encode();
        assert_eq!(Header::decode(&body, 0).unwrap(), h);
        // Through a whole stream's opening too.
        let w = WireWriter::new(Vec::new(), &h).unwrap();
        let stream = w.into_inner();
        let (_, got) = WireReader::new(&stream[..]).unwrap();
        assert_eq!(got.format, format);
    }
    // The format is the body's last byte: a code this build does not
    // know is named, and a body without it (version 2's) is refused.
    let mut body = header().encode();
    *body.last_mut().unwrap() = u8::MAX;
    match Header::decode(&body, 0) {
        Err(MigrateError::Malformed {
            record: "HEADER",
            why,
            ..
        }) => assert!(
            why.contains("stage-2 format 255 (0: arm64, 1: ept"),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    body.pop();
    assert!(matches!(
        Header::decode(&body, 0),
        Err(MigrateError::Malformed {
            record: "HEADER",
            ..
        })
    ));
    // A flipped format byte in a stream fails the HEADER's checksum before
    // the format is read (the body ends 8 checksum bytes before the
    // stream's end).
    let w = WireWriter::new(Vec::new(), &header()).unwrap();
    let mut bad = w.into_inner();
    let at = bad.len() - 9;
    bad[at] ^= 1;
    assert!(matches!(
        WireReader::new(&bad[..]),
        Err(MigrateError::RecordChecksum {
            record: "HEADER",
            ..
        })
    ));
}

#[test]
fn records_round_trip() {
    let mut w = WireWriter::new(Vec::new(), &header()).unwrap();
    let page = [0x5au8; PAGE_SIZE];
    let h = w.page(1 << 32, &page).unwrap();
    let mut b = Batch::new();
    b.push((1 << 32) + 4096, |p| p.fill(0));
    b.push((1 << 32) + 8192, |p| p.fill(3));
    w.batch(&mut b).unwrap();
    w.control(tag::ROUND, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
        .unwrap();
    w.end().unwrap();
    assert_eq!((w.pages, w.zero_pages), (3, 1));
    let bytes = std::mem::take(w.get_mut());
    let (mut r, got) = WireReader::new(&bytes[..]).unwrap();
    assert_eq!(got, header());
    assert!(matches!(
        r.next_record().unwrap(),
        Record::Pages { count: 1, .. }
    ));
    assert_eq!(
        r.entries(),
        &[Entry {
            gpa: 1 << 32,
            zero: false,
            hash: h,
            compressed: false,
        }]
    );
    let mut got = [0u8; PAGE_SIZE];
    r.read_page(&mut got).unwrap();
    assert_eq!(got[..], page[..]);
    assert!(matches!(
        r.next_record().unwrap(),
        Record::Pages { count: 2, .. }
    ));
    assert!(r.entries()[0].zero && !r.entries()[1].zero);
    r.read_page(&mut got).unwrap();
    assert_eq!(got, [3u8; PAGE_SIZE]);
    match r.next_record().unwrap() {
        Record::Control { tag: t, body, .. } => {
            assert_eq!((t, body.len()), (tag::ROUND, 12))
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        r.next_record().unwrap(),
        Record::Control { tag: tag::END, .. }
    ));
    assert!(matches!(
        r.next_record(),
        Err(MigrateError::Truncated { .. })
    ));
}

#[test]
fn bad_headers_are_named() {
    let w = WireWriter::new(Vec::new(), &header()).unwrap();
    let good = w.into_inner();
    let mut bad = good.clone();
    bad[0] = b'X';
    assert!(matches!(
        WireReader::new(&bad[..]),
        Err(MigrateError::BadMagic { .. })
    ));
    let mut bad = good.clone();
    bad[15] ^= 1;
    assert!(matches!(
        WireReader::new(&bad[..]),
        Err(MigrateError::RecordChecksum {
            record: "HEADER",
            ..
        })
    ));
    assert!(matches!(
        WireReader::new(&good[..good.len() - 1]),
        Err(MigrateError::Truncated { .. })
    ));
    // A length beyond any header's is refused before it is allocated.
    let mut bad = good.clone();
    bad[11..15].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        WireReader::new(&bad[..]),
        Err(MigrateError::Malformed {
            record: "HEADER",
            ..
        })
    ));
}

#[test]
fn headers_out_of_bounds_are_malformed() {
    for h in [
        Header {
            vcpus: 0,
            ..header()
        },
        Header {
            vcpus: MAX_VCPUS + 1,
            ..header()
        },
        Header {
            channels: MAX_CHANNELS + 1,
            ..header()
        },
        Header {
            slots: 0,
            ..header()
        },
        Header {
            mem_size: MAX_MEM + 4096,
            ..header()
        },
    ] {
        assert!(
            matches!(
                Header::decode(&h.encode(), 0),
                Err(MigrateError::Malformed { .. })
            ),
            "{h:?}"
        );
    }
}

#[test]
fn stripes_spread_over_channels() {
    assert_eq!(channel_of(0, 1), 0);
    assert_eq!(channel_of(STRIPE_PAGES - 1, 4), 0);
    assert_eq!(channel_of(STRIPE_PAGES, 4), 1);
    assert_eq!(channel_of(4 * STRIPE_PAGES, 4), 0);
}

/// A writer that takes at most `max` bytes a call (vectored or not), or
/// nothing at all with `max` 0.
struct Drip {
    out: Vec<u8>,
    max: usize,
    calls: usize,
}

impl std::io::Write for Drip {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.write_vectored(&[std::io::IoSlice::new(b)])
    }
    fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        self.calls += 1;
        let mut n = 0;
        for b in bufs {
            let take = b.len().min(self.max - n);
            self.out.extend_from_slice(&b[..take]);
            n += take;
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_batch_goes_out_whole_in_one_record_through_short_vectored_writes() {
    let mut b = Batch::new();
    assert_eq!(b.push(1 << 32, |p| p.fill(1)), Some(false));
    assert_eq!(b.push((1 << 32) + 4096, |p| p.fill(0)), Some(true));
    assert_eq!(b.push((1 << 32) + 8192, |p| p.fill(2)), Some(false));
    // 40 bytes a call: the head (59 bytes) and the data are each cut,
    // and the second call takes the head's end and the data's start.
    let drip = Drip {
        out: Vec::new(),
        max: 40,
        calls: 0,
    };
    let mut w = WireWriter::replies(drip);
    w.batch(&mut b).unwrap();
    assert!(b.is_empty());
    let written = w.pos;
    let drip = w.into_inner();
    assert_eq!(written, drip.out.len() as u64);
    assert_eq!(drip.calls, drip.out.len().div_ceil(40));
    let mut stream = Vec::new();
    {
        let mut opening = WireWriter::new(&mut stream, &header()).unwrap();
        opening.flush().unwrap();
    }
    stream.extend_from_slice(&drip.out);
    let (mut r, _) = WireReader::new(&stream[..]).unwrap();
    assert!(matches!(
        r.next_record().unwrap(),
        Record::Pages { count: 3, .. }
    ));
    let zeros: Vec<bool> = r.entries().iter().map(|e| e.zero).collect();
    assert_eq!(zeros, [false, true, false]);
    let mut got = [0u8; PAGE_SIZE];
    r.read_page(&mut got).unwrap();
    assert_eq!(got, [1u8; PAGE_SIZE]);
    r.read_page(&mut got).unwrap();
    assert_eq!(got, [2u8; PAGE_SIZE]);
    // A connection that takes nothing is an error, not a loop.
    let mut w = WireWriter::replies(Drip {
        out: Vec::new(),
        max: 0,
        calls: 0,
    });
    let mut b = Batch::new();
    b.push(1 << 32, |p| p.fill(1));
    assert!(matches!(w.batch(&mut b), Err(MigrateError::Io { .. })));
}

/// A connection that serves at most `max` bytes a call (across the
/// buffers of a vectored read) and notes how many bytes each vectored
/// read asked for.
struct Feed {
    data: Vec<u8>,
    at: usize,
    max: usize,
    asked: Vec<usize>,
}

impl std::io::Read for Feed {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.max).min(self.data.len() - self.at);
        buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }

    fn read_vectored(&mut self, bufs: &mut [std::io::IoSliceMut<'_>]) -> std::io::Result<usize> {
        self.asked.push(bufs.iter().map(|b| b.len()).sum());
        let mut got = 0;
        for b in bufs.iter_mut() {
            let want = b.len().min(self.max - got);
            let n = want.min(self.data.len() - self.at);
            b[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            got += n;
            if n < b.len() {
                break;
            }
        }
        Ok(got)
    }
}

/// One full PAGES record of 256 data pages (page i holds byte i % 250 + 1) at
/// gpa 0 onwards, and where each page's data starts in the stream.
fn full_record() -> (Vec<u8>, Vec<usize>) {
    let mut w = WireWriter::replies(Vec::new());
    let mut b = Batch::new();
    for i in 0..MAX_BATCH {
        b.push(i as u64 * PAGE_SIZE as u64, |p| p.fill((i % 250) as u8 + 1));
    }
    w.batch(&mut b).unwrap();
    let head = 3 + 16 * MAX_BATCH + 8;
    let at = (0..MAX_BATCH).map(|i| head + i * PAGE_SIZE).collect();
    (w.into_inner(), at)
}

fn feed(data: Vec<u8>) -> WireReader<Feed> {
    WireReader::replies(Feed {
        data,
        at: 0,
        // Not a whole number of pages: reads end inside pages.
        max: 5000,
        asked: Vec::new(),
    })
}

/// Counts the reads a reader tells its observer of, each begun before it
/// ends and none inside another.
#[derive(Default)]
struct Reads {
    open: bool,
    n: usize,
}

impl crate::stages::StageObserver<crate::stages::RecvStages> for Reads {
    fn inner_begin(&mut self) {
        assert!(!self.open, "a read begun inside another");
        self.open = true;
    }

    fn inner_end(&mut self) {
        assert!(self.open, "a read ended that never began");
        self.open = false;
        self.n += 1;
    }
}

/// A checked read asks the connection for the whole record's data at
/// once, delivers every byte in order across reads that end inside pages,
/// and tells its observer of each read (the hashing between them is not
/// inside one).
#[test]
fn a_checked_read_takes_a_record_through_partial_reads() {
    let (stream, _) = full_record();
    let mut r = feed(stream);
    assert!(matches!(
        r.next_record().unwrap(),
        Record::Pages { count: 256, .. }
    ));
    let mut pages = vec![[0u8; PAGE_SIZE]; MAX_BATCH];
    let mut bufs: Vec<&mut [u8]> = pages.iter_mut().map(|p| &mut p[..]).collect();
    let mut reads = Reads::default();
    r.read_checked_pages(&mut bufs, 0, &mut reads).unwrap();
    for (i, p) in pages.iter().enumerate() {
        assert!(p.iter().all(|&b| b == (i % 250) as u8 + 1), "page {i}");
    }
    let asked = &r.get_mut().asked;
    assert_eq!(
        asked[0],
        MAX_BATCH * PAGE_SIZE,
        "the first read asks for it all"
    );
    assert_eq!(asked.len(), (MAX_BATCH * PAGE_SIZE).div_ceil(5000));
    assert_eq!(reads.n, asked.len(), "every read told, and only reads");
    assert!(!reads.open);
    assert_eq!(r.stages, Default::default(), "the reader keeps no clock");
}

/// A damaged page is refused as soon as it is in, before the rest of its
/// record arrives: a stream cut after page 41 of a record whose page 40 is
/// damaged is a checksum error at page 40, not a truncated record. The
/// pages before it are in place; it and those after it were not copied.
#[test]
fn a_damaged_page_is_refused_before_its_record_ends() {
    let (mut stream, at) = full_record();
    stream[at[40] + 17] ^= 0x10;
    stream.truncate(at[42]);
    let mut r = feed(stream);
    assert!(matches!(r.next_record().unwrap(), Record::Pages { .. }));
    let mut pages = vec![[0u8; PAGE_SIZE]; MAX_BATCH];
    let mut bufs: Vec<&mut [u8]> = pages.iter_mut().map(|p| &mut p[..]).collect();
    match r.read_checked_pages(&mut bufs, 7, &mut ()) {
        Err(MigrateError::PageChecksum { gpa, at_byte: 7 }) => {
            assert_eq!(gpa, 40 * PAGE_SIZE as u64)
        }
        other => panic!("{other:?}"),
    }
    for (i, p) in pages.iter().enumerate() {
        let want = if i < 40 { (i % 250) as u8 + 1 } else { 0 };
        assert!(p.iter().all(|&b| b == want), "page {i}");
    }
}

/// Over a connection that authenticates every byte the data is not
/// hashed again: a page whose data does not match its hash lands as it
/// came (its hash is kept as sent, for the digests compared at the
/// switch), and its observer is told of each read.
#[test]
fn an_authenticated_read_does_not_hash_the_pages_again() {
    let (mut stream, at) = full_record();
    stream[at[40] + 17] ^= 0x10;
    let mut r = feed(stream);
    r.set_authenticated(true);
    assert!(matches!(r.next_record().unwrap(), Record::Pages { .. }));
    let mut pages = vec![[0u8; PAGE_SIZE]; MAX_BATCH];
    let mut bufs: Vec<&mut [u8]> = pages.iter_mut().map(|p| &mut p[..]).collect();
    let mut reads = Reads::default();
    r.read_checked_pages(&mut bufs, 0, &mut reads).unwrap();
    assert_eq!(pages[40][17], 41 ^ 0x10);
    assert!(pages[41].iter().all(|&b| b == 42), "the page after it");
    assert_eq!(reads.n, r.get_mut().asked.len());
    assert!(reads.n > 1 && !reads.open);
}

/// Buffers that are not one page for each data page of the record are
/// refused before anything is read.
#[test]
fn a_checked_read_needs_a_page_for_each_data_page() {
    let (stream, _) = full_record();
    let mut r = feed(stream);
    assert!(matches!(r.next_record().unwrap(), Record::Pages { .. }));
    let pos = r.pos;
    let mut pages = vec![[0u8; PAGE_SIZE]; MAX_BATCH - 1];
    let mut bufs: Vec<&mut [u8]> = pages.iter_mut().map(|p| &mut p[..]).collect();
    assert!(matches!(
        r.read_checked_pages(&mut bufs, 0, &mut ()),
        Err(MigrateError::Setup(_))
    ));
    let mut short = [0u8; 100];
    let mut pages = vec![[0u8; PAGE_SIZE]; MAX_BATCH - 1];
    let mut bufs: Vec<&mut [u8]> = pages.iter_mut().map(|p| &mut p[..]).collect();
    bufs.push(&mut short);
    assert!(matches!(
        r.read_checked_pages(&mut bufs, 0, &mut ()),
        Err(MigrateError::Setup(_))
    ));
    assert_eq!(r.pos, pos, "bytes were read");
}

/// The bytes of one PAGES record of `n` pages (every third a zero page)
/// from a batch laid out for sealing or not, written by `batch` or
/// `sealed_batch` through a fixed-key TLS session.
fn pages_stream(n: usize, sealed: bool, in_place: bool) -> Vec<u8> {
    use crate::transport::{fixed_key_session, Duplex, SharedSink};
    let out = SharedSink::default();
    let sock = Duplex {
        input: std::io::empty(),
        output: out.clone(),
    };
    let conn = fixed_key_session(Box::new(sock), [7; 32], [9; 12], false, 0).unwrap();
    let mut w = WireWriter::replies(conn);
    let mut b = if sealed {
        Batch::sealed()
    } else {
        Batch::new()
    };
    for i in 0..n {
        let byte = if i % 3 == 1 { 0 } else { (i % 250) as u8 + 1 };
        b.push(i as u64 * PAGE_SIZE as u64, |p| p.fill(byte));
    }
    assert_eq!(b.is_sealed(), sealed);
    match in_place {
        true => w.sealed_batch(&mut b).unwrap(),
        false => w.batch(&mut b).unwrap(),
    }
    assert!(b.is_empty());
    let data = (n - (n + 1) / 3) as u64;
    assert_eq!(w.pos, 3 + 16 * n as u64 + 8 + data * PAGE_SIZE as u64);
    out.bytes()
}

#[test]
fn a_batch_sealed_in_place_sends_the_records_a_copied_batch_sends() {
    // Less than one record of data, a partial last record, all 256 pages.
    for n in [1, 2, 7, 13, MAX_BATCH] {
        let copied = pages_stream(n, false, false);
        assert!(pages_stream(n, true, true) == copied, "{n} pages in place");
        // A sealed layout written without sealing: its plaintext as it is.
        assert!(pages_stream(n, true, false) == copied, "{n} pages laid out");
    }
}

/// Guest RAM's own bounds (`vm::regions`, which cannot import the wire)
/// are the stream's: every RAM that `RamRegions` accepts fits a HEADER.
#[test]
fn guest_ram_bounds_are_the_streams() {
    use crate::vm::regions;
    assert_eq!(regions::MAX_RAM, MAX_MEM);
    assert_eq!(regions::MAX_REGIONS as u64, u64::from(MAX_SLOTS));
    assert_eq!(regions::PAGE_SIZE, PAGE_SIZE);
}
