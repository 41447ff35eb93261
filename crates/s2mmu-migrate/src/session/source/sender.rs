//! The source's sending half: pages out of guest memory onto the
//! channels (paced by the bandwidth limit), the link probe, and the dirty
//! set its harvest strategy ([`Harvester`]) collects.

use super::super::page_copy::copy_page;
use super::super::replies::{read_reply, unexpected_reply};
use super::harvest::Harvester;
use super::SourceConfig;
use crate::bandwidth::TokenBucket;
use crate::stages::{ReadTiming, SendStages, StageClock, StageObserver};
use crate::stream_error::MigrateError;
use crate::transport::{BoxConn, Connection};
use crate::vm::SessionVm;
use crate::wire::{channel_of, tag, Batch, CompressStats, Dec, Record, WireWriter, PAGE_SIZE};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One channel of the stream with the batch being filled for it.
pub(super) struct Chan {
    pub(super) wire: WireWriter<BoxConn>,
    batch: Batch,
}

impl Chan {
    pub(super) fn new(mut wire: WireWriter<BoxConn>) -> Self {
        // Over a TLS record layer the pages are copied once, into the
        // batch where the records will be sealed, not again into it.
        let batch = match wire.get_mut().seals_in_place() {
            true => Batch::sealed(),
            false => Batch::new(),
        };
        Chan { wire, batch }
    }

    /// Sends the batch (paced by the bandwidth limit); `obs` is told where
    /// it began and ended.
    fn flush_batch(
        &mut self,
        bucket: &Mutex<TokenBucket>,
        obs: &mut impl StageObserver<SendStages>,
    ) -> Result<(), MigrateError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        obs.inner_begin();
        // The limit counts the bytes on the wire, after compression.
        let r = self.wire.sealed_batch_paced(&mut self.batch, &mut |bytes| {
            bucket.lock().unwrap_or_else(|p| p.into_inner()).take(bytes)
        });
        obs.inner_end();
        r
    }

    /// Sends the pages of `job` that channel `c` of `n` owns; `obs`
    /// watches the job (the stream's passes book its time, less the
    /// flushes', as reading guest memory: [`ReadTiming`]).
    fn send_job<V: SessionVm>(
        &mut self,
        vm: &V,
        bucket: &Mutex<TokenBucket>,
        (c, n): (u16, u16),
        job: &Job,
        obs: &mut impl StageObserver<SendStages>,
    ) -> Result<(), MigrateError> {
        let s = vm.slots()[job.slot];
        let first_index = s.mem_offset / PAGE_SIZE as u64;
        let ram = &**vm.ram();
        obs.begin(&self.wire.stages);
        let r = (|| -> Result<(), MigrateError> {
            for (wi, &word) in job.words.iter().enumerate() {
                let mut m = word;
                while m != 0 {
                    let b = u64::from(m.trailing_zeros());
                    m &= m - 1;
                    let i = job.first + wi as u64 * 64 + b;
                    if n > 1 && channel_of(first_index + i, n) != c {
                        continue;
                    }
                    let off = s.mem_offset + i * PAGE_SIZE as u64;
                    self.batch
                        .push_known(s.gpa + i * PAGE_SIZE as u64, |p| copy_page(ram, off, p));
                    // The batch's pages are hashed when it is written, all
                    // at once: hashing every 8 pages as they were copied
                    // (while in L1) was slower in a microbenchmark and no
                    // faster in whole migrations.
                    if self.batch.is_full() {
                        self.flush_batch(bucket, &mut *obs)?;
                    }
                }
            }
            Ok(())
        })();
        obs.end(&mut self.wire.stages);
        r
    }
}

/// The most pages a last round sends from the session's own thread
/// ([`Sender::run_here`]) rather than a thread per channel: 1 MiB, about
/// half a millisecond of copying, hashing and writing on one core here.
const LAST_ROUND_HERE_PAGES: u64 = 256;

/// Pages of one slot to send: bit b of `words[w]` is page
/// `first + 64 w + b` of the slot.
struct Job {
    slot: usize,
    first: u64,
    words: Vec<u64>,
}

/// A bitmap with the first `n` bits set.
fn all_pages(n: u64) -> Vec<u64> {
    let mut words = vec![u64::MAX; n.div_ceil(64) as usize];
    if !n.is_multiple_of(64) {
        if let Some(w) = words.last_mut() {
            *w = (1u64 << (n % 64)) - 1;
        }
    }
    words
}

/// The sending half: pages out of guest memory onto the channels, with
/// the pending dirty set per slot.
pub(super) struct Sender<'a, V: SessionVm> {
    pub(super) vm: &'a Arc<V>,
    pub(super) chans: Vec<Chan>,
    pub(super) bucket: Mutex<TokenBucket>,
    /// Pages to send, one bitmap per slot (bit i = page i of the slot).
    pub(super) pending: Vec<Vec<u64>>,
    /// How the dirty set is collected.
    pub(super) harvester: Harvester,
}

impl<'a, V: SessionVm> Sender<'a, V> {
    /// A sender over `chans` for `vm` that collects the dirty set with
    /// `harvester`, with nothing pending yet.
    pub(super) fn new(
        vm: &'a Arc<V>,
        chans: Vec<Chan>,
        cfg: &SourceConfig,
        harvester: Harvester,
    ) -> Self {
        let page = PAGE_SIZE as u64;
        Sender {
            vm,
            chans,
            bucket: Mutex::new(TokenBucket::new(cfg.bandwidth)),
            pending: vm
                .slots()
                .iter()
                .map(|s| vec![0u64; (s.size / page).div_ceil(64) as usize])
                .collect(),
            harvester,
        }
    }

    /// The stages' times so far, summed over the channels.
    pub(crate) fn stages(&self) -> SendStages {
        let mut s = SendStages::default();
        for c in &self.chans {
            s.add(&c.wire.stages);
        }
        s
    }

    /// Pages, bytes and zero pages sent so far on all channels.
    pub(super) fn counts(&self) -> (u64, u64, u64) {
        self.chans.iter().fold((0, 0, 0), |(p, b, z), c| {
            (p + c.wire.pages, b + c.wire.pos, z + c.wire.zero_pages)
        })
    }

    /// What compression did so far on all channels.
    pub(super) fn compression(&self) -> CompressStats {
        let mut s = CompressStats::default();
        for c in &self.chans {
            s.add(&c.wire.compression_stats());
        }
        s
    }

    /// The link figure: `total` bytes of filler over all channels at once
    /// (paced like pages), until the destination says it has them all.
    pub(super) fn probe(&mut self, total: u64) -> Result<(u64, Duration), MigrateError> {
        let n = self.chans.len() as u64;
        // An empty probe (no link figure asked for) needs no filler and no
        // thread: each channel's PROBE header in turn, then the answer.
        let filler: Vec<u8> = match total {
            0 => Vec::new(),
            _ => (0..1u32 << 20).map(|i| (i * 7 + 1) as u8).collect(),
        };
        let bucket = &self.bucket;
        let t0 = Instant::now();
        let per = total / n;
        let results: Vec<Result<(), MigrateError>> = std::thread::scope(|sc| {
            let handles: Vec<_> = self
                .chans
                .iter_mut()
                .enumerate()
                .map(|(i, c)| {
                    let len = if i == 0 { total - per * (n - 1) } else { per };
                    let filler = &filler;
                    let f = move || {
                        c.wire.probe(len, filler, &mut |b| {
                            bucket.lock().unwrap_or_else(|p| p.into_inner()).take(b)
                        })
                    };
                    if i == 0 || n == 1 || total == 0 {
                        Err(f)
                    } else {
                        Ok(sc.spawn(f))
                    }
                })
                .collect();
            handles
                .into_iter()
                .map(|h| match h {
                    Ok(h) => h.join().unwrap_or_else(|_| {
                        Err(MigrateError::Setup("a probe thread panicked".into()))
                    }),
                    Err(mut f) => f(),
                })
                .collect()
        });
        for r in results {
            r?;
        }
        match read_reply(&mut self.chans[0].wire, 0)? {
            Record::Control {
                tag: tag::PROBED,
                body,
                at_byte,
            } => {
                let mut d = Dec::new(&body, "PROBED", at_byte);
                let got = d.u64()?;
                d.finish()?;
                if got != total {
                    return Err(d.malformed(format!(
                        "the destination received {got} probe bytes of {total}"
                    )));
                }
            }
            other => return Err(unexpected_reply(other, "PROBED")),
        }
        Ok((total, t0.elapsed()))
    }

    /// [`Sender::run`] over one channel, on this thread.
    fn run_one(
        &mut self,
        next: &mut impl FnMut(&mut Self) -> Result<Option<Job>, MigrateError>,
    ) -> Result<(), MigrateError> {
        let mut timing = ReadTiming::default();
        while let Some(job) = next(self)? {
            self.chans[0].send_job(&**self.vm, &self.bucket, (0, 1), &job, &mut timing)?;
            self.reap_if_full()?;
        }
        self.chans[0].flush_batch(&self.bucket, &mut ())?;
        self.chans[0].wire.flush()
    }

    /// [`Sender::run`] on this thread: each job's pages over every channel
    /// in turn (each page still on the channel owning its stripe), then
    /// every channel flushed. For the last round's few pages, inside the
    /// downtime: a thread per channel costs its start and a wait for each
    /// to be scheduled (0.3 to 2.5 ms measured for about 40 pages on a
    /// loaded 2-core host), more than the pages' own copy and send.
    fn run_here(
        &mut self,
        mut next: impl FnMut(&mut Self) -> Result<Option<Job>, MigrateError>,
    ) -> Result<(), MigrateError> {
        let n = self.chans.len() as u16;
        let cpu = StageClock::start_with_cpu();
        let mut timing = ReadTiming::default();
        let r = self.send_here(&mut next, n, &mut timing);
        self.chans[0].wire.stages.cpu_ns += cpu.cpu_ns();
        r
    }

    fn send_here(
        &mut self,
        next: &mut impl FnMut(&mut Self) -> Result<Option<Job>, MigrateError>,
        n: u16,
        timing: &mut ReadTiming,
    ) -> Result<(), MigrateError> {
        while let Some(job) = next(self)? {
            for (c, chan) in self.chans.iter_mut().enumerate() {
                chan.send_job(&**self.vm, &self.bucket, (c as u16, n), &job, timing)?;
            }
            self.reap_if_full()?;
        }
        for chan in &mut self.chans {
            chan.flush_batch(&self.bucket, &mut ())?;
            chan.wire.flush()?;
        }
        Ok(())
    }

    /// Sends `jobs` over the channels (each page on the channel owning its
    /// stripe), then flushes every channel. `next` makes the next job
    /// (and may clear its dirty bits first); the harvester may reap
    /// between jobs.
    fn run(
        &mut self,
        mut next: impl FnMut(&mut Self) -> Result<Option<Job>, MigrateError>,
    ) -> Result<(), MigrateError> {
        let n = self.chans.len() as u16;
        if n == 1 {
            let cpu = StageClock::start_with_cpu();
            let r = self.run_one(&mut next);
            self.chans[0].wire.stages.cpu_ns += cpu.cpu_ns();
            return r;
        }
        let mut chans = std::mem::take(&mut self.chans);
        let vm = self.vm.clone();
        let bucket = std::mem::replace(&mut self.bucket, Mutex::new(TokenBucket::new(0)));
        let result = std::thread::scope(|sc| {
            let mut txs = Vec::new();
            let mut handles = Vec::new();
            for (c, chan) in chans.iter_mut().enumerate() {
                let (tx, rx) = std::sync::mpsc::sync_channel::<Arc<Job>>(2);
                txs.push(tx);
                let (vm, bucket) = (&vm, &bucket);
                handles.push(sc.spawn(move || {
                    let cpu = StageClock::start_with_cpu();
                    let r = (|| -> Result<(), MigrateError> {
                        let mut timing = ReadTiming::default();
                        for job in rx {
                            chan.send_job(&**vm, bucket, (c as u16, n), &job, &mut timing)?;
                        }
                        chan.flush_batch(bucket, &mut ())?;
                        chan.wire.flush()
                    })();
                    chan.wire.stages.cpu_ns += cpu.cpu_ns();
                    r
                }));
            }
            let mut fed = self.feed(&txs, &mut next);
            drop(txs);
            while self.harvester.reaps_while_sending() && handles.iter().any(|h| !h.is_finished()) {
                if let Err(e) = self.reap_if_full() {
                    fed = fed.and(Err(e));
                    break;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            let mut r = fed;
            for h in handles {
                let w = h.join().unwrap_or_else(|_| {
                    Err(MigrateError::Setup("a sending thread panicked".into()))
                });
                r = r.and(w);
            }
            r
        });
        self.chans = chans;
        self.bucket = bucket;
        result
    }

    /// Hands every job `next` makes to each channel's thread (`txs`),
    /// reaping the rings while a queue is full. Stops at the first error,
    /// or when a thread has failed (its error is reported by the caller).
    fn feed(
        &mut self,
        txs: &[SyncSender<Arc<Job>>],
        next: &mut impl FnMut(&mut Self) -> Result<Option<Job>, MigrateError>,
    ) -> Result<(), MigrateError> {
        while let Some(job) = next(self)? {
            let job = Arc::new(job);
            for tx in txs {
                let mut j = job.clone();
                // With nothing to reap while a queue is full, block
                // instead of waking every 50 us.
                if !self.harvester.reaps_while_sending() {
                    if tx.send(j).is_err() {
                        // The worker failed: its error is reported by the
                        // caller.
                        return Ok(());
                    }
                    continue;
                }
                loop {
                    match tx.try_send(j) {
                        Ok(()) => break,
                        Err(TrySendError::Full(back)) => {
                            j = back;
                            self.reap_if_full()?;
                            std::thread::sleep(Duration::from_micros(50));
                        }
                        // The worker failed: its error is reported by the
                        // caller.
                        Err(TrySendError::Disconnected(_)) => return Ok(()),
                    }
                }
            }
        }
        Ok(())
    }

    /// Round 0: every page.
    pub(super) fn send_all(&mut self) -> Result<(), MigrateError> {
        let step = self.harvester.job_pages();
        let mut at = (0usize, 0u64);
        self.run(|s| {
            let slots = s.vm.slots();
            while at.0 < slots.len() {
                let npages = slots[at.0].size / PAGE_SIZE as u64;
                if at.1 < npages {
                    let n = step.min(npages - at.1);
                    let job = Job {
                        slot: at.0,
                        first: at.1,
                        words: all_pages(n),
                    };
                    at.1 += n;
                    return Ok(Some(job));
                }
                at = (at.0 + 1, 0);
            }
            Ok(None)
        })
    }

    /// `SourceConfig::auto_channels`'s probe: the first pages of memory as round 0
    /// sends them, until `max_pages` are sent or `deadline` passed (checked
    /// between jobs of 256 pages, after the first).
    pub(super) fn send_first(
        &mut self,
        max_pages: u64,
        deadline: Instant,
    ) -> Result<(), MigrateError> {
        let mut at = (0usize, 0u64, 0u64);
        self.run(|s| {
            let slots = s.vm.slots();
            // The first batch goes whatever the clock says: a loaded
            // machine may run this thread only after the deadline, and a
            // probe of no page measures nothing.
            while at.0 < slots.len() && at.2 < max_pages && (at.2 == 0 || Instant::now() < deadline)
            {
                let npages = slots[at.0].size / PAGE_SIZE as u64;
                if at.1 < npages {
                    let n = 256u64.min(npages - at.1).min(max_pages - at.2);
                    let job = Job {
                        slot: at.0,
                        first: at.1,
                        words: all_pages(n),
                    };
                    (at.1, at.2) = (at.1 + n, at.2 + n);
                    return Ok(Some(job));
                }
                at = (at.0 + 1, 0, at.2);
            }
            Ok(None)
        })
    }

    /// The verification pass: every page on the main channel.
    pub(super) fn send_all_main(&mut self) -> Result<(), MigrateError> {
        let vm = self.vm.clone();
        for (slot, info) in vm.slots().iter().enumerate() {
            let npages = info.size / PAGE_SIZE as u64;
            let mut first = 0;
            while first < npages {
                let n = (64 * 64u64).min(npages - first);
                let job = Job {
                    slot,
                    first,
                    words: all_pages(n),
                };
                // Not one of the stream's stages: nothing watches it.
                self.chans[0].send_job(&*vm, &self.bucket, (0, 1), &job, &mut ())?;
                first += n;
            }
        }
        self.chans[0].flush_batch(&self.bucket, &mut ())?;
        self.chans[0].wire.flush()
    }

    pub(super) fn dirty_count(&self) -> u64 {
        self.pending
            .iter()
            .flatten()
            .map(|w| u64::from(w.count_ones()))
            .sum()
    }

    /// Sends the pending pages. Just before each job's pages are handed to
    /// the channels the harvester is told ([`Harvester::before_send`]:
    /// with bitmaps, their dirty bits are cleared and the pages
    /// write-protected, so a write after the clear is logged again).
    /// With `paused` (the last round: the vCPUs stopped here for good)
    /// nothing is protected again: no write can come, and each clear is a
    /// command to the engine inside the downtime. A last round of at most
    /// [`LAST_ROUND_HERE_PAGES`] goes out from this thread over every
    /// channel in turn ([`Sender::run_here`]).
    pub(super) fn send_dirty(&mut self, paused: bool) -> Result<(), MigrateError> {
        let step = self.harvester.job_pages();
        let mut at = (0usize, 0u64);
        let here = paused && self.dirty_count() <= LAST_ROUND_HERE_PAGES;
        let next = move |s: &mut Self| {
            while at.0 < s.pending.len() {
                let info = s.vm.slots()[at.0];
                let npages = info.size / PAGE_SIZE as u64;
                while at.1 < npages {
                    let (slot, first) = at;
                    let n = step.min(npages - first);
                    at.1 += n;
                    let (w0, w1) = ((first / 64) as usize, (first + n).div_ceil(64) as usize);
                    if s.pending[slot][w0..w1].iter().all(|&w| w == 0) {
                        continue;
                    }
                    if !paused {
                        s.harvester.before_send(
                            &**s.vm,
                            info.id,
                            first,
                            n,
                            &s.pending[slot][w0..w1],
                        )?;
                    }
                    let words: Vec<u64> = s.pending[slot][w0..w1]
                        .iter_mut()
                        .map(std::mem::take)
                        .collect();
                    return Ok(Some(Job { slot, first, words }));
                }
                at = (at.0 + 1, 0);
            }
            Ok(None)
        };
        match here {
            true => self.run_here(next),
            false => self.run(next),
        }
    }

    /// End of a round: what the guest dirtied since the pages were last
    /// protected. Returns the number of pending pages.
    pub(super) fn harvest(&mut self) -> Result<u64, MigrateError> {
        self.harvester.harvest(&**self.vm, &mut self.pending)?;
        Ok(self.dirty_count())
    }

    /// With the vCPUs paused: everything still dirty (nothing is
    /// re-protected; the guest will not run here again).
    pub(super) fn final_harvest(&mut self) -> Result<(), MigrateError> {
        self.harvester.final_harvest(&**self.vm, &mut self.pending)
    }

    /// While pages are sent: lets the harvester reap a full ring.
    fn reap_if_full(&mut self) -> Result<(), MigrateError> {
        self.harvester.reap_if_full(&**self.vm, &mut self.pending)
    }
}
