//! Page compression on the stream: the LZ4 block form of one page, and the
//! source's policy of when to use it ([`Compression`], [`Compressor`]).
//!
//! # Why this policy
//!
//! Compression pays only when the bytes it saves would have taken longer
//! to send than compressing them takes. QEMU leaves the choice to the
//! operator: its multifd `zstd`/`zlib` compression and its xbzrle delta
//! cache are off by default, and once on they compress every page (xbzrle
//! keeps a cache of previously sent pages and sends deltas). A migration
//! over loopback or a fast LAN is CPU-bound and gets slower with them; one
//! over a slow WAN gets faster. `auto` makes that choice page batch by page
//! batch from two measurements the writer has anyway:
//!
//! - how long the link takes per byte: each batch's write (and the
//!   bandwidth limit's sleep before it), divided by its bytes, averaged.
//!   When the link is the bottleneck the socket's buffer is full and every
//!   write waits for the link to drain it, so this is the link's time per
//!   byte; when it is not, a write is a copy into the kernel and costs a
//!   fraction of a nanosecond per byte;
//! - what compression recently saved per page and cost per page.
//!
//! A batch is compressed when the time its expected savings would take
//! on the link is more than twice (the destination decompresses too)
//! what compressing it is expected to cost, or when the connection says
//! its unsent queue holds at least [`BEHIND_BYTES`] (the sender is ahead
//! of the link before any write has had to wait: the socket's buffer
//! takes the first megabytes) and recent pages saved at least
//! [`WORTH_PER_PAGE`] bytes each. Pages that stop compressing
//! (random data, encrypted pages) make the expected saving fall below
//! that and compression stops; while it is off, one batch in
//! [`SAMPLE_EVERY`] has its first [`SAMPLE_PAGES`] pages compressed as a
//! sample, so a change of content is seen again at a cost of well under
//! one percent of the pages. On a link fast enough that even a page
//! compressed to nothing would not pay, nothing is ever compressed or
//! sampled. LZ4 rather than zstd: it compresses a page in about a
//! microsecond and decompresses several times faster, so it pays on any
//! link slower than a few GB/s, and its block format needs no dictionary
//! or state across pages (each page stands alone on the wire, as a page
//! sent twice must). Delta encoding against a cache (xbzrle) would help a
//! guest rewriting a few words of a page; it needs a copy of every sent
//! page on the source and is left out.

use super::limits::PAGE_SIZE;
use std::fmt;
use std::str::FromStr;

/// Bytes a compressed page's length takes before its LZ4 bytes.
pub const COMPRESSED_LEN_BYTES: usize = 2;

/// The longest compressed form a page may have on the wire (its LZ4
/// bytes, the length word not counted). A reader refuses a longer one
/// before reading it.
pub const MAX_COMPRESSED: usize = PAGE_SIZE;

/// Pages of a batch compressed as a sample while `auto` is not
/// compressing.
pub const SAMPLE_PAGES: usize = 8;

/// While `auto` is not compressing, one batch in this many is sampled.
pub const SAMPLE_EVERY: u32 = 32;

/// Unsent bytes on the connection from which `auto` takes the link to be
/// behind (the socket's queue grows: the sender is ahead of the link)
/// before a write has waited for it: a socket's buffer takes megabytes
/// before its writes block.
pub const BEHIND_BYTES: u64 = 1 << 20;

/// Bytes a page must save on average (its length word counted) for
/// `auto` to compress while the link is behind.
pub const WORTH_PER_PAGE: f64 = 256.0;

/// A compressed page is sent only when it saves at least this many
/// bytes (its length word included); otherwise it goes raw.
pub const MIN_SAVING: usize = 64;

/// When the source compresses pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    /// When the link is the bottleneck and recent pages compressed well
    /// (see the module's doc).
    #[default]
    Auto,
    /// Every page that compresses by at least [`MIN_SAVING`] bytes.
    Lz4,
    /// No page.
    Off,
}

impl Compression {
    /// Its name on a command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Compression::Auto => "auto",
            Compression::Lz4 => "lz4",
            Compression::Off => "off",
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Compression {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Compression::Auto),
            "lz4" => Ok(Compression::Lz4),
            "off" => Ok(Compression::Off),
            other => Err(format!("compression {other:?}: use auto, lz4 or off")),
        }
    }
}

/// What compression did on one writer (or summed over several).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompressStats {
    /// Pages sent compressed.
    pub pages: u64,
    /// Pages that were tried (compressed and samples) but went raw.
    pub tried_raw: u64,
    /// The compressed pages' bytes had they gone raw (a page each).
    pub raw_bytes: u64,
    /// The bytes they took on the wire (length words included).
    pub wire_bytes: u64,
    /// Nanoseconds spent compressing (kept or not).
    pub ns: u64,
}

impl CompressStats {
    /// Bytes the compressed pages saved on the wire.
    pub fn saved(&self) -> u64 {
        self.raw_bytes.saturating_sub(self.wire_bytes)
    }

    /// What was done since `earlier` (counts of the same writer).
    pub fn since(&self, earlier: &CompressStats) -> CompressStats {
        CompressStats {
            pages: self.pages.saturating_sub(earlier.pages),
            tried_raw: self.tried_raw.saturating_sub(earlier.tried_raw),
            raw_bytes: self.raw_bytes.saturating_sub(earlier.raw_bytes),
            wire_bytes: self.wire_bytes.saturating_sub(earlier.wire_bytes),
            ns: self.ns.saturating_sub(earlier.ns),
        }
    }

    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &CompressStats) {
        self.pages += o.pages;
        self.tried_raw += o.tried_raw;
        self.raw_bytes += o.raw_bytes;
        self.wire_bytes += o.wire_bytes;
        self.ns += o.ns;
    }
}

/// How much of a batch to try compressing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// None of it.
    None,
    /// Its first pages (a sample of the content).
    Sample(usize),
    /// All of it.
    All,
}

/// The writer's compression policy and its measurements.
#[derive(Clone, Debug)]
pub(crate) struct Compressor {
    mode: Compression,
    /// The link's nanoseconds per byte, averaged over recent batches
    /// (None before the first write).
    wire_ns_per_byte: Option<f64>,
    /// Bytes saved per tried page and nanoseconds to compress one,
    /// averaged over recent tries (None before the first).
    saved_per_page: Option<f64>,
    ns_per_page: f64,
    /// Batches since the last sample while not compressing.
    since_sample: u32,
    /// What was done.
    pub(crate) stats: CompressStats,
}

/// The weight of the newest measurement in an average.
const NEW: f64 = 0.25;
/// What compressing a page is taken to cost before it was measured.
const PRIOR_NS_PER_PAGE: f64 = 2_000.0;

fn blend(old: Option<f64>, new: f64) -> f64 {
    match old {
        Some(o) => o + NEW * (new - o),
        None => new,
    }
}

impl Compressor {
    pub(crate) fn new(mode: Compression) -> Self {
        Compressor {
            mode,
            wire_ns_per_byte: None,
            saved_per_page: None,
            ns_per_page: PRIOR_NS_PER_PAGE,
            since_sample: 0,
            stats: CompressStats::default(),
        }
    }

    pub(crate) fn mode(&self) -> Compression {
        self.mode
    }

    /// How much of the next batch (`data_pages` pages that are not zero
    /// pages) to try compressing; `unsent`: the bytes the connection has
    /// not sent yet, where it says.
    pub(crate) fn plan(&mut self, data_pages: usize, unsent: Option<u64>) -> Plan {
        if data_pages == 0 {
            return Plan::None;
        }
        match self.mode {
            Compression::Off => Plan::None,
            Compression::Lz4 => Plan::All,
            Compression::Auto => {
                let behind = unsent.is_some_and(|u| u >= BEHIND_BYTES);
                // Even a page compressed to nothing would not pay.
                let slow = self
                    .wire_ns_per_byte
                    .is_some_and(|l| l * PAGE_SIZE as f64 > 2.0 * self.ns_per_page);
                if !behind && !slow {
                    return Plan::None;
                }
                let sample = Plan::Sample(SAMPLE_PAGES.min(data_pages));
                let Some(saved) = self.saved_per_page else {
                    return sample;
                };
                let link = self.wire_ns_per_byte.unwrap_or(0.0);
                let pays = link * saved > 2.0 * self.ns_per_page;
                if pays || (behind && saved >= WORTH_PER_PAGE) {
                    self.since_sample = 0;
                    return Plan::All;
                }
                self.since_sample += 1;
                if self.since_sample >= SAMPLE_EVERY {
                    self.since_sample = 0;
                    sample
                } else {
                    Plan::None
                }
            }
        }
    }

    /// A batch's tries: `pages` pages tried in `ns`, saving `saved` bytes
    /// in all (length words counted).
    pub(crate) fn tried(&mut self, pages: usize, saved: u64, ns: u64) {
        if pages == 0 {
            return;
        }
        let n = pages as f64;
        self.saved_per_page = Some(blend(self.saved_per_page, saved as f64 / n));
        self.ns_per_page = blend(Some(self.ns_per_page), ns as f64 / n);
        self.stats.ns += ns;
    }

    /// A batch's write: `bytes` on the wire in `ns` (the bandwidth
    /// limit's wait included).
    pub(crate) fn wrote(&mut self, bytes: u64, ns: u64) {
        if bytes > 0 {
            self.wire_ns_per_byte = Some(blend(self.wire_ns_per_byte, ns as f64 / bytes as f64));
        }
    }
}

/// Compresses `page` into `out` (at least [`lz4_flex::block::get_maximum_output_size`]
/// of a page): the LZ4 bytes' length when the compressed form (its
/// length word included) saves at least [`MIN_SAVING`] bytes, else None
/// (the page goes raw).
pub(crate) fn compress_page(page: &[u8], out: &mut [u8]) -> Option<usize> {
    let n = lz4_flex::block::compress_into(page, out).ok()?;
    (n <= MAX_COMPRESSED && n + COMPRESSED_LEN_BYTES + MIN_SAVING <= PAGE_SIZE).then_some(n)
}

/// The output buffer [`compress_page`] needs.
pub(crate) fn compress_buffer() -> Vec<u8> {
    vec![0u8; lz4_flex::block::get_maximum_output_size(PAGE_SIZE)]
}

/// Decompresses a page's LZ4 bytes into `out` (one page).
///
/// # Errors
/// Why the bytes are not a page: they do not decode, or decode to
/// another size than a page.
pub(crate) fn decompress_page(lz4: &[u8], out: &mut [u8]) -> Result<(), String> {
    match lz4_flex::block::decompress_into(lz4, out) {
        Ok(n) if n == PAGE_SIZE => Ok(()),
        Ok(n) => Err(format!(
            "{} compressed bytes decode to {n} bytes, not a page of {PAGE_SIZE}",
            lz4.len()
        )),
        Err(e) => Err(format!("{} compressed bytes do not decode: {e}", lz4.len())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_is_refused() {
        for c in [Compression::Auto, Compression::Lz4, Compression::Off] {
            assert_eq!(c.name().parse::<Compression>(), Ok(c));
        }
        assert!("zstd".parse::<Compression>().is_err());
        assert_eq!(Compression::default(), Compression::Auto);
    }

    #[test]
    fn off_never_and_lz4_always() {
        let mut off = Compressor::new(Compression::Off);
        off.wrote(1 << 20, 1 << 40);
        assert_eq!(off.plan(256, Some(1 << 30)), Plan::None);
        let mut on = Compressor::new(Compression::Lz4);
        assert_eq!(on.plan(256, None), Plan::All);
        assert_eq!(on.plan(0, None), Plan::None);
    }

    /// A link that takes 8 ns a byte (1 Gbit/s) with pages that save 3 KiB
    /// each: compress. A link at 0.1 ns a byte (a copy into the kernel):
    /// never, not even a sample.
    #[test]
    fn auto_compresses_only_behind_a_slow_link() {
        let mut slow = Compressor::new(Compression::Auto);
        assert_eq!(slow.plan(256, None), Plan::None, "nothing measured yet");
        slow.wrote(1 << 20, 8 << 20);
        assert_eq!(slow.plan(256, None), Plan::Sample(SAMPLE_PAGES));
        slow.tried(
            SAMPLE_PAGES,
            3072 * SAMPLE_PAGES as u64,
            1000 * SAMPLE_PAGES as u64,
        );
        assert_eq!(slow.plan(256, None), Plan::All);

        let mut fast = Compressor::new(Compression::Auto);
        fast.wrote(1 << 20, 100 << 10);
        fast.tried(
            SAMPLE_PAGES,
            4000 * SAMPLE_PAGES as u64,
            1000 * SAMPLE_PAGES as u64,
        );
        for _ in 0..100 {
            assert_eq!(fast.plan(256, Some(0)), Plan::None);
        }
    }

    /// Pages that do not compress stop compression; one batch in
    /// SAMPLE_EVERY is then sampled, and pages that compress again turn
    /// it back on.
    #[test]
    fn auto_backs_off_from_incompressible_pages_and_samples() {
        let mut c = Compressor::new(Compression::Auto);
        c.wrote(1 << 20, 8 << 20);
        c.tried(256, 0, 256 * 1500);
        let plans: Vec<Plan> = (0..2 * SAMPLE_EVERY).map(|_| c.plan(256, None)).collect();
        let samples = plans.iter().filter(|p| **p != Plan::None).count();
        assert_eq!(samples, 2);
        assert!(plans.iter().all(|p| *p != Plan::All));
        for _ in 0..8 {
            c.tried(
                SAMPLE_PAGES,
                3500 * SAMPLE_PAGES as u64,
                1000 * SAMPLE_PAGES as u64,
            );
        }
        assert_eq!(c.plan(256, None), Plan::All);
    }

    /// A queue of unsent bytes says the link is behind before any write
    /// waited: a sample, then every page while they save enough; none
    /// below the threshold.
    #[test]
    fn auto_compresses_when_the_socket_queue_grows() {
        let mut c = Compressor::new(Compression::Auto);
        c.wrote(1 << 20, 100 << 10);
        assert_eq!(c.plan(256, Some(BEHIND_BYTES - 1)), Plan::None);
        assert_eq!(c.plan(256, Some(BEHIND_BYTES)), Plan::Sample(SAMPLE_PAGES));
        c.tried(
            SAMPLE_PAGES,
            1000 * SAMPLE_PAGES as u64,
            3000 * SAMPLE_PAGES as u64,
        );
        assert_eq!(c.plan(256, Some(BEHIND_BYTES)), Plan::All);
        assert_eq!(c.plan(256, Some(0)), Plan::None);
        for _ in 0..10 {
            c.tried(256, 10 * 256, 3000 * 256);
        }
        assert!(c.saved_per_page.unwrap() < WORTH_PER_PAGE);
        assert_ne!(c.plan(256, Some(BEHIND_BYTES)), Plan::All);
    }

    #[test]
    fn a_page_round_trips_and_random_bytes_stay_raw() {
        let mut page = vec![0u8; PAGE_SIZE];
        for (i, b) in page.iter_mut().enumerate().step_by(64) {
            *b = i as u8 | 1;
        }
        let mut out = compress_buffer();
        let n = compress_page(&page, &mut out).expect("a mostly-zero page compresses");
        assert!(n < PAGE_SIZE / 4);
        let mut back = vec![0u8; PAGE_SIZE];
        decompress_page(&out[..n], &mut back).unwrap();
        assert_eq!(back, page);

        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for b in page.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        assert_eq!(compress_page(&page, &mut out), None);
    }

    #[test]
    fn bytes_that_decode_to_less_than_a_page_are_refused() {
        let short = lz4_flex::block::compress(&[7u8; 100]);
        let mut out = vec![0u8; PAGE_SIZE];
        let e = decompress_page(&short, &mut out).unwrap_err();
        assert!(e.contains("not a page"), "{e}");
        assert!(decompress_page(&[0xff, 0xff, 0xff], &mut out).is_err());
    }
}
