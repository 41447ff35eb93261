//! The sending side: PAGES batches, control records, probes and END.

use super::codec::Enc;
use super::compress::{
    compress_buffer, compress_page, CompressStats, Compression, Compressor, Plan,
    COMPRESSED_LEN_BYTES,
};
use super::header::Header;
use super::limits::{
    tag, ENTRY_LZ4, ENTRY_ZERO, MAGIC, MAX_BATCH, PAGE_SIZE, SESSION_LEN, VERSION,
};
use crate::hash::{checksum, is_zero, page_hash};
use crate::stages::{SendStages, StageClock};
use crate::stream_error::MigrateError;
use crate::transport::{record_plaintexts, sealed_len, sealed_offset, Connection};
use std::io::{IoSlice, Write};
use std::time::Instant;

/// A PAGES record being filled: each page's entry, and the bytes of
/// those that are not all zeros, ready to go out in one vectored write.
/// A [sealed](Batch::sealed) batch lays its pages out with room for the
/// TLS records around them, so a record layer seals them where they lie
/// ([`Connection::write_sealed`]) instead of copying them first.
pub struct Batch {
    /// tag, count, entries (the check is appended when written).
    head: Vec<u8>,
    data: Box<[u8]>,
    count: usize,
    data_pages: usize,
    /// Entries whose hash is filled in (the first `hashed` pages; of
    /// them `hashed_data` carry data).
    hashed: usize,
    hashed_data: usize,
    /// Pages laid out as [`sealed_offset`] says.
    sealed: bool,
}

impl Default for Batch {
    fn default() -> Self {
        Self::new()
    }
}

impl Batch {
    /// An empty batch (room for [`MAX_BATCH`] pages).
    pub fn new() -> Self {
        let mut head = Vec::with_capacity(3 + 16 * MAX_BATCH + 8);
        head.extend_from_slice(&[tag::PAGES, 0, 0]);
        Batch {
            head,
            data: vec![0u8; MAX_BATCH * PAGE_SIZE].into_boxed_slice(),
            count: 0,
            data_pages: 0,
            hashed: 0,
            hashed_data: 0,
            sealed: false,
        }
    }

    /// An empty batch whose pages lie where [`Connection::write_sealed`]
    /// wants the records' plaintext, for a connection that
    /// [seals in place](Connection::seals_in_place).
    pub fn sealed() -> Self {
        Batch {
            data: vec![0u8; sealed_len(MAX_BATCH * PAGE_SIZE)].into_boxed_slice(),
            sealed: true,
            ..Self::new()
        }
    }

    /// Whether the pages are laid out for sealing in place.
    pub fn is_sealed(&self) -> bool {
        self.sealed
    }

    /// Where data page `j` lies in `data`.
    fn page_at(&self, j: usize) -> usize {
        match self.sealed {
            true => sealed_offset(j * PAGE_SIZE),
            false => j * PAGE_SIZE,
        }
    }

    /// Pages in it.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether it holds no page.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes the batch takes on the wire.
    pub fn wire_bytes(&self) -> u64 {
        (self.head.len() + 8 + self.data_pages * PAGE_SIZE) as u64
    }

    /// Whether another page does not fit.
    pub fn is_full(&self) -> bool {
        self.count >= MAX_BATCH
    }

    /// Adds the page at `gpa`, whose bytes `fill` writes into the batch;
    /// returns whether it was a zero page (sent as a flag, without its
    /// bytes). A full batch takes nothing and returns `None`.
    pub fn push(&mut self, gpa: u64, fill: impl FnOnce(&mut [u8])) -> Option<bool> {
        self.push_known(gpa, |p| {
            fill(p);
            is_zero(p)
        })
    }

    /// As [`Batch::push`], with `fill` saying whether the page it wrote
    /// is all zeros (a copy that looked at every word anyway).
    pub fn push_known(&mut self, gpa: u64, fill: impl FnOnce(&mut [u8]) -> bool) -> Option<bool> {
        if self.is_full() {
            return None;
        }
        let at = self.page_at(self.data_pages);
        let page = &mut self.data[at..at + PAGE_SIZE];
        let zero = fill(page);
        // The hash is filled in when the batch is written (all pages in
        // one pass, timed as a stage of its own).
        let word = if zero {
            gpa | 1
        } else {
            self.data_pages += 1;
            gpa
        };
        self.head.extend_from_slice(&word.to_le_bytes());
        self.head.extend_from_slice(&0u64.to_le_bytes());
        self.count += 1;
        Some(zero)
    }

    /// Writes the hash of every data page added since the last call into
    /// its entry.
    fn hash_pages(&mut self) {
        let mut j = self.hashed_data;
        for k in self.hashed..self.count {
            let at = 3 + 16 * k;
            let word = u64::from_le_bytes(self.head[at..at + 8].try_into().expect("8 bytes"));
            if word & 1 != 0 {
                continue;
            }
            let p = self.page_at(j);
            let page = &self.data[p..p + PAGE_SIZE];
            let hash = page_hash(page, word);
            self.head[at + 8..at + 16].copy_from_slice(&hash.to_le_bytes());
            j += 1;
        }
        self.hashed = self.count;
        self.hashed_data = j;
    }

    fn clear(&mut self) {
        self.head.truncate(3);
        self.count = 0;
        self.data_pages = 0;
        self.hashed = 0;
        self.hashed_data = 0;
    }
}

/// A connection's write of a head and records sealed in place
/// ([`Connection::write_sealed`]).
type SealFn<W> = fn(&mut W, &[u8], &mut [u8], usize) -> std::io::Result<()>;

/// Writes a stream, counting its bytes.
pub struct WireWriter<W: Write> {
    w: W,
    /// Bytes written so far.
    pub pos: u64,
    /// Page records written so far (zero pages included).
    pub pages: u64,
    /// Of those, zero pages (sent without their bytes).
    pub zero_pages: u64,
    /// Time spent hashing and writing PAGES records (the reading of
    /// guest memory is the caller's to add).
    pub stages: SendStages,
    /// When pages go compressed, and what compression did.
    compressor: Compressor,
    /// A compressed batch's data as it goes out.
    packed: Vec<u8>,
    /// A batch's compressed pages, back to back, and the room one page's
    /// compression needs.
    lz4: Vec<u8>,
    lz4_room: usize,
}

impl<W: Write> WireWriter<W> {
    /// A writer of replies (no opening).
    pub fn replies(w: W) -> Self {
        WireWriter {
            w,
            pos: 0,
            pages: 0,
            zero_pages: 0,
            stages: SendStages::default(),
            compressor: Compressor::new(Compression::Off),
            packed: Vec::new(),
            lz4: Vec::new(),
            lz4_room: compress_buffer().len(),
        }
    }

    /// Sets when pages go compressed (a new writer compresses none).
    pub fn set_compression(&mut self, c: Compression) {
        self.compressor = Compressor::new(c);
    }

    /// When pages go compressed.
    pub fn compression(&self) -> Compression {
        self.compressor.mode()
    }

    /// What compression did so far.
    pub fn compression_stats(&self) -> CompressStats {
        self.compressor.stats
    }

    /// Starts the main connection's stream: the opening and HEADER.
    ///
    /// # Errors
    /// [`MigrateError::Io`], [`MigrateError::Timeout`].
    pub fn new(w: W, header: &Header) -> Result<Self, MigrateError> {
        let mut s = Self::replies(w);
        let mut e = Enc::default();
        e.bytes(&MAGIC).u16(VERSION);
        s.put(&e.0)?;
        s.control(tag::HEADER, &header.encode())?;
        Ok(s)
    }

    /// Starts a further channel's stream: the opening and JOIN.
    ///
    /// # Errors
    /// [`MigrateError::Io`], [`MigrateError::Timeout`].
    pub fn join(w: W, session: &[u8; SESSION_LEN], channel: u16) -> Result<Self, MigrateError> {
        let mut s = Self::replies(w);
        let mut e = Enc::default();
        e.bytes(&MAGIC).u16(VERSION);
        s.put(&e.0)?;
        let mut b = Enc::default();
        b.bytes(session).u16(channel);
        s.control(tag::JOIN, &b.0)?;
        s.flush()?;
        Ok(s)
    }

    fn put(&mut self, b: &[u8]) -> Result<(), MigrateError> {
        self.w
            .write_all(b)
            .map_err(|e| MigrateError::io("sending the migration stream", &e))?;
        self.pos += b.len() as u64;
        Ok(())
    }

    /// Writes `a` then `b`, both in one vectored write where the
    /// connection takes them at once (a PAGES record's head and data: one
    /// system call instead of two).
    fn put_pair(&mut self, a: &[u8], b: &[u8]) -> Result<(), MigrateError> {
        let total = a.len() + b.len();
        let mut done = 0;
        while done < total {
            let bufs = if done < a.len() {
                [IoSlice::new(&a[done..]), IoSlice::new(b)]
            } else {
                [IoSlice::new(&b[done - a.len()..]), IoSlice::new(&[])]
            };
            match self.w.write_vectored(&bufs) {
                Ok(0) => {
                    let e = std::io::Error::from(std::io::ErrorKind::WriteZero);
                    return Err(MigrateError::io("sending the migration stream", &e));
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(MigrateError::io("sending the migration stream", &e)),
            }
        }
        self.pos += total as u64;
        Ok(())
    }

    /// Writes the batch as one PAGES record (nothing when it is empty) and
    /// empties it, its pages compressed as the writer's
    /// [`Compression`] says.
    ///
    /// # Errors
    /// [`MigrateError::Io`], [`MigrateError::Timeout`].
    pub fn batch(&mut self, b: &mut Batch) -> Result<(), MigrateError> {
        self.send(b, &mut |_| {}, None, None)
    }

    /// As [`WireWriter::batch`], calling `pace` first with the bytes the
    /// record takes on the wire (after compression): a bandwidth limit's
    /// wait, counted by `auto` compression as time on the link.
    ///
    /// # Errors
    /// [`MigrateError::Io`], [`MigrateError::Timeout`].
    pub fn batch_paced(
        &mut self,
        b: &mut Batch,
        pace: &mut dyn FnMut(u64),
    ) -> Result<(), MigrateError> {
        self.send(b, pace, None, None)
    }

    /// Writes the batch: its head finished (hashes, compression, check),
    /// `pace` told its bytes on the wire, then its head and data, the
    /// data sealed in place by `seal` when given and the batch is
    /// [sealed](Batch::sealed) and went uncompressed; `unsent`: the
    /// connection's unsent bytes, for the compression policy.
    fn send(
        &mut self,
        b: &mut Batch,
        pace: &mut dyn FnMut(u64),
        seal: Option<SealFn<W>>,
        unsent: Option<u64>,
    ) -> Result<(), MigrateError> {
        if b.is_empty() {
            return Ok(());
        }
        let packed = self.finish_head(b, unsent);
        let plain = b.data_pages * PAGE_SIZE;
        let data_len = if packed { self.packed.len() } else { plain };
        let wire = (b.head.len() + data_len) as u64;
        let t = Instant::now();
        pace(wire);
        let clock = StageClock::start();
        let r = if packed {
            let data = std::mem::take(&mut self.packed);
            let r = self.put_pair(&b.head, &data);
            self.packed = data;
            r
        } else if let (true, Some(seal)) = (b.sealed, seal) {
            let r = seal(&mut self.w, &b.head, &mut b.data, plain)
                .map_err(|e| MigrateError::io("sending the migration stream", &e));
            if r.is_ok() {
                self.pos += wire;
            }
            r
        } else if b.sealed {
            // Not a sealing connection: each record's plaintext as it is.
            self.put(&b.head).and_then(|()| {
                record_plaintexts(&b.data[..sealed_len(plain)], plain).try_for_each(|p| self.put(p))
            })
        } else {
            self.put_pair(&b.head, &b.data[..plain])
        };
        self.compressor.wrote(wire, t.elapsed().as_nanos() as u64);
        self.account(b, &clock);
        r
    }

    /// Hashes the batch's pages (timed as the hash stage), compresses
    /// those the policy says into `packed` (true when at least one went
    /// compressed: `packed` then holds the record's whole data) and
    /// completes its head (count, check).
    fn finish_head(&mut self, b: &mut Batch, unsent: Option<u64>) -> bool {
        let t = Instant::now();
        b.hash_pages();
        self.stages.hash_ns += t.elapsed().as_nanos() as u64;
        let packed = self.compress(b, unsent);
        let count = b.count as u16;
        b.head[1..3].copy_from_slice(&count.to_le_bytes());
        let check = checksum(&b.head[1..], u64::from(tag::PAGES));
        b.head.extend_from_slice(&check.to_le_bytes());
        packed
    }

    /// Tries to compress the batch's data pages as the policy plans; when
    /// some page compressed, flags its entry and lays the record's data
    /// out in `packed` (each page compressed or raw, in order).
    fn compress(&mut self, b: &mut Batch, unsent: Option<u64>) -> bool {
        let tries = match self.compressor.plan(b.data_pages, unsent) {
            Plan::None => return false,
            Plan::Sample(k) => k.min(b.data_pages),
            Plan::All => b.data_pages,
        };
        let t = Instant::now();
        // Each compressed page: its data page number, where its bytes
        // start in `lz4`, and their length.
        let mut kept: Vec<(usize, usize, usize)> = Vec::new();
        self.lz4.clear();
        let mut saved = 0u64;
        for j in 0..tries {
            let p = b.page_at(j);
            let start = self.lz4.len();
            self.lz4.resize(start + self.lz4_room, 0);
            match compress_page(&b.data[p..p + PAGE_SIZE], &mut self.lz4[start..]) {
                Some(n) => {
                    self.lz4.truncate(start + n);
                    kept.push((j, start, n));
                    saved += (PAGE_SIZE - n - COMPRESSED_LEN_BYTES) as u64;
                }
                None => self.lz4.truncate(start),
            }
        }
        let ns = t.elapsed().as_nanos() as u64;
        self.compressor.tried(tries, saved, ns);
        let st = &mut self.compressor.stats;
        st.tried_raw += (tries - kept.len()) as u64;
        if kept.is_empty() {
            return false;
        }
        st.pages += kept.len() as u64;
        st.raw_bytes += (kept.len() * PAGE_SIZE) as u64;
        st.wire_bytes += kept.len() as u64 * PAGE_SIZE as u64 - saved;
        self.packed.clear();
        let mut next = kept.iter().peekable();
        let mut j = 0usize;
        for k in 0..b.count {
            let at = 3 + 16 * k;
            let word = u64::from_le_bytes(b.head[at..at + 8].try_into().expect("8 bytes"));
            if word & ENTRY_ZERO != 0 {
                continue;
            }
            match next.peek() {
                Some(&&(kj, start, n)) if kj == j => {
                    next.next();
                    b.head[at..at + 8].copy_from_slice(&(word | ENTRY_LZ4).to_le_bytes());
                    self.packed.extend_from_slice(&(n as u16).to_le_bytes());
                    self.packed.extend_from_slice(&self.lz4[start..start + n]);
                }
                _ => {
                    let p = b.page_at(j);
                    self.packed.extend_from_slice(&b.data[p..p + PAGE_SIZE]);
                }
            }
            j += 1;
        }
        true
    }

    /// Counts the written batch's pages and time, and empties it.
    fn account(&mut self, b: &mut Batch, clock: &StageClock) {
        self.stages.write_ns += clock.wall_ns();
        self.stages.socket_ns += clock.socket_ns().0;
        self.stages.pages += b.count as u64;
        self.pages += b.count as u64;
        self.zero_pages += (b.count - b.data_pages) as u64;
        b.clear();
    }

    /// Writes one page as a PAGES record of its own; returns its hash.
    ///
    /// # Errors
    /// [`MigrateError::Io`], [`MigrateError::Timeout`].
    pub fn page(&mut self, gpa: u64, data: &[u8; PAGE_SIZE]) -> Result<u64, MigrateError> {
        let mut b = Batch::new();
        b.push(gpa, |p| p.copy_from_slice(data));
        self.batch(&mut b)?;
        Ok(page_hash(data, gpa))
    }

    /// Writes a control record.
    ///
    /// # Errors
    /// [`MigrateError::Io`], [`MigrateError::Timeout`].
    pub fn control(&mut self, t: u8, body: &[u8]) -> Result<(), MigrateError> {
        let mut e = Enc::default();
        e.u8(t)
            .u32(body.len() as u32)
            .bytes(body)
            .u64(checksum(body, u64::from(t)));
        self.put(&e.0)
    }

    /// Writes a PROBE of `len` bytes of `filler` (repeated), calling
    /// `pace` with the size of each write before it, and flushes.
    ///
    /// # Errors
    /// [`MigrateError::Io`], [`MigrateError::Timeout`].
    pub fn probe(
        &mut self,
        len: u64,
        filler: &[u8],
        pace: &mut dyn FnMut(u64),
    ) -> Result<(), MigrateError> {
        let mut e = Enc::default();
        e.u8(tag::PROBE)
            .u64(len)
            .u64(checksum(&len.to_le_bytes(), u64::from(tag::PROBE)));
        self.put(&e.0)?;
        let mut left = len;
        while left > 0 && !filler.is_empty() {
            let n = left.min(filler.len() as u64) as usize;
            pace(n as u64);
            self.put(&filler[..n])?;
            left -= n as u64;
        }
        self.flush()
    }

    /// Writes END (the counts the receiver checks) and flushes.
    ///
    /// # Errors
    /// [`MigrateError::Io`], [`MigrateError::Timeout`].
    pub fn end(&mut self) -> Result<(), MigrateError> {
        let mut e = Enc::default();
        e.u64(self.pages).u64(self.pos);
        self.control(tag::END, &e.0)?;
        self.flush()
    }

    /// Flushes buffered bytes to the socket.
    ///
    /// # Errors
    /// [`MigrateError::Io`], [`MigrateError::Timeout`].
    pub fn flush(&mut self) -> Result<(), MigrateError> {
        self.w
            .flush()
            .map_err(|e| MigrateError::io("sending the migration stream", &e))
    }

    /// The underlying writer.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.w
    }

    /// The underlying writer, by value.
    pub fn into_inner(self) -> W {
        self.w
    }
}

impl<W: Connection> WireWriter<W> {
    /// As [`WireWriter::batch`]; a [sealed](Batch::sealed) batch's pages
    /// are sealed where they lie by a connection that
    /// [seals in place](Connection::seals_in_place) (no copy), its head
    /// and records written together. A batch whose pages went compressed
    /// is written as a plain one (its data is no longer where the records
    /// would be sealed).
    ///
    /// # Errors
    /// [`MigrateError::Io`], [`MigrateError::Timeout`].
    pub fn sealed_batch(&mut self, b: &mut Batch) -> Result<(), MigrateError> {
        self.sealed_batch_paced(b, &mut |_| {})
    }

    /// As [`WireWriter::sealed_batch`], paced as
    /// [`WireWriter::batch_paced`] says; `auto` compression also looks at
    /// the connection's [unsent bytes](Connection::unsent_bytes).
    ///
    /// # Errors
    /// [`MigrateError::Io`], [`MigrateError::Timeout`].
    pub fn sealed_batch_paced(
        &mut self,
        b: &mut Batch,
        pace: &mut dyn FnMut(u64),
    ) -> Result<(), MigrateError> {
        let seal: Option<SealFn<W>> = match self.w.seals_in_place() {
            true => Some(|w: &mut W, head: &[u8], frames: &mut [u8], plain: usize| {
                w.write_sealed(head, frames, plain)
            }),
            false => None,
        };
        let unsent = self.w.unsent_bytes();
        self.send(b, pace, seal, unsent)
    }
}
