//! The migration stream, format version 3. All integers little-endian.
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
//!                       format:u8 (the stage-2 format of the source's
//!                       tables: 0 arm64, 1 x86 EPT; a destination on
//!                       another one refuses the stream)
//!          0x09 JOIN    session[16] channel:u16
//!          0x02 ROUND   round:u32 pages:u64
//!          0x03 STATE   the guest's state (the VM's own encoding)
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

use crate::hash::{checksum, is_zero, page_hash};
use crate::stream_error::MigrateError;

/// First bytes of every connection.
pub const MAGIC: [u8; 8] = *b"S2MMIGR\0";
/// The format version this build writes and reads.
pub const VERSION: u16 = 3;
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

mod codec;
mod format;
mod header;
mod reader;
mod writer;

pub use codec::{Dec, Enc};
pub use format::WireFormat;
pub use header::{Header, Opening};
pub use reader::{record_name, Entry, Record, WireReader, DEFAULT_GRACE, MIN_RATE};
pub use writer::{Batch, WireWriter};

#[cfg(test)]
mod tests;
