//! The receiving side: the opening, PAGES entries and data, control
//! records and probes, every length checked before it is read.

use super::codec::Dec;
use super::header::{Header, Opening};
use super::limits::{
    max_body, tag, tag_name, ENTRY_LZ4, ENTRY_ZERO, MAGIC, MAX_BATCH, PAGE_SIZE, SESSION_LEN,
    VERSION,
};
use crate::hash::checksum;
use crate::stages::{RecvStages, StageObserver};
use crate::stream_error::MigrateError;
use std::io::{IoSliceMut, Read};
use std::time::Duration;

mod one_page;
mod pace;
mod through;

pub use pace::MIN_RATE;
use pace::{fill_from, Pace};

/// The grace of a reader not told its peer's I/O timeout.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// One page of a PAGES record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Its guest-physical address (page-aligned).
    pub gpa: u64,
    /// A zero page: no data follows for it.
    pub zero: bool,
    /// The checksum its data must have (0 for a zero page), the page's
    /// own (after decompression).
    pub hash: u64,
    /// Its data is compressed (a length, then LZ4 bytes).
    pub compressed: bool,
}

/// One record read from a stream.
#[derive(Debug, PartialEq)]
pub enum Record {
    /// A PAGES record whose entries were verified; they are in
    /// [`WireReader::entries`], and the data of each that is not a zero
    /// page must be read, in order, with [`WireReader::read_page`].
    Pages { count: usize, at_byte: u64 },
    /// A control record whose checksum was verified.
    Control {
        tag: u8,
        body: Vec<u8>,
        at_byte: u64,
    },
    /// A PROBE of `len` bytes: read them with [`WireReader::discard`].
    Probe { len: u64, at_byte: u64 },
}

/// Reads a stream, verifying every checksum and locating every error.
pub struct WireReader<R: Read> {
    r: R,
    /// Bytes read so far.
    pub pos: u64,
    /// Page records read so far (zero pages included).
    pub pages: u64,
    /// Of those, zero pages.
    pub zero_pages: u64,
    entries: Vec<Entry>,
    /// The next entry of the last PAGES record whose data
    /// [`WireReader::read_page`] reads, where that record began, and
    /// whether any of its entries is compressed.
    cursor: usize,
    record_at: u64,
    any_compressed: bool,
    /// A compressed page's bytes, and a page decompressed before it is
    /// checked and copied into place.
    lz4: Vec<u8>,
    bounce: Vec<u8>,
    raw: Vec<u8>,
    scratch: Vec<u8>,
    pace: Pace,
    /// Where the time of taking page data went, booked by the caller's
    /// observer (the reader tells it where each read begins and ends; it
    /// keeps no clock itself).
    pub stages: RecvStages,
    /// The connection authenticates every byte (an AEAD record layer):
    /// page data is not hashed again on arrival (see
    /// [`WireReader::read_checked_pages`]).
    authenticated: bool,
}

impl<R: Read> WireReader<R> {
    /// A reader of replies (no opening).
    pub fn replies(r: R) -> Self {
        WireReader {
            r,
            pos: 0,
            pages: 0,
            zero_pages: 0,
            entries: Vec::with_capacity(MAX_BATCH),
            cursor: 0,
            record_at: 0,
            any_compressed: false,
            lz4: Vec::new(),
            bounce: Vec::new(),
            raw: vec![0u8; 2 + 16 * MAX_BATCH + 8],
            scratch: Vec::new(),
            pace: Pace::new(DEFAULT_GRACE),
            stages: RecvStages::default(),
            authenticated: false,
        }
    }

    /// A reader that goes on where another stopped: `pos` bytes of the
    /// stream were read already (the opening, by the admission).
    pub fn continued(r: R, pos: u64) -> Self {
        let mut s = Self::replies(r);
        s.pos = pos;
        s
    }

    /// The underlying reader, once nothing more is read through this one
    /// (it buffers nothing: every byte it read was consumed).
    pub fn into_inner(self) -> R {
        self.r
    }

    /// The grace of each record's deadline (see [`MIN_RATE`]): the peer's
    /// I/O timeout.
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.pace = Pace::new(grace);
        self
    }

    /// Says whether the connection authenticates every byte it delivers
    /// ([`crate::transport::Connection::authenticates`]): over one that
    /// does, [`WireReader::read_checked_pages`] takes each page's hash as
    /// sent instead of hashing its data again.
    pub(crate) fn set_authenticated(&mut self, yes: bool) {
        self.authenticated = yes;
    }

    /// Reads and checks a connection's opening.
    ///
    /// # Errors
    /// [`MigrateError::BadMagic`], [`MigrateError::Version`],
    /// [`MigrateError::Truncated`], [`MigrateError::RecordChecksum`],
    /// [`MigrateError::Malformed`].
    pub fn open(r: R) -> Result<(Self, Opening), MigrateError> {
        Self::replies(r).read_opening()
    }

    /// Reads and checks a connection's opening, the whole of it within
    /// one record's deadline.
    ///
    /// # Errors
    /// As [`WireReader::open`].
    pub fn read_opening(self) -> Result<(Self, Opening), MigrateError> {
        let mut s = self;
        s.pace.restart();
        let mut magic = [0u8; 8];
        s.fill(&mut magic, "the opening")?;
        if magic != MAGIC {
            return Err(MigrateError::BadMagic { found: magic });
        }
        let mut b = [0u8; 2];
        s.fill(&mut b, "the opening")?;
        let version = u16::from_le_bytes(b);
        if version != VERSION {
            return Err(MigrateError::Version {
                found: version,
                supported: VERSION,
            });
        }
        match s.record()? {
            Record::Control {
                tag: tag::HEADER,
                body,
                at_byte,
            } => {
                let h = Header::decode(&body, at_byte)?;
                Ok((s, Opening::Main(h)))
            }
            Record::Control {
                tag: tag::JOIN,
                body,
                at_byte,
            } => {
                let mut d = Dec::new(&body, "JOIN", at_byte);
                let mut session = [0u8; SESSION_LEN];
                session.copy_from_slice(d.bytes(SESSION_LEN)?);
                let channel = d.u16()?;
                d.finish()?;
                Ok((s, Opening::Join { session, channel }))
            }
            other => Err(MigrateError::Malformed {
                record: "opening",
                at_byte: 10,
                why: format!("expected HEADER or JOIN, got {}", record_name(&other)),
            }),
        }
    }

    /// Reads the main connection's opening.
    ///
    /// # Errors
    /// As [`WireReader::open`]; a JOIN is [`MigrateError::Malformed`].
    pub fn new(r: R) -> Result<(Self, Header), MigrateError> {
        match Self::open(r)? {
            (s, Opening::Main(h)) => Ok((s, h)),
            (_, Opening::Join { .. }) => Err(MigrateError::Malformed {
                record: "JOIN",
                at_byte: 10,
                why: "a channel joined before any migration started".into(),
            }),
        }
    }

    /// Fills `buf`; a stream that ends first is [`MigrateError::Truncated`]
    /// at the exact byte.
    fn fill(&mut self, buf: &mut [u8], inside: &'static str) -> Result<(), MigrateError> {
        fill_from(&mut self.r, &mut self.pace, &mut self.pos, buf, inside)
    }

    fn u64(&mut self, inside: &'static str) -> Result<u64, MigrateError> {
        let mut b = [0u8; 8];
        self.fill(&mut b, inside)?;
        Ok(u64::from_le_bytes(b))
    }

    /// The entries of the last PAGES record.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Reads the data of several pages at once into `bufs` (one page
    /// each), with as few system calls as the connection allows; the
    /// caller checks their hashes (and times the reads, when it wants
    /// their time).
    ///
    /// # Errors
    /// [`MigrateError::Truncated`], [`MigrateError::Io`],
    /// [`MigrateError::Timeout`].
    pub fn read_pages(&mut self, mut bufs: &mut [IoSliceMut<'_>]) -> Result<(), MigrateError> {
        if self.any_compressed {
            return bufs.iter_mut().try_for_each(|b| self.read_page(b));
        }
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut got = 0usize;
        while got < total {
            let n = self.read_page_data(bufs, &mut ())?;
            got += n;
            IoSliceMut::advance_slices(&mut bufs, n);
        }
        Ok(())
    }

    /// One vectored read of a PAGES record's data into `bufs` (retried
    /// when interrupted, paced like every read of a record): the bytes it
    /// brought, at least one, counted in the stream's position. `obs` is
    /// told where the read begins and ends (inner work of its stretch).
    ///
    /// # Errors
    /// [`MigrateError::Truncated`] at the stream's end,
    /// [`MigrateError::Io`], [`MigrateError::Timeout`].
    fn read_page_data(
        &mut self,
        bufs: &mut [IoSliceMut<'_>],
        obs: &mut impl StageObserver<RecvStages>,
    ) -> Result<usize, MigrateError> {
        obs.inner_begin();
        let r = loop {
            match self.pace.read(&mut self.r, |r| r.read_vectored(bufs)) {
                Ok(0) => {
                    break Err(MigrateError::Truncated {
                        at_byte: self.pos,
                        inside: "a PAGES record's data",
                    })
                }
                Ok(n) => {
                    self.pos += n as u64;
                    break Ok(n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(MigrateError::io("receiving the migration stream", &e)),
            }
        };
        obs.inner_end();
        r
    }

    /// Reads the data of the last PAGES record into `pages` (one page
    /// each, for its entries that are not zero pages, in order), asking
    /// the connection for all of them at once (as few system calls as it
    /// allows). Each page is checked against its hash as soon as a read
    /// has brought its last byte: the read lands in a buffer of the
    /// reader's, the page is hashed there while the read's copy is still
    /// in the cache, and only then copied into `pages` (a page whose hash
    /// does not match is not copied). Reading 128 KiB at a time was
    /// measured and cost the plain-TCP destination more in system calls
    /// than it saved. `obs` is told where each read begins and ends: a
    /// caller's [`StageObserver`] books the reads apart from the hashing
    /// and the copies into place (`()` books nothing and costs nothing).
    ///
    /// Over a connection that [authenticates every
    /// byte](WireReader::set_authenticated) the data is not hashed: the
    /// AEAD tag of each TLS record already proves the bytes are the ones
    /// the peer sealed, in the order it sealed them (entries and data
    /// alike), and the source hashed the same copy it sealed. A hash that
    /// does not match its data can then only come from the peer itself,
    /// which could as well have sent any data with its true hash; the
    /// per-slot digests compared at the switch (the destination's stored
    /// hashes against the source's frozen memory) still catch a peer
    /// whose hashes are wrong. Hashing every page again cost the TLS
    /// destination about a tenth of its CPU in round 0.
    ///
    /// A record with compressed pages is read page by page (see
    /// [`WireReader::read_mixed`]).
    ///
    /// # Errors
    /// [`MigrateError::PageChecksum`] for the first page whose data does
    /// not match its hash (the pages from it on may hold bytes that were
    /// not checked); [`MigrateError::BadCompressedPage`];
    /// [`MigrateError::Truncated`], [`MigrateError::Io`],
    /// [`MigrateError::Timeout`]; [`MigrateError::Setup`] when `pages` is
    /// not one page for each of those entries.
    pub(crate) fn read_checked_pages(
        &mut self,
        pages: &mut [&mut [u8]],
        at_byte: u64,
        obs: &mut impl StageObserver<RecvStages>,
    ) -> Result<(), MigrateError> {
        let data = self.entries.iter().filter(|e| !e.zero).count();
        if data != pages.len() || pages.iter().any(|p| p.len() != PAGE_SIZE) {
            return Err(MigrateError::Setup(format!(
                "{} buffers for the {data} pages of a PAGES record",
                pages.len()
            )));
        }
        if self.any_compressed {
            return self.read_mixed(pages, at_byte, obs);
        }
        if !self.authenticated {
            let mut buf = std::mem::take(&mut self.scratch);
            if buf.len() < MAX_BATCH * PAGE_SIZE {
                buf = vec![0u8; MAX_BATCH * PAGE_SIZE];
            }
            let r = self.read_through(&mut buf, pages, at_byte, obs);
            self.scratch = buf;
            return r;
        }
        // Pages wholly read, and bytes read of the next one.
        let (mut done, mut part) = (0usize, 0usize);
        while done < pages.len() {
            let mut iov = Vec::with_capacity(pages.len() - done);
            let (first, rest) = pages[done..].split_at_mut(1);
            iov.push(IoSliceMut::new(&mut first[0][part..]));
            iov.extend(rest.iter_mut().map(|p| IoSliceMut::new(p)));
            let got = self.read_page_data(&mut iov, obs)?;
            drop(iov);
            done += (part + got) / PAGE_SIZE;
            part = (part + got) % PAGE_SIZE;
        }
        Ok(())
    }

    /// Reads and drops `n` bytes (a PROBE's filler).
    ///
    /// # Errors
    /// [`MigrateError::Truncated`], [`MigrateError::Io`],
    /// [`MigrateError::Timeout`].
    pub fn discard(&mut self, mut n: u64) -> Result<(), MigrateError> {
        if self.scratch.is_empty() {
            self.scratch = vec![0u8; 1 << 20];
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut r = Ok(());
        while n > 0 {
            let k = n.min(scratch.len() as u64) as usize;
            if let Err(e) = self.fill(&mut scratch[..k], "a PROBE") {
                r = Err(e);
                break;
            }
            n -= k as u64;
        }
        self.scratch = scratch;
        r
    }

    /// Reads the next record.
    ///
    /// # Errors
    /// [`MigrateError::Truncated`] (the stream ended, even between
    /// records: every stream ends with END), [`MigrateError::RecordChecksum`],
    /// [`MigrateError::UnknownRecord`], [`MigrateError::Malformed`].
    pub fn next_record(&mut self) -> Result<Record, MigrateError> {
        self.pace.restart();
        self.record()
    }

    /// Reads a record, on the current record's deadline.
    fn record(&mut self) -> Result<Record, MigrateError> {
        let at_byte = self.pos;
        let mut t = [0u8; 1];
        self.fill(&mut t, "the next record's tag: the stream ended before END")?;
        match t[0] {
            tag::PAGES => self.pages_record(at_byte),
            tag::PROBE => {
                let len = self.u64("a PROBE record")?;
                let check = self.u64("a PROBE record")?;
                if check != checksum(&len.to_le_bytes(), u64::from(tag::PROBE)) {
                    return Err(MigrateError::RecordChecksum {
                        record: "PROBE",
                        at_byte,
                    });
                }
                Ok(Record::Probe { len, at_byte })
            }
            other => self.control_record(other, at_byte),
        }
    }

    /// The rest of a PAGES record: its count, entries and their checksum.
    fn pages_record(&mut self, at_byte: u64) -> Result<Record, MigrateError> {
        let mut c = [0u8; 2];
        self.fill(&mut c, "a PAGES record")?;
        let count = usize::from(u16::from_le_bytes(c));
        if count == 0 || count > MAX_BATCH {
            return Err(MigrateError::Malformed {
                record: "PAGES",
                at_byte,
                why: format!("{count} pages (1 to {MAX_BATCH})"),
            });
        }
        // The count, then the entries and their check read after it: the
        // check covers the count and the entries, one run of bytes.
        let mut raw = std::mem::take(&mut self.raw);
        raw[..2].copy_from_slice(&c);
        let r = self.fill(&mut raw[2..2 + 16 * count + 8], "a PAGES record");
        self.raw = raw;
        r?;
        let (covered, check) = self.raw[..2 + 16 * count + 8].split_at(2 + 16 * count);
        let entries = &covered[2..];
        if checksum(covered, u64::from(tag::PAGES)).to_le_bytes() != check {
            return Err(MigrateError::RecordChecksum {
                record: "PAGES",
                at_byte,
            });
        }
        self.entries.clear();
        self.cursor = 0;
        self.record_at = at_byte;
        self.any_compressed = false;
        for e in entries.chunks_exact(16) {
            let word = u64::from_le_bytes(e[..8].try_into().expect("8 bytes"));
            let hash = u64::from_le_bytes(e[8..].try_into().expect("8 bytes"));
            let zero = word & ENTRY_ZERO != 0;
            let compressed = word & ENTRY_LZ4 != 0;
            let flags = ENTRY_ZERO | ENTRY_LZ4;
            if word & (PAGE_SIZE as u64 - 1) & !flags != 0 || (zero && (hash != 0 || compressed)) {
                return Err(MigrateError::Malformed {
                    record: "PAGES",
                    at_byte,
                    why: format!("entry {word:#x}/{hash:#x} is not a page address"),
                });
            }
            self.zero_pages += u64::from(zero);
            self.any_compressed |= compressed;
            self.entries.push(Entry {
                gpa: word & !flags,
                zero,
                hash,
                compressed,
            });
        }
        self.pages += count as u64;
        Ok(Record::Pages { count, at_byte })
    }

    /// The rest of a control record with tag `other`.
    fn control_record(&mut self, other: u8, at_byte: u64) -> Result<Record, MigrateError> {
        let Some(max) = max_body(other) else {
            return Err(MigrateError::UnknownRecord {
                tag: other,
                at_byte,
            });
        };
        let name = tag_name(other);
        let mut l = [0u8; 4];
        self.fill(&mut l, name)?;
        let len = u32::from_le_bytes(l) as usize;
        if len > max {
            return Err(MigrateError::Malformed {
                record: name,
                at_byte,
                why: format!("length {len}, a {name} record has at most {max} bytes"),
            });
        }
        let mut body = vec![0u8; len];
        self.fill(&mut body, name)?;
        let check = self.u64(name)?;
        if check != checksum(&body, u64::from(other)) {
            return Err(MigrateError::RecordChecksum {
                record: name,
                at_byte,
            });
        }
        Ok(Record::Control {
            tag: other,
            body,
            at_byte,
        })
    }

    /// The underlying reader.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.r
    }
}

/// A record's name, for error messages.
pub fn record_name(r: &Record) -> String {
    match r {
        Record::Pages { count, .. } => format!("PAGES ({count} pages)"),
        Record::Control { tag, .. } => tag_name(*tag).to_string(),
        Record::Probe { .. } => "PROBE".into(),
    }
}
