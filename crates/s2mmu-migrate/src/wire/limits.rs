//! The stream's constants, record tags and per-tag bounds: the leaf every
//! other part of `wire` reads, so the module root only declares and
//! re-exports its children (no child imports from its parent).

/// First bytes of every connection.
pub const MAGIC: [u8; 8] = *b"S2MMIGR\0";
/// The format version this build writes and reads.
pub const VERSION: u16 = 6;
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
/// A PAGES entry's flag (in its address word): a zero page, no data.
pub const ENTRY_ZERO: u64 = 1;
/// A PAGES entry's flag: the page's data is compressed (`len:u16` then
/// `len` bytes of LZ4 block format, `len` at most a page).
pub const ENTRY_LZ4: u64 = 2;
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

/// SYNC's last byte: the stop-and-copy follows (the last pages, STATE,
/// END).
pub const SYNC_THEN_STOP: u8 = 0;
/// SYNC's last byte: the switch to post-copy follows (STATE, POSTCOPY);
/// the destination readies its post-copy resume before SYNCED.
pub const SYNC_THEN_POSTCOPY: u8 = 1;

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
    pub const SYNC: u8 = 0x0b;
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
    pub const SYNCED: u8 = 0x8c;
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
        tag::SYNC => "SYNC",
        tag::SYNCED => "SYNCED",
        _ => "unknown",
    }
}

/// The largest body a control record with tag `t` may have (None: not a
/// control record).
pub(super) fn max_body(t: u8) -> Option<usize> {
    Some(match t {
        tag::HEADER => 64 + 255,
        tag::JOIN => SESSION_LEN + 2,
        tag::ROUND => 12,
        tag::STATE => 32 + 32 * MAX_VCPUS as usize,
        tag::VERIFY | tag::PROGRESS | tag::POSTCOPY_RESUMED | tag::DONE | tag::SYNCED => 0,
        tag::POSTCOPY | tag::MISSING => (MAX_MEM / PAGE_SIZE as u64 / 8) as usize,
        tag::REQUEST => 8,
        tag::FINAL => 64 + 32 * MAX_VCPUS as usize + 10 * MAX_SLOTS as usize,
        tag::END | tag::VERIFIED => 16,
        tag::ABORT | tag::REJECTED => 4096,
        tag::ACCEPT => SESSION_LEN,
        tag::PROBED => 8,
        tag::SYNC => 8 * MAX_CHANNELS as usize + 1,
        tag::RESUMED => 4 + 10 * MAX_SLOTS as usize,
        _ => return None,
    })
}
