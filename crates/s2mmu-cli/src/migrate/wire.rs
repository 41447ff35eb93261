//! The migration stream, format version 2. All integers little-endian.
//!
//! ```text
//! opening  "S2MMIGR\0" version:u16, then HEADER (the main connection) or
//!          JOIN (each further channel)
//! control  tag:u8 len:u32 body[len] xxh3(body, seed=tag):u64
//!          (len is checked against the tag's own bound before anything
//!          is allocated)
//!          0x08 HEADER  mem_size:u64 page_size:u32 slots:u32 gpa_base:u64
//!                       vcpus:u32 channels:u16 backing_len:u8
//!                       backing[backing_len] flags:u8 (bit 0: verify-full,
//!                       bit 1: post-copy: the last two channels are its
//!                       request and answer connections, see `postcopy`)
//!          0x09 JOIN    session[16] channel:u16
//!          0x02 ROUND   round:u32 pages:u64
//!          0x03 STATE   the vCPUs' state and the workload (GuestState)
//!          0x04 VERIFY  (empty) after RESUMED, with verify-full: all of the
//!                       source's memory follows on the main channel, then END
//!          0x05 END     page_records:u64 bytes_before_end:u64 (per channel)
//!          0x06 ABORT   reason (UTF-8)
//!          0x84 ACCEPT  session[16]                      destination -> source
//!          0x85 PROBED  bytes:u64                        destination -> source
//!          0x86 PROGRESS (empty) while the destination populates its
//!                       memory before ACCEPT                destination -> source
//!          0x81 RESUMED slots:u32 (id:u16 digest:u64)*   destination -> source
//!          0x82 REJECTED reason (UTF-8)                  destination -> source
//!          0x83 VERIFIED differing_pages:u64 first_gpa:u64 destination -> source
//!          0x0a POSTCOPY the pages still missing, a bitmap over guest
//!                       memory (bit i: page i), after STATE: the
//!                       destination resumes at once (see `postcopy`)
//!          0x87 REQUEST gpa:u64 on the request connection   destination -> source
//!          0x88 POSTCOPY_RESUMED (empty)                    destination -> source
//!          0x89 DONE    (empty) every page is here          destination -> source
//!          0x8b MISSING the pages still missing (POSTCOPY's form), on a
//!                       post-copy recovery's main connection (it joins
//!                       as channel 0, then the request and answer
//!                       connections join again)       destination -> source
//!          0x8a FINAL   the post-copy figures, the vCPU states and digests
//!                       after the destination's run         destination -> source
//! pages    0x01 count:u16 entry[count] xxh3(count, entries; seed=0x01):u64
//!          data[4096] for each entry that is not a zero page, in order
//!          entry = gpa_and_flags:u64 (bit 0: zero page, no data follows)
//!                  hash:u64 (xxh3(data, seed=gpa); 0 for a zero page)
//! probe    0x07 len:u64 xxh3(len, seed=0x07):u64 len bytes of filler
//! ```
//! A migration over N channels (connections) sends each page on the
//! channel that owns its 2 MiB stripe (`page index / 512 mod N`), so a page
//! sent in two rounds arrives in order and no two channels ever write the
//! same page; every channel ends with its own END. Before the guest's
//! memory, the source sends a PROBE on every channel: the link's speed
//! with no guest and no checksum, the reference the rounds are compared
//! with.
//!
//! The source stops sending pages when it sends STATE; the destination
//! resumes the guest only after END on every channel, when every page of
//! guest memory has arrived, and says so with RESUMED and the per-slot
//! digests of the memory it resumed from (XXH3 of the pages' hashes in
//! order). A page's checksum is seeded with its address, so a page
//! delivered to the wrong address fails as surely as a flipped bit. END
//! carries the counts the receiver must have seen: a stream cut anywhere,
//! even at a record boundary, is detected.

use super::error::MigrateError;
use super::hash::{checksum, is_zero, page_hash};
use s2mmu_vm::VcpuState;
use std::io::{Read, Write};

/// First bytes of every connection.
pub const MAGIC: [u8; 8] = *b"S2MMIGR\0";
/// The format version this build writes and reads.
pub const VERSION: u16 = 2;
/// Guest page size of the stream.
pub const PAGE_SIZE: usize = 4096;
/// The largest guest this build migrates (the destination keeps a hash
/// per page, and with verify-full a copy of all memory).
pub const MAX_MEM: u64 = 64 << 30;
/// The most vCPUs a stream may carry.
pub const MAX_VCPUS: u32 = 4096;
/// The most memslots a stream may carry.
pub const MAX_SLOTS: u32 = 4096;
/// The most channels (connections) of one migration.
pub const MAX_CHANNELS: u16 = 64;
/// Pages per PAGES record at most.
pub const MAX_BATCH: usize = 256;
/// Pages of a stripe: the unit of guest memory one channel owns.
pub const STRIPE_PAGES: u64 = 512;
/// Bytes of a session id.
pub const SESSION_LEN: usize = 16;
/// Bytes a page record takes on the wire (its entry and its data).
pub const PAGE_RECORD_BYTES: u64 = 16 + PAGE_SIZE as u64;

/// The channel (of `channels`) that carries the page at `index` (counted
/// from the start of guest memory).
pub fn channel_of(index: u64, channels: u16) -> u16 {
    ((index / STRIPE_PAGES) % u64::from(channels.max(1))) as u16
}

/// Record tags.
pub mod tag {
    pub const PAGES: u8 = 0x01;
    pub const ROUND: u8 = 0x02;
    pub const STATE: u8 = 0x03;
    pub const VERIFY: u8 = 0x04;
    pub const END: u8 = 0x05;
    pub const ABORT: u8 = 0x06;
    pub const PROBE: u8 = 0x07;
    pub const HEADER: u8 = 0x08;
    pub const JOIN: u8 = 0x09;
    pub const POSTCOPY: u8 = 0x0a;
    pub const RESUMED: u8 = 0x81;
    pub const REJECTED: u8 = 0x82;
    pub const VERIFIED: u8 = 0x83;
    pub const ACCEPT: u8 = 0x84;
    pub const PROBED: u8 = 0x85;
    pub const PROGRESS: u8 = 0x86;
    pub const REQUEST: u8 = 0x87;
    pub const POSTCOPY_RESUMED: u8 = 0x88;
    pub const DONE: u8 = 0x89;
    pub const FINAL: u8 = 0x8a;
    pub const MISSING: u8 = 0x8b;
}

/// Name of a record tag, for error messages.
pub fn tag_name(t: u8) -> &'static str {
    match t {
        tag::PAGES => "PAGES",
        tag::ROUND => "ROUND",
        tag::STATE => "STATE",
        tag::VERIFY => "VERIFY",
        tag::END => "END",
        tag::ABORT => "ABORT",
        tag::PROBE => "PROBE",
        tag::HEADER => "HEADER",
        tag::JOIN => "JOIN",
        tag::RESUMED => "RESUMED",
        tag::REJECTED => "REJECTED",
        tag::VERIFIED => "VERIFIED",
        tag::ACCEPT => "ACCEPT",
        tag::PROBED => "PROBED",
        tag::PROGRESS => "PROGRESS",
        tag::POSTCOPY => "POSTCOPY",
        tag::REQUEST => "REQUEST",
        tag::POSTCOPY_RESUMED => "POSTCOPY_RESUMED",
        tag::DONE => "DONE",
        tag::FINAL => "FINAL",
        tag::MISSING => "MISSING",
        _ => "unknown",
    }
}

/// The largest body a control record with tag `t` may have (None: not a
/// control record).
fn max_body(t: u8) -> Option<usize> {
    Some(match t {
        tag::HEADER => 64 + 255,
        tag::JOIN => SESSION_LEN + 2,
        tag::ROUND => 12,
        tag::STATE => 32 + 32 * MAX_VCPUS as usize,
        tag::VERIFY | tag::PROGRESS | tag::POSTCOPY_RESUMED | tag::DONE => 0,
        tag::POSTCOPY | tag::MISSING => (MAX_MEM / PAGE_SIZE as u64 / 8) as usize,
        tag::REQUEST => 8,
        tag::FINAL => 64 + 32 * MAX_VCPUS as usize + 10 * MAX_SLOTS as usize,
        tag::END | tag::VERIFIED => 16,
        tag::ABORT | tag::REJECTED => 4096,
        tag::ACCEPT => SESSION_LEN,
        tag::PROBED => 8,
        tag::RESUMED => 4 + 10 * MAX_SLOTS as usize,
        _ => return None,
    })
}

/// What the destination needs to build the same guest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Bytes of guest memory.
    pub mem_size: u64,
    /// Memslots it is divided into.
    pub slots: u32,
    /// Guest-physical address of the first slot.
    pub gpa_base: u64,
    /// vCPUs the guest has (STATE must carry exactly these).
    pub vcpus: u32,
    /// Connections the stream is spread over (this one included).
    pub channels: u16,
    /// Backing name (selftests' names).
    pub backing: String,
    /// The source will send all of its memory again after the resume for
    /// a byte-for-byte comparison (the destination keeps a snapshot).
    pub verify_full: bool,
    /// Post-copy: two more connections than `channels` counts as data
    /// channels join, for page requests and their answers.
    pub postcopy: bool,
}

/// How a connection opens: the main one with the guest's header, a
/// further channel by joining the session the main one was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Opening {
    /// The main connection.
    Main(Header),
    /// Channel `channel` of the session `session`.
    Join {
        session: [u8; SESSION_LEN],
        channel: u16,
    },
}

/// The guest's vCPU state and the workload they run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestState {
    /// Bytes each vCPU's region has.
    pub bytes_per_vcpu: u64,
    /// Percent of accesses that write.
    pub write_percent: u32,
    /// 0 sequential, 1 random.
    pub pattern: u8,
    /// Pages per second per vCPU (0 unpaced).
    pub pace_pages_per_sec: u64,
    /// One per vCPU.
    pub vcpus: Vec<VcpuState>,
}

/// Little-endian encoder.
#[derive(Default)]
pub struct Enc(pub Vec<u8>);

impl Enc {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
}

/// Bounds-checked little-endian decoder of one record's body.
pub struct Dec<'a> {
    body: &'a [u8],
    record: &'static str,
    at_byte: u64,
}

impl<'a> Dec<'a> {
    pub fn new(body: &'a [u8], record: &'static str, at_byte: u64) -> Self {
        Dec {
            body,
            record,
            at_byte,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], MigrateError> {
        if self.body.len() < n {
            return Err(self.malformed(format!("needs {n} more bytes, has {}", self.body.len())));
        }
        let (a, b) = self.body.split_at(n);
        self.body = b;
        Ok(a)
    }

    pub fn malformed(&self, why: String) -> MigrateError {
        MigrateError::Malformed {
            record: self.record,
            at_byte: self.at_byte,
            why,
        }
    }

    pub fn u8(&mut self) -> Result<u8, MigrateError> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16, MigrateError> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    pub fn u32(&mut self) -> Result<u32, MigrateError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    pub fn u64(&mut self) -> Result<u64, MigrateError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], MigrateError> {
        self.take(n)
    }
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.body)
    }
    /// Fails unless every byte was consumed.
    pub fn finish(&self) -> Result<(), MigrateError> {
        if self.body.is_empty() {
            Ok(())
        } else {
            Err(self.malformed(format!("{} trailing bytes", self.body.len())))
        }
    }
}

impl Header {
    /// The HEADER record's body.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        let name = self.backing.as_bytes();
        e.u64(self.mem_size)
            .u32(PAGE_SIZE as u32)
            .u32(self.slots)
            .u64(self.gpa_base)
            .u32(self.vcpus)
            .u16(self.channels)
            .u8(name.len().min(255) as u8)
            .bytes(&name[..name.len().min(255)])
            .u8(u8::from(self.verify_full) | (u8::from(self.postcopy) << 1));
        e.0
    }

    /// Parses and checks a HEADER body against this build's bounds (the
    /// destination then checks it against its own limits).
    ///
    /// # Errors
    /// [`MigrateError::Malformed`].
    pub fn decode(body: &[u8], at_byte: u64) -> Result<Self, MigrateError> {
        let mut d = Dec::new(body, "HEADER", at_byte);
        let mem_size = d.u64()?;
        let page_size = d.u32()?;
        if page_size as usize != PAGE_SIZE {
            return Err(d.malformed(format!("page size {page_size}, expected {PAGE_SIZE}")));
        }
        let slots = d.u32()?;
        let gpa_base = d.u64()?;
        let vcpus = d.u32()?;
        let channels = d.u16()?;
        let n = d.u8()? as usize;
        let backing = String::from_utf8(d.bytes(n)?.to_vec())
            .map_err(|_| d.malformed("backing name is not UTF-8".into()))?;
        let flags = d.u8()?;
        if flags > 3 {
            return Err(d.malformed(format!("unknown flags {flags:#04x}")));
        }
        d.finish()?;
        if mem_size == 0 || !mem_size.is_multiple_of(PAGE_SIZE as u64) || mem_size > MAX_MEM {
            return Err(d.malformed(format!(
                "guest memory of {mem_size} bytes (whole pages, at most {MAX_MEM})"
            )));
        }
        if slots == 0 || slots > MAX_SLOTS {
            return Err(d.malformed(format!("{slots} memslots (1 to {MAX_SLOTS})")));
        }
        if vcpus == 0 || vcpus > MAX_VCPUS {
            return Err(d.malformed(format!("{vcpus} vCPUs (1 to {MAX_VCPUS})")));
        }
        if channels == 0 || channels > MAX_CHANNELS {
            return Err(d.malformed(format!("{channels} channels (1 to {MAX_CHANNELS})")));
        }
        if gpa_base.checked_add(mem_size).is_none() || !gpa_base.is_multiple_of(PAGE_SIZE as u64) {
            return Err(d.malformed(format!(
                "guest memory at {gpa_base:#x} (page-aligned, below 2^64)"
            )));
        }
        Ok(Header {
            mem_size,
            slots,
            gpa_base,
            vcpus,
            channels,
            backing,
            verify_full: flags & 1 != 0,
            postcopy: flags & 2 != 0,
        })
    }
}

impl GuestState {
    /// The STATE record's body.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.u64(self.bytes_per_vcpu)
            .u32(self.write_percent)
            .u8(self.pattern)
            .u64(self.pace_pages_per_sec)
            .u32(self.vcpus.len() as u32);
        for v in &self.vcpus {
            e.u64(v.pass).u64(v.next_page).u64(v.rng).u64(v.writes);
        }
        e.0
    }

    /// Parses a STATE record's body.
    ///
    /// # Errors
    /// [`MigrateError::Malformed`].
    pub fn decode(body: &[u8], at_byte: u64) -> Result<Self, MigrateError> {
        let mut d = Dec::new(body, "STATE", at_byte);
        let bytes_per_vcpu = d.u64()?;
        let write_percent = d.u32()?;
        let pattern = d.u8()?;
        let pace_pages_per_sec = d.u64()?;
        let n = d.u32()?;
        if n == 0 || n > MAX_VCPUS {
            return Err(d.malformed(format!("{n} vCPUs")));
        }
        let mut vcpus = Vec::new();
        for _ in 0..n {
            vcpus.push(VcpuState {
                pass: d.u64()?,
                next_page: d.u64()?,
                rng: d.u64()?,
                writes: d.u64()?,
            });
        }
        d.finish()?;
        Ok(GuestState {
            bytes_per_vcpu,
            write_percent,
            pattern,
            pace_pages_per_sec,
            vcpus,
        })
    }
}

/// Pages gathered for one PAGES record: their entries and the data of
/// those that are not all zeros, ready to go out in two writes.
pub struct Batch {
    /// tag, count, entries (the check is appended when written).
    head: Vec<u8>,
    data: Box<[u8]>,
    count: usize,
    data_pages: usize,
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
        let at = self.data_pages * PAGE_SIZE;
        let page = &mut self.data[at..at + PAGE_SIZE];
        let zero = fill(page);
        let (word, hash) = if zero {
            (gpa | 1, 0)
        } else {
            self.data_pages += 1;
            (gpa, page_hash(page, gpa))
        };
        self.head.extend_from_slice(&word.to_le_bytes());
        self.head.extend_from_slice(&hash.to_le_bytes());
        self.count += 1;
        Some(zero)
    }

    fn clear(&mut self) {
        self.head.truncate(3);
        self.count = 0;
        self.data_pages = 0;
    }
}

/// Writes a stream, counting its bytes.
pub struct WireWriter<W: Write> {
    w: W,
    /// Bytes written so far.
    pub pos: u64,
    /// Page records written so far (zero pages included).
    pub pages: u64,
    /// Of those, zero pages (sent without their bytes).
    pub zero_pages: u64,
}

impl<W: Write> WireWriter<W> {
    /// A writer of replies (no opening).
    pub fn replies(w: W) -> Self {
        WireWriter {
            w,
            pos: 0,
            pages: 0,
            zero_pages: 0,
        }
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

    /// Writes the batch as one PAGES record (nothing when it is empty) and
    /// empties it.
    ///
    /// # Errors
    /// [`MigrateError::Io`], [`MigrateError::Timeout`].
    pub fn batch(&mut self, b: &mut Batch) -> Result<(), MigrateError> {
        if b.is_empty() {
            return Ok(());
        }
        let count = b.count as u16;
        b.head[1..3].copy_from_slice(&count.to_le_bytes());
        let check = checksum(&b.head[1..], u64::from(tag::PAGES));
        b.head.extend_from_slice(&check.to_le_bytes());
        let r = self.put(&b.head).and_then(|_| {
            let data = &b.data[..b.data_pages * PAGE_SIZE];
            self.put(data)
        });
        self.pages += b.count as u64;
        self.zero_pages += (b.count - b.data_pages) as u64;
        b.clear();
        r
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

/// One page of a PAGES record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Its guest-physical address (page-aligned).
    pub gpa: u64,
    /// A zero page: no data follows for it.
    pub zero: bool,
    /// The checksum its data must have (0 for a zero page).
    pub hash: u64,
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
    raw: Vec<u8>,
    scratch: Vec<u8>,
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
            raw: vec![0u8; 16 * MAX_BATCH + 8],
            scratch: Vec::new(),
        }
    }

    /// Reads and checks a connection's opening.
    ///
    /// # Errors
    /// [`MigrateError::BadMagic`], [`MigrateError::Version`],
    /// [`MigrateError::Truncated`], [`MigrateError::RecordChecksum`],
    /// [`MigrateError::Malformed`].
    pub fn open(r: R) -> Result<(Self, Opening), MigrateError> {
        let mut s = Self::replies(r);
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
        match s.next_record()? {
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
        fill_from(&mut self.r, &mut self.pos, buf, inside)
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

    /// Reads the next page's data of the last PAGES record into `dst`
    /// (one page); the caller checks its hash.
    ///
    /// # Errors
    /// [`MigrateError::Truncated`], [`MigrateError::Io`],
    /// [`MigrateError::Timeout`].
    pub fn read_page(&mut self, dst: &mut [u8]) -> Result<(), MigrateError> {
        self.fill(dst, "a PAGES record's data")
    }

    /// Reads the data of several pages at once into `bufs` (one page
    /// each), with as few system calls as the connection allows; the
    /// caller checks their hashes.
    ///
    /// # Errors
    /// [`MigrateError::Truncated`], [`MigrateError::Io`],
    /// [`MigrateError::Timeout`].
    pub fn read_pages(
        &mut self,
        mut bufs: &mut [std::io::IoSliceMut<'_>],
    ) -> Result<(), MigrateError> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut got = 0usize;
        while got < total {
            match self.r.read_vectored(bufs) {
                Ok(0) => {
                    return Err(MigrateError::Truncated {
                        at_byte: self.pos,
                        inside: "a PAGES record's data",
                    })
                }
                Ok(n) => {
                    got += n;
                    self.pos += n as u64;
                    std::io::IoSliceMut::advance_slices(&mut bufs, n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(MigrateError::io("receiving the migration stream", &e)),
            }
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
        let at_byte = self.pos;
        let mut t = [0u8; 1];
        self.fill(&mut t, "the next record's tag: the stream ended before END")?;
        match t[0] {
            tag::PAGES => {
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
                let mut raw = std::mem::take(&mut self.raw);
                let r = self.fill(&mut raw[..16 * count + 8], "a PAGES record");
                self.raw = raw;
                r?;
                let (entries, check) = self.raw[..16 * count + 8].split_at(16 * count);
                let mut h = xxhash_rust::xxh3::Xxh3::with_seed(u64::from(tag::PAGES));
                h.update(&c);
                h.update(entries);
                if h.digest().to_le_bytes() != check {
                    return Err(MigrateError::RecordChecksum {
                        record: "PAGES",
                        at_byte,
                    });
                }
                self.entries.clear();
                for e in entries.chunks_exact(16) {
                    let word = u64::from_le_bytes(e[..8].try_into().expect("8 bytes"));
                    let hash = u64::from_le_bytes(e[8..].try_into().expect("8 bytes"));
                    let zero = word & 1 != 0;
                    if word & (PAGE_SIZE as u64 - 2) != 0 || (zero && hash != 0) {
                        return Err(MigrateError::Malformed {
                            record: "PAGES",
                            at_byte,
                            why: format!("entry {word:#x}/{hash:#x} is not a page address"),
                        });
                    }
                    self.zero_pages += u64::from(zero);
                    self.entries.push(Entry {
                        gpa: word & !1,
                        zero,
                        hash,
                    });
                }
                self.pages += count as u64;
                Ok(Record::Pages { count, at_byte })
            }
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
            other => {
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
        }
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

fn fill_from<R: Read>(
    r: &mut R,
    pos: &mut u64,
    buf: &mut [u8],
    inside: &'static str,
) -> Result<(), MigrateError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(MigrateError::Truncated {
                    at_byte: *pos + got as u64,
                    inside,
                })
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                *pos += got as u64;
                return Err(MigrateError::io("receiving the migration stream", &e));
            }
        }
    }
    *pos += got as u64;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        }
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
                hash: h
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
        let good = w.w;
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
    fn state_round_trips_and_rejects_nonsense() {
        let s = GuestState {
            bytes_per_vcpu: 1 << 20,
            write_percent: 100,
            pattern: 0,
            pace_pages_per_sec: 8192,
            vcpus: vec![VcpuState {
                pass: 3,
                next_page: 7,
                rng: 99,
                writes: 1000,
            }],
        };
        assert_eq!(GuestState::decode(&s.encode(), 0).unwrap(), s);
        let mut b = s.encode();
        b.pop();
        assert!(matches!(
            GuestState::decode(&b, 0),
            Err(MigrateError::Malformed {
                record: "STATE",
                ..
            })
        ));
    }

    #[test]
    fn stripes_spread_over_channels() {
        assert_eq!(channel_of(0, 1), 0);
        assert_eq!(channel_of(STRIPE_PAGES - 1, 4), 0);
        assert_eq!(channel_of(STRIPE_PAGES, 4), 1);
        assert_eq!(channel_of(4 * STRIPE_PAGES, 4), 0);
    }
}
