//! The migration stream, format version 1. All integers little-endian.
//!
//! ```text
//! header   "S2MMIGR\0"  version:u16  len:u32  body[len]  xxh64(body):u64
//!          body = mem_size:u64 page_size:u32 slots:u32 gpa_base:u64
//!                 backing_len:u8 backing[backing_len] flags:u8 (bit 0: verify-full)
//! page     0x01 gpa:u64 xxh64(data, seed=gpa):u64 data[page_size]
//! control  tag:u8 len:u32 body[len] xxh64(body, seed=tag):u64
//!          0x02 ROUND   round:u32 pages:u64
//!          0x03 STATE   the vCPUs' state and the workload (GuestState)
//!          0x04 VERIFY  (empty) after RESUMED, with verify-full: all of the
//!                       source's memory follows as PAGE records, then END
//!          0x05 END     page_records:u64 bytes_before_end:u64
//!          0x06 ABORT   reason (UTF-8)
//!          0x81 RESUMED slots:u32 (id:u16 digest:u64)*   destination -> source
//!          0x82 REJECTED reason (UTF-8)                  destination -> source
//!          0x83 VERIFIED differing_pages:u64 first_gpa:u64 destination -> source
//! ```
//! The source stops sending pages when it sends STATE; the destination
//! resumes the guest only after END, when every page of guest memory has
//! arrived, and says so with RESUMED and the per-slot digests of the
//! memory it resumed from (XXH64 of the pages' hashes in order).
//! A page's checksum is seeded with its address, so a page delivered to
//! the wrong address fails as surely as a flipped bit. END carries the
//! counts the receiver must have seen: a stream cut anywhere, even at a
//! record boundary, is detected.

use super::error::MigrateError;
use super::hash::xxh64;
use s2mmu_vm::VcpuState;
use std::io::{Read, Write};

/// First bytes of every stream.
pub const MAGIC: [u8; 8] = *b"S2MMIGR\0";
/// The format version this build writes and reads.
pub const VERSION: u16 = 1;
/// Guest page size of the stream.
pub const PAGE_SIZE: usize = 4096;
/// The largest guest this build migrates (the destination keeps a hash
/// per page, and with verify-full a copy of all memory).
pub const MAX_MEM: u64 = 64 << 30;
/// Bytes a page record takes on the wire.
pub const PAGE_RECORD_BYTES: u64 = 1 + 8 + 8 + PAGE_SIZE as u64;

/// Record tags.
pub mod tag {
    pub const PAGE: u8 = 0x01;
    pub const ROUND: u8 = 0x02;
    pub const STATE: u8 = 0x03;
    pub const VERIFY: u8 = 0x04;
    pub const END: u8 = 0x05;
    pub const ABORT: u8 = 0x06;
    pub const RESUMED: u8 = 0x81;
    pub const REJECTED: u8 = 0x82;
    pub const VERIFIED: u8 = 0x83;
}

/// Name of a record tag, for error messages.
pub fn tag_name(t: u8) -> &'static str {
    match t {
        tag::PAGE => "PAGE",
        tag::ROUND => "ROUND",
        tag::STATE => "STATE",
        tag::VERIFY => "VERIFY",
        tag::END => "END",
        tag::ABORT => "ABORT",
        tag::RESUMED => "RESUMED",
        tag::REJECTED => "REJECTED",
        tag::VERIFIED => "VERIFIED",
        _ => "unknown",
    }
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
    /// Backing name (selftests' names).
    pub backing: String,
    /// The source will send all of its memory again after the resume for
    /// a byte-for-byte comparison (the destination keeps a snapshot).
    pub verify_full: bool,
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
    fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        let name = self.backing.as_bytes();
        e.u64(self.mem_size)
            .u32(PAGE_SIZE as u32)
            .u32(self.slots)
            .u64(self.gpa_base)
            .u8(name.len().min(255) as u8)
            .bytes(&name[..name.len().min(255)])
            .u8(u8::from(self.verify_full));
        e.0
    }

    fn decode(body: &[u8]) -> Result<Self, MigrateError> {
        let mut d = Dec::new(body, "header", 0);
        let mem_size = d.u64()?;
        let page_size = d.u32()?;
        if page_size as usize != PAGE_SIZE {
            return Err(d.malformed(format!("page size {page_size}, expected {PAGE_SIZE}")));
        }
        let slots = d.u32()?;
        let gpa_base = d.u64()?;
        let n = d.u8()? as usize;
        let backing = String::from_utf8(d.bytes(n)?.to_vec())
            .map_err(|_| d.malformed("backing name is not UTF-8".into()))?;
        let flags = d.u8()?;
        if flags > 1 {
            return Err(d.malformed(format!("unknown flags {flags:#04x}")));
        }
        d.finish()?;
        if mem_size == 0 || !mem_size.is_multiple_of(PAGE_SIZE as u64) || mem_size > MAX_MEM {
            return Err(d.malformed(format!(
                "guest memory of {mem_size} bytes (whole pages, at most {MAX_MEM})"
            )));
        }
        Ok(Header {
            mem_size,
            slots,
            gpa_base,
            backing,
            verify_full: flags & 1 != 0,
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
        if n == 0 || n > 4096 {
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

/// Writes a stream, counting its bytes.
pub struct WireWriter<W: Write> {
    w: W,
    /// Bytes written so far.
    pub pos: u64,
    /// Page records written so far.
    pub pages: u64,
}

impl<W: Write> WireWriter<W> {
    /// A writer of replies (no header).
    pub fn replies(w: W) -> Self {
        WireWriter {
            w,
            pos: 0,
            pages: 0,
        }
    }

    /// Starts a stream: writes the header.
    ///
    /// # Errors
    /// [`MigrateError::Io`].
    pub fn new(w: W, header: &Header) -> Result<Self, MigrateError> {
        let mut s = WireWriter {
            w,
            pos: 0,
            pages: 0,
        };
        let body = header.encode();
        let mut e = Enc::default();
        e.bytes(&MAGIC)
            .u16(VERSION)
            .u32(body.len() as u32)
            .bytes(&body)
            .u64(xxh64(&body, 0));
        s.put(&e.0)?;
        Ok(s)
    }

    fn put(&mut self, b: &[u8]) -> Result<(), MigrateError> {
        self.w
            .write_all(b)
            .map_err(|e| MigrateError::io("sending the migration stream", &e))?;
        self.pos += b.len() as u64;
        Ok(())
    }

    /// Writes one page record; returns the page's checksum.
    ///
    /// # Errors
    /// [`MigrateError::Io`].
    pub fn page(&mut self, gpa: u64, data: &[u8; PAGE_SIZE]) -> Result<u64, MigrateError> {
        let h = xxh64(data, gpa);
        let mut head = [0u8; 17];
        head[0] = tag::PAGE;
        head[1..9].copy_from_slice(&gpa.to_le_bytes());
        head[9..17].copy_from_slice(&h.to_le_bytes());
        self.put(&head)?;
        self.put(data)?;
        self.pages += 1;
        Ok(h)
    }

    /// Writes a control record.
    ///
    /// # Errors
    /// [`MigrateError::Io`].
    pub fn control(&mut self, t: u8, body: &[u8]) -> Result<(), MigrateError> {
        let mut e = Enc::default();
        e.u8(t)
            .u32(body.len() as u32)
            .bytes(body)
            .u64(xxh64(body, u64::from(t)));
        self.put(&e.0)
    }

    /// Writes END (the counts the receiver checks) and flushes.
    ///
    /// # Errors
    /// [`MigrateError::Io`].
    pub fn end(&mut self) -> Result<(), MigrateError> {
        let mut e = Enc::default();
        e.u64(self.pages).u64(self.pos);
        self.control(tag::END, &e.0)?;
        self.flush()
    }

    /// Flushes buffered bytes to the socket.
    ///
    /// # Errors
    /// [`MigrateError::Io`].
    pub fn flush(&mut self) -> Result<(), MigrateError> {
        self.w
            .flush()
            .map_err(|e| MigrateError::io("sending the migration stream", &e))
    }

    /// The underlying writer.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.w
    }
}

/// One record read from a stream.
#[derive(Debug, PartialEq)]
pub enum Record {
    /// A page whose checksum was verified; its data is in
    /// [`WireReader::page_data`].
    Page { gpa: u64, hash: u64 },
    /// A control record whose checksum was verified.
    Control {
        tag: u8,
        body: Vec<u8>,
        at_byte: u64,
    },
}

/// Reads a stream, verifying every checksum and locating every error.
pub struct WireReader<R: Read> {
    r: R,
    /// Bytes read so far.
    pub pos: u64,
    /// Page records read so far.
    pub pages: u64,
    page: Box<[u8; PAGE_SIZE]>,
}

impl<R: Read> WireReader<R> {
    /// A reader of replies (no header).
    pub fn replies(r: R) -> Self {
        WireReader {
            r,
            pos: 0,
            pages: 0,
            page: Box::new([0; PAGE_SIZE]),
        }
    }

    /// Reads and checks the stream's header.
    ///
    /// # Errors
    /// [`MigrateError::BadMagic`], [`MigrateError::Version`],
    /// [`MigrateError::Truncated`], [`MigrateError::RecordChecksum`],
    /// [`MigrateError::Malformed`].
    pub fn new(r: R) -> Result<(Self, Header), MigrateError> {
        let mut s = Self::replies(r);
        let mut magic = [0u8; 8];
        s.fill(&mut magic, "header")?;
        if magic != MAGIC {
            return Err(MigrateError::BadMagic { found: magic });
        }
        let mut b = [0u8; 6];
        s.fill(&mut b, "header")?;
        let version = u16::from_le_bytes([b[0], b[1]]);
        if version != VERSION {
            return Err(MigrateError::Version {
                found: version,
                supported: VERSION,
            });
        }
        let len = u32::from_le_bytes([b[2], b[3], b[4], b[5]]) as usize;
        if len > 4096 {
            return Err(MigrateError::Malformed {
                record: "header",
                at_byte: 10,
                why: format!("length {len}"),
            });
        }
        let mut body = vec![0u8; len];
        s.fill(&mut body, "header")?;
        let check = s.u64("header")?;
        if check != xxh64(&body, 0) {
            return Err(MigrateError::RecordChecksum {
                record: "header",
                at_byte: 0,
            });
        }
        let h = Header::decode(&body)?;
        Ok((s, h))
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

    /// The data of the last page record.
    pub fn page_data(&self) -> &[u8; PAGE_SIZE] {
        &self.page
    }

    /// Reads the next record.
    ///
    /// # Errors
    /// [`MigrateError::Truncated`] (the stream ended, even between
    /// records: every stream ends with END), [`MigrateError::PageChecksum`],
    /// [`MigrateError::RecordChecksum`], [`MigrateError::UnknownRecord`].
    pub fn next_record(&mut self) -> Result<Record, MigrateError> {
        let at_byte = self.pos;
        let mut t = [0u8; 1];
        self.fill(&mut t, "the next record's tag: the stream ended before END")?;
        match t[0] {
            tag::PAGE => {
                let gpa = self.u64("a PAGE record")?;
                let hash = self.u64("a PAGE record")?;
                fill_from(
                    &mut self.r,
                    &mut self.pos,
                    &mut self.page[..],
                    "a PAGE record",
                )?;
                if xxh64(&self.page[..], gpa) != hash {
                    return Err(MigrateError::PageChecksum { gpa, at_byte });
                }
                self.pages += 1;
                Ok(Record::Page { gpa, hash })
            }
            tag::ROUND
            | tag::STATE
            | tag::VERIFY
            | tag::END
            | tag::ABORT
            | tag::RESUMED
            | tag::REJECTED
            | tag::VERIFIED => {
                let name = tag_name(t[0]);
                let mut l = [0u8; 4];
                self.fill(&mut l, name)?;
                let len = u32::from_le_bytes(l) as usize;
                if len > 64 << 20 {
                    return Err(MigrateError::Malformed {
                        record: name,
                        at_byte,
                        why: format!("length {len} is beyond any record's"),
                    });
                }
                let mut body = vec![0u8; len];
                self.fill(&mut body, name)?;
                let check = self.u64(name)?;
                if check != xxh64(&body, u64::from(t[0])) {
                    return Err(MigrateError::RecordChecksum {
                        record: name,
                        at_byte,
                    });
                }
                Ok(Record::Control {
                    tag: t[0],
                    body,
                    at_byte,
                })
            }
            other => Err(MigrateError::UnknownRecord {
                tag: other,
                at_byte,
            }),
        }
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
            Err(e) => return Err(MigrateError::io("receiving the migration stream", &e)),
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
            backing: "anonymous".into(),
            verify_full: true,
        }
    }

    #[test]
    fn records_round_trip() {
        let mut w = WireWriter::new(Vec::new(), &header()).unwrap();
        let page = [0x5au8; PAGE_SIZE];
        let h = w.page(1 << 32, &page).unwrap();
        w.control(tag::ROUND, &[1, 2, 3]).unwrap();
        w.end().unwrap();
        let bytes = std::mem::take(w.get_mut());
        let (mut r, got) = WireReader::new(&bytes[..]).unwrap();
        assert_eq!(got, header());
        assert_eq!(
            r.next_record().unwrap(),
            Record::Page {
                gpa: 1 << 32,
                hash: h
            }
        );
        assert_eq!(r.page_data()[..], page[..]);
        match r.next_record().unwrap() {
            Record::Control { tag: t, body, .. } => {
                assert_eq!((t, body), (tag::ROUND, vec![1, 2, 3]))
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
                record: "header",
                ..
            })
        ));
        assert!(matches!(
            WireReader::new(&good[..good.len() - 1]),
            Err(MigrateError::Truncated { .. })
        ));
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
}
