//! The break-before-make monitor's view of EL2: every descriptor store
//! the engine makes (its `bbm-export` trace points) and every invalidation
//! EL2's backend completes ([`TracedTlb`]) are written, in the order they
//! happened, as fixed-size records into a ring in memory the host can
//! read. The host decodes them ([`decode`]) and replays them into the
//! engine's checker (`s2mmu::bbm::export::replay`), which applies the
//! architecture's rules to what EL2 did.
//!
//! A record is [`WORDS`] little-endian `u64` words: a kind, the table,
//! then the kind's fields. Records are claimed by one atomic increment, so
//! CPUs record at once; an event the engine traces inside a lock is
//! claimed inside it, which keeps the order the lock imposed. A full ring
//! drops further records and counts them ([`dropped`]): a replay of a
//! ring that dropped any is incomplete.

use crate::abi::HypError;
use crate::check::Layout;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use s2mmu::bbm::{Event, Flush};
use s2mmu::TlbInvalidate;

/// Words per record.
pub const WORDS: usize = 6;

const STORE: u64 = 1;
const INVALIDATE: u64 = 2;
const FREE: u64 = 3;
const REPORT: u64 = 4;
const TEARDOWN: u64 = 5;
const MARK: u64 = 6;

/// One record: an engine event, or a mark EL2 put in the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    /// An engine event.
    Event(Event),
    /// A mark: from here on, `table`'s invalidations are withheld on
    /// purpose (a fault-injection run, [`TracedTlb::withhold`]).
    Withheld {
        /// The table.
        table: usize,
    },
}

/// Encodes `r` as its words.
pub fn encode(r: &Record) -> [u64; WORDS] {
    match *r {
        Record::Event(Event::Store {
            table,
            start,
            level,
            old,
            new,
        }) => [STORE, table as u64, start, level.into(), old, new],
        Record::Event(Event::Invalidate { table, flush }) => {
            let (k, a, n) = match flush {
                Flush::Ipa(a) => (0, a, 0),
                Flush::Range(a, n) => (1, a, n),
                Flush::All => (2, 0, 0),
            };
            [INVALIDATE, table as u64, k, a, n, 0]
        }
        Record::Event(Event::FreeTable { table, pa }) => [FREE, table as u64, pa, 0, 0, 0],
        Record::Event(Event::ReportClean { table }) => [REPORT, table as u64, 0, 0, 0, 0],
        Record::Event(Event::Teardown { table, gone }) => {
            [TEARDOWN, table as u64, gone.into(), 0, 0, 0]
        }
        Record::Withheld { table } => [MARK, table as u64, 0, 0, 0, 0],
    }
}

/// Decodes one record's words; `None` for a kind or field no encoder
/// writes.
pub fn decode(w: &[u64; WORDS]) -> Option<Record> {
    let table = usize::try_from(w[1]).ok()?;
    let ev = match w[0] {
        STORE => Event::Store {
            table,
            start: w[2],
            level: u32::try_from(w[3]).ok()?,
            old: w[4],
            new: w[5],
        },
        INVALIDATE => {
            let flush = match w[2] {
                0 => Flush::Ipa(w[3]),
                1 => Flush::Range(w[3], w[4]),
                2 => Flush::All,
                _ => return None,
            };
            Event::Invalidate { table, flush }
        }
        FREE => Event::FreeTable { table, pa: w[2] },
        REPORT => Event::ReportClean { table },
        TEARDOWN => Event::Teardown {
            table,
            gone: w[2] != 0,
        },
        MARK => return Some(Record::Withheld { table }),
        _ => return None,
    };
    Some(Record::Event(ev))
}

/// Decodes a ring's bytes as the host read them (little-endian words,
/// `count` records); the first record that does not decode is an error
/// naming its index.
pub fn decode_all(bytes: &[u8], count: usize) -> Result<alloc::vec::Vec<Record>, usize> {
    let rec = WORDS * 8;
    if bytes.len() / rec < count {
        return Err(bytes.len() / rec);
    }
    (0..count)
        .map(|i| {
            let mut w = [0u64; WORDS];
            for (j, x) in w.iter_mut().enumerate() {
                let o = i * rec + j * 8;
                let mut b = [0u8; 8];
                b.copy_from_slice(&bytes[o..o + 8]);
                *x = u64::from_le_bytes(b);
            }
            decode(&w).ok_or(i)
        })
        .collect()
}

/// Checks a host's request to start (`[ring PA, records, 0, ..]`) or stop
/// (all zero) a trace into `layout`'s shared area, in this order: extra
/// arguments ([`HypError::BadArgument`]), no records
/// ([`HypError::BadSize`]), a size that wraps ([`HypError::Overflow`]),
/// then the buffer ([`Layout::check_shared`]). `None` asks to stop;
/// otherwise the ring's offset in the shared area and its records.
///
/// # Errors
/// As listed.
pub fn check_ring(layout: &Layout, args: &[u64; 6]) -> Result<Option<(usize, usize)>, HypError> {
    if args[2..] != [0; 4] {
        return Err(HypError::BadArgument);
    }
    let [pa, records, ..] = *args;
    if (pa, records) == (0, 0) {
        return Ok(None);
    }
    if records == 0 {
        return Err(HypError::BadSize);
    }
    let bytes = records
        .checked_mul(WORDS as u64 * 8)
        .ok_or(HypError::Overflow)?;
    let n = usize::try_from(records).map_err(|_| HypError::Overflow)?;
    Ok(Some((layout.check_shared(pa, bytes, bytes)?, n)))
}

/// Checks a host's request to withhold invalidations (`[1, 0, ..]`) or
/// issue them again (all zero): [`HypError::BadArgument`] for anything
/// else.
///
/// # Errors
/// As listed.
pub fn withhold_arg(args: &[u64; 6]) -> Result<bool, HypError> {
    match args {
        [1, 0, 0, 0, 0, 0] => Ok(true),
        [0, 0, 0, 0, 0, 0] => Ok(false),
        _ => Err(HypError::BadArgument),
    }
}

static RING: AtomicPtr<u64> = AtomicPtr::new(core::ptr::null_mut());
static CAPACITY: AtomicUsize = AtomicUsize::new(0);
static NEXT: AtomicUsize = AtomicUsize::new(0);
static WRITTEN: AtomicUsize = AtomicUsize::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
/// Set in `NEXT` by [`stop`]: no record is claimed any more.
const CLOSED: usize = 1 << (usize::BITS - 1);

/// Starts recording into `records` records at `ring` and, with the
/// `bbm-export` feature, installs the engine's sink.
///
/// # Safety
/// `ring` is valid for writes of `records * WORDS` words for the rest of
/// the program, aligned, and nothing else writes it.
pub unsafe fn install(ring: *mut u64, records: usize) {
    CAPACITY.store(records, Ordering::Relaxed);
    WRITTEN.store(0, Ordering::Relaxed);
    DROPPED.store(0, Ordering::Relaxed);
    RING.store(ring, Ordering::Release);
    NEXT.store(0, Ordering::Release);
    #[cfg(feature = "bbm-export")]
    s2mmu::bbm::export::set_sink(|e| record(&Record::Event(*e)));
}

/// Appends `r` to the ring (dropped and counted if full; nothing if no
/// ring is installed).
pub fn record(r: &Record) {
    let ring = RING.load(Ordering::Acquire);
    if ring.is_null() {
        return;
    }
    let i = NEXT.fetch_add(1, Ordering::AcqRel);
    if i & CLOSED != 0 {
        return;
    }
    if i >= CAPACITY.load(Ordering::Relaxed) {
        DROPPED.fetch_add(1, Ordering::Relaxed);
        return;
    }
    for (j, w) in encode(r).into_iter().enumerate() {
        // SAFETY: `i < records`, so the word lies inside the ring
        // `install`'s caller vouched for; record `i` is this call's alone.
        unsafe { ring.add(i * WORDS + j).write_volatile(w) };
    }
    WRITTEN.fetch_add(1, Ordering::Release);
}

/// Records written so far (at most the capacity).
pub fn recorded() -> usize {
    (NEXT.load(Ordering::Acquire) & !CLOSED).min(CAPACITY.load(Ordering::Relaxed))
}

/// Stops recording: no record is claimed from now on, and once every one
/// claimed before is written, returns how many the ring holds (the ring
/// is then the host's to read; [`install`] starts again).
pub fn stop() -> usize {
    let n =
        (NEXT.fetch_or(CLOSED, Ordering::AcqRel) & !CLOSED).min(CAPACITY.load(Ordering::Relaxed));
    // Later records return before claiming (no shared counter touched); one
    // that loaded the ring before finds it closed.
    RING.store(core::ptr::null_mut(), Ordering::Release);
    while WRITTEN.load(Ordering::Acquire) < n {
        core::hint::spin_loop();
    }
    n
}

/// The ring and the records written so far: the host's view of it
/// (to read once no CPU records any more; null after [`stop`]).
pub fn ring() -> (*const u64, usize) {
    (RING.load(Ordering::Acquire), recorded())
}

/// Records dropped because the ring was full.
pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// EL2's TLB backend with each completed invalidation recorded for the
/// table it serves; a fault-injection run can withhold them.
pub struct TracedTlb<T: TlbInvalidate> {
    inner: T,
    table: AtomicUsize,
    withhold: AtomicBool,
}

impl<T: TlbInvalidate> TracedTlb<T> {
    /// `inner`, traced (no table yet: [`TracedTlb::set_table`]).
    pub fn new(inner: T) -> Self {
        TracedTlb {
            inner,
            table: AtomicUsize::new(0),
            withhold: AtomicBool::new(false),
        }
    }

    /// The backend underneath.
    pub fn inner(&self) -> &T {
        &self.inner
    }

    /// The table (its `bbm_id`) the invalidations from now on serve.
    pub fn set_table(&self, table: usize) {
        self.table.store(table, Ordering::Release);
    }

    /// Fault injection: while `on`, every invalidation the checker counts
    /// (all but this CPU's own) is skipped, neither issued nor recorded,
    /// so the replay must flag what depended on it.
    /// Turning it on marks the trace ([`Record::Withheld`]).
    pub fn withhold(&self, on: bool) {
        self.withhold.store(on, Ordering::Release);
        if on {
            record(&Record::Withheld {
                table: self.table.load(Ordering::Acquire),
            });
        }
    }

    fn done(&self, flush: Flush) {
        record(&Record::Event(Event::Invalidate {
            table: self.table.load(Ordering::Acquire),
            flush,
        }));
    }

    fn withheld(&self) -> bool {
        self.withhold.load(Ordering::Acquire)
    }
}

impl<T: TlbInvalidate> TlbInvalidate for TracedTlb<T> {
    fn flush_ipa(&self, ipa: u64, level: Option<u32>) {
        if !self.withheld() {
            self.inner.flush_ipa(ipa, level);
            self.done(Flush::Ipa(ipa));
        }
    }
    fn flush_ipa_local(&self, ipa: u64, level: Option<u32>) {
        // This CPU only: it covers nothing other CPUs may hold, so the
        // checker does not count it (as the engine's own tracer), and it
        // is never withheld (a CPU that kept a stale protection would
        // fault on it for ever).
        self.inner.flush_ipa_local(ipa, level);
    }
    fn flush_range(&self, ipa: u64, size: u64) {
        if !self.withheld() {
            self.inner.flush_range(ipa, size);
            self.done(Flush::Range(ipa, size));
        }
    }
    fn flush_vmid(&self) {
        if !self.withheld() {
            self.inner.flush_vmid();
            self.done(Flush::All);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Region;

    #[test]
    fn trace_requests_check_their_arguments() {
        let l = Layout {
            carve_out: Region::new(0x4000_0000, 0x100_0000),
            ram: Region::new(0x4100_0000, 0x100_0000),
            shared: Region::new(0x5000_0000, 0x10_0000),
            shared_va: 0x1000 as *mut u8,
            ram_va: 0x1000 as *mut u8,
        };
        let base = 0x5000_0000;
        let rec = (WORDS * 8) as u64;
        assert_eq!(check_ring(&l, &[0; 6]), Ok(None));
        assert_eq!(check_ring(&l, &[base, 4, 0, 0, 0, 0]), Ok(Some((0, 4))));
        assert_eq!(
            check_ring(&l, &[base + 0x800, (0x10_0000 - 0x800) / rec, 0, 0, 0, 0]),
            Ok(Some((0x800, (0x10_0000 - 0x800) as usize / rec as usize)))
        );
        for (args, e) in [
            ([base, 4, 1, 0, 0, 0], HypError::BadArgument),
            ([base, 4, 0, 0, 0, 7], HypError::BadArgument),
            ([base, 0, 0, 0, 0, 0], HypError::BadSize),
            ([base, u64::MAX / 8, 0, 0, 0, 0], HypError::Overflow),
            ([base + 4, 4, 0, 0, 0, 0], HypError::Misaligned),
            ([!7, 4, 0, 0, 0, 0], HypError::Overflow),
            ([base - 8, 4, 0, 0, 0, 0], HypError::OutsideShared),
            (
                [base, 0x10_0000 / rec + 1, 0, 0, 0, 0],
                HypError::OutsideShared,
            ),
            ([0x4000_0000, 4, 0, 0, 0, 0], HypError::OutsideShared),
        ] {
            assert_eq!(check_ring(&l, &args), Err(e), "{args:x?}");
        }
        assert_eq!(withhold_arg(&[1, 0, 0, 0, 0, 0]), Ok(true));
        assert_eq!(withhold_arg(&[0; 6]), Ok(false));
        for args in [[2, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 9]] {
            assert_eq!(withhold_arg(&args), Err(HypError::BadArgument));
        }
    }

    #[test]
    fn every_record_decodes_to_itself_and_unknown_kinds_are_refused() {
        let all = [
            Record::Event(Event::Store {
                table: 0x4180_0000,
                start: 0x8020_0000,
                level: 2,
                old: 0x4440_0711,
                new: 0,
            }),
            Record::Event(Event::Invalidate {
                table: 1,
                flush: Flush::Ipa(0x8000_1000),
            }),
            Record::Event(Event::Invalidate {
                table: 1,
                flush: Flush::Range(0x8000_0000, 2 << 20),
            }),
            Record::Event(Event::Invalidate {
                table: 1,
                flush: Flush::All,
            }),
            Record::Event(Event::FreeTable {
                table: 1,
                pa: 0x4180_3000,
            }),
            Record::Event(Event::ReportClean { table: 1 }),
            Record::Event(Event::Teardown {
                table: 1,
                gone: true,
            }),
            Record::Withheld { table: 1 },
        ];
        let mut bytes = alloc::vec::Vec::new();
        for r in &all {
            assert_eq!(decode(&encode(r)), Some(*r));
            bytes.extend(encode(r).iter().flat_map(|w| w.to_le_bytes()));
        }
        assert_eq!(decode_all(&bytes, all.len()).unwrap(), all);
        assert_eq!(decode_all(&bytes, all.len() + 1), Err(all.len()));
        assert_eq!(decode(&[0, 1, 0, 0, 0, 0]), None);
        assert_eq!(decode(&[INVALIDATE, 1, 3, 0, 0, 0]), None);
        assert_eq!(decode(&[STORE, 1, 0, 1 << 32, 0, 0]), None);
    }
}
