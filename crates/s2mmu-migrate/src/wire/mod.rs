//! The migration stream, format version 6. All integers little-endian.
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
//!          0x0b SYNC    pages:u64 per channel (the page records sent on
//!                       each so far) then:u8 (0: the stop-and-copy
//!                       follows, 1: the switch to post-copy, which a
//!                       HEADER without post-copy refuses) before the
//!                       source pauses its guest: the destination answers
//!                       once it has taken them all (and, for post-copy,
//!                       readied its resume: the dirty log, the page fetch)
//!          0x8c SYNCED  (empty)                          destination -> source
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
//!          entry = gpa_and_flags:u64 (bit 0: zero page, no data follows;
//!                  bit 1: compressed, its data is len:u16 then len bytes
//!                  of LZ4 block format that decode to exactly one page,
//!                  1 <= len <= 4096; never with bit 0)
//!                  hash:u64 (xxh3(data, seed=gpa) of the page itself,
//!                  after decompression; 0 for a zero page)
//! probe    0x07 len:u64 xxh3(len, seed=0x07):u64 len bytes of filler
//! ```
//! The source opens the main connection and sends its HEADER, then opens
//! the further connections (their TCP, TLS and key exchange) while the
//! destination answers; each sends its JOIN once ACCEPT gave the session
//! id. So a destination admits further connections while the main one
//! opens, and keeps those that authenticated before ACCEPT for their JOIN
//! (a JOIN read before ACCEPT names no session and is refused).
//! Version 5 added compressed pages (version 4 had no bit 1) and the
//! further connections opened before ACCEPT (described above); version 6
//! added SYNC's last byte, the ending that follows. Whether a
//! page is compressed is the source's choice, page by page
//! ([`Compression`]); a destination reads both forms always.
//!
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

mod codec;
mod compress;
mod format;
mod header;
mod limits;
mod reader;
mod writer;

pub use codec::{Dec, Enc};
pub use compress::{
    CompressStats, Compression, BEHIND_BYTES, COMPRESSED_LEN_BYTES, MAX_COMPRESSED, MIN_SAVING,
    SAMPLE_EVERY, SAMPLE_PAGES, WORTH_PER_PAGE,
};
#[allow(deprecated)]
pub use format::WireFormat;
pub use header::{Header, Opening, IMAGE_ID_LEN};
pub use limits::{
    channel_of, tag, tag_name, ENTRY_LZ4, ENTRY_ZERO, MAGIC, MAX_BATCH, MAX_CHANNELS, MAX_MEM,
    MAX_SLOTS, MAX_VCPUS, PAGE_RECORD_BYTES, PAGE_SIZE, SESSION_LEN, STRIPE_PAGES,
    SYNC_THEN_POSTCOPY, SYNC_THEN_STOP, VERSION,
};
pub use reader::{record_name, Entry, Record, WireReader, DEFAULT_GRACE, MIN_RATE};
pub use writer::{Batch, WireWriter};

#[cfg(test)]
use crate::stream_error::MigrateError;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_compress;
