//! The destination's missing pages and the way to ask for them: the
//! [`PageFetch`] hook of a post-copy destination's VM. A vCPU's
//! translation fault on a page that has not landed blocks that vCPU while
//! a REQUEST goes out; whichever copy of a page arrives first (an answer
//! or the background stream's) is claimed, checked and kept.

use crate::hash::{page_hash, ZERO_PAGE};
use crate::stream_error::MigrateError;
use crate::transport::BoxConn;
use crate::vm::{GuestRam, PageFetch, RamSlot, SessionVm};
use crate::wire::{tag, Entry, WireReader, WireWriter, PAGE_SIZE};
use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Remote-fault waits kept for the percentiles at most.
const MAX_LATENCIES: usize = 1 << 20;
/// Sequential one-page requests timed for the reference.
pub(crate) const REFERENCE_PINGS: u64 = 64;

/// The missing pages of a post-copy destination and the way to ask for
/// them: the [`PageFetch`] hook of its VM.
pub struct Fetcher<M: GuestRam> {
    pub(crate) slots: Vec<RamSlot>,
    pub(crate) memory: Arc<M>,
    pub(crate) pages: u64,
    /// Missing when the guest resumed (never changes).
    pub(crate) missing: Vec<u64>,
    /// Landed in guest memory (set once the page's data is checked).
    pub(crate) present: Vec<AtomicU64>,
    /// Claimed by the thread writing it (the first copy to arrive).
    pub(crate) claimed: Vec<AtomicU64>,
    /// Asked for by a vCPU.
    pub(crate) requested: Vec<AtomicU64>,
    /// Missing pages not landed yet.
    pub(crate) left: AtomicU64,
    pub(crate) last_landed: Mutex<Option<Instant>>,
    /// The request connection (only its sending half is used).
    pub(crate) req: Mutex<WireReader<BoxConn>>,
    pub(crate) lock: Mutex<()>,
    pub(crate) cv: Condvar,
    pub(crate) failed: AtomicBool,
    /// The current connections broke (a recovery may follow).
    pub(crate) broken: AtomicBool,
    pub(crate) why: Mutex<String>,
    pub(crate) io_timeout: Duration,
    pub(crate) latencies: Mutex<Vec<u64>>,
    /// The waits of the faults whose page landed as an answer (not from
    /// the background stream): a request's round trip as the vCPU saw it.
    pub(crate) answered_latencies: Mutex<Vec<u64>>,
    /// Pages that landed as answers.
    pub(crate) by_answer: Vec<AtomicU64>,
    pub(crate) remote_faults: AtomicU64,
    pub(crate) requests: AtomicU64,
    /// Answer records received (pings wait for the next one).
    pub(crate) answers: AtomicU64,
    pub(crate) background_pages: AtomicU64,
    pub(crate) answered_pages: AtomicU64,
    pub(crate) dropped: AtomicU64,
}

pub(crate) fn bit(v: &[AtomicU64], i: u64) -> bool {
    v[(i / 64) as usize].load(Ordering::SeqCst) & (1 << (i % 64)) != 0
}

pub(crate) fn set(v: &[AtomicU64], i: u64) -> bool {
    let b = 1u64 << (i % 64);
    v[(i / 64) as usize].fetch_or(b, Ordering::SeqCst) & b != 0
}

impl<M: GuestRam> Fetcher<M> {
    pub(crate) fn new<V: SessionVm<Ram = M>>(
        vm: &V,
        missing: Vec<u64>,
        req: WireReader<BoxConn>,
        io_timeout: Duration,
    ) -> Self {
        let pages = vm.ram().size() / PAGE_SIZE as u64;
        let words = || (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        let present: Vec<AtomicU64> = words();
        let mut left = 0;
        for (w, p) in present.iter().enumerate() {
            let m = missing.get(w).copied().unwrap_or(0);
            left += u64::from(m.count_ones());
            let valid = (pages - w as u64 * 64).min(64);
            let mask = if valid == 64 {
                u64::MAX
            } else {
                (1 << valid) - 1
            };
            p.store(!m & mask, Ordering::Relaxed);
        }
        Fetcher {
            slots: vm.slots().to_vec(),
            memory: vm.ram().clone(),
            pages,
            missing,
            present,
            claimed: words(),
            requested: words(),
            left: AtomicU64::new(left),
            last_landed: Mutex::new(None),
            req: Mutex::new(req),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            failed: AtomicBool::new(false),
            broken: AtomicBool::new(false),
            why: Mutex::new(String::new()),
            io_timeout,
            latencies: Mutex::new(Vec::new()),
            answered_latencies: Mutex::new(Vec::new()),
            by_answer: words(),
            remote_faults: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            answers: AtomicU64::new(0),
            background_pages: AtomicU64::new(0),
            answered_pages: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// The page index of `gpa` in guest memory.
    pub(crate) fn index(&self, gpa: u64) -> Option<u64> {
        self.slots
            .iter()
            .find(|s| gpa >= s.gpa && gpa - s.gpa < s.size)
            .map(|s| (s.mem_offset + (gpa - s.gpa)) / PAGE_SIZE as u64)
            .filter(|&i| i < self.pages)
    }

    pub(crate) fn gpa_of(&self, index: u64) -> u64 {
        let off = index * PAGE_SIZE as u64;
        self.slots
            .iter()
            .find(|s| off >= s.mem_offset && off - s.mem_offset < s.size)
            .map_or(off, |s| s.gpa + off - s.mem_offset)
    }

    pub(crate) fn is_missing(&self, i: u64) -> bool {
        self.missing[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    pub(crate) fn wake(&self) {
        drop(self.lock.lock().unwrap_or_else(|p| p.into_inner()));
        self.cv.notify_all();
    }

    /// Post-copy broke: every waiting vCPU gives up.
    pub(crate) fn fail(&self, why: &str) {
        {
            let mut w = self.why.lock().unwrap_or_else(|p| p.into_inner());
            if w.is_empty() {
                *w = why.to_string();
            }
        }
        self.failed.store(true, Ordering::SeqCst);
        self.wake();
    }

    pub(crate) fn send(&self, t: u8, body: &[u8]) -> Result<(), MigrateError> {
        let mut g = self.req.lock().unwrap_or_else(|p| p.into_inner());
        let mut w = WireWriter::replies(g.get_mut());
        w.control(t, body)?;
        w.flush()
    }

    /// Waits (on the condition variable, 10 ms at a time) until `done`
    /// holds, post-copy fails, or (`bounded`) twice the I/O timeout
    /// passes. A vCPU's wait is not bounded: it ends when its page lands
    /// or post-copy is given up (every socket operation has a deadline),
    /// so it outlasts a recovery.
    pub(crate) fn wait_until(
        &self,
        what: &str,
        bounded: bool,
        done: impl Fn() -> bool,
    ) -> Result<(), String> {
        let deadline = bounded.then(|| Instant::now() + self.io_timeout * 2);
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        while !done() {
            if self.failed.load(Ordering::SeqCst) {
                return Err(self.why.lock().unwrap_or_else(|p| p.into_inner()).clone());
            }
            if bounded && self.broken.load(Ordering::SeqCst) {
                return Err(format!("{what}: the connections broke"));
            }
            if deadline.is_some_and(|d| Instant::now() > d) {
                return Err(format!(
                    "{what}: nothing within twice the I/O timeout ({:?})",
                    self.io_timeout * 2
                ));
            }
            g = self
                .cv
                .wait_timeout(g, Duration::from_millis(10))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(())
    }

    /// Takes the PAGES record just read: each missing page lands unless a
    /// copy of it already has (then this one is read, checked and
    /// dropped). `answers` says which connection it came on.
    pub(crate) fn take<R: Read>(
        &self,
        rd: &mut WireReader<R>,
        at_byte: u64,
        answers: bool,
    ) -> Result<(), MigrateError> {
        let entries: Vec<Entry> = rd.entries().to_vec();
        let mut scratch = [0u8; PAGE_SIZE];
        let mut wake = answers;
        for e in entries {
            let i = self.missing_index(&e, at_byte)?;
            let host = self.page_host(i, e.gpa, at_byte)?;
            let mine = !set(&self.claimed, i);
            let data: &mut [u8] = if mine {
                // SAFETY: page `i` lies inside one mapping of guest
                // memory (`page_host`), which `self.memory` keeps mapped; this thread claimed it
                // (the claim bit is set once), so no other thread writes
                // it; and no vCPU reads or writes it: it is not present,
                // so the fetch hook keeps it unmapped in stage 2 (dirty
                // logging keeps every mapping one page wide).
                unsafe { std::slice::from_raw_parts_mut(host as *mut u8, PAGE_SIZE) }
            } else {
                &mut scratch
            };
            if e.zero {
                data.copy_from_slice(&ZERO_PAGE);
            } else {
                rd.read_page(data)?;
                if page_hash(data, e.gpa) != e.hash {
                    return Err(MigrateError::PageChecksum {
                        gpa: e.gpa,
                        at_byte,
                    });
                }
            }
            if !mine {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            wake |= self.landed(i, answers);
        }
        if answers {
            self.answers.fetch_add(1, Ordering::SeqCst);
        }
        if wake {
            self.wake();
        }
        Ok(())
    }

    /// The index of the page `e` carries, which must be one missing when
    /// post-copy began.
    ///
    /// # Errors
    /// [`MigrateError::PageOutOfRange`], [`MigrateError::Malformed`].
    /// The host address of page `i` of guest RAM (at `gpa`).
    ///
    /// # Errors
    /// [`MigrateError::PageOutOfRange`] where guest RAM has no such page.
    fn page_host(&self, i: u64, gpa: u64, at_byte: u64) -> Result<u64, MigrateError> {
        self.memory
            .host_range(i * PAGE_SIZE as u64, PAGE_SIZE as u64)
            .ok_or(MigrateError::PageOutOfRange { gpa, at_byte })
    }

    fn missing_index(&self, e: &Entry, at_byte: u64) -> Result<u64, MigrateError> {
        let i = match self.index(e.gpa) {
            Some(i) if e.gpa.is_multiple_of(PAGE_SIZE as u64) => i,
            _ => {
                return Err(MigrateError::PageOutOfRange {
                    gpa: e.gpa,
                    at_byte,
                })
            }
        };
        if !self.is_missing(i) {
            return Err(MigrateError::Malformed {
                record: "PAGES",
                at_byte,
                why: format!(
                    "the page at gpa {:#x} was not missing when post-copy began",
                    e.gpa
                ),
            });
        }
        Ok(i)
    }

    /// Page `i` has landed (`answers`: as an answer): counts it, marks it
    /// present. Returns whether a waiter is to be woken.
    fn landed(&self, i: u64, answers: bool) -> bool {
        if answers {
            // Before `present`: a waiter that sees the page sees how.
            set(&self.by_answer, i);
        }
        set(&self.present, i);
        if answers {
            self.answered_pages.fetch_add(1, Ordering::Relaxed);
        } else {
            self.background_pages.fetch_add(1, Ordering::Relaxed);
        }
        let mut wake = bit(&self.requested, i);
        if self.left.fetch_sub(1, Ordering::SeqCst) == 1 {
            *self.last_landed.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            wake = true;
        }
        wake
    }

    /// After a break, with no receiving thread running: the new request
    /// connection; a page claimed but not landed (its copy was cut short)
    /// is unclaimed. Returns the pages still missing (POSTCOPY's form).
    pub(crate) fn after_break(&self, req: WireReader<BoxConn>) -> Vec<u64> {
        *self.req.lock().unwrap_or_else(|p| p.into_inner()) = req;
        let mut out = Vec::with_capacity(self.present.len());
        for (w, (p, c)) in self.present.iter().zip(&self.claimed).enumerate() {
            let present = p.load(Ordering::SeqCst);
            c.store(present, Ordering::SeqCst);
            out.push(self.missing[w] & !present);
        }
        out
    }

    /// Sends again every request whose page has not landed (it may have
    /// been lost with the broken connection).
    pub(crate) fn rerequest(&self) -> Result<(), MigrateError> {
        for i in 0..self.pages {
            if bit(&self.requested, i) && !bit(&self.present, i) {
                self.send(tag::REQUEST, &self.gpa_of(i).to_le_bytes())?;
            }
        }
        Ok(())
    }

    /// One timed request for a page that is here already: a round trip
    /// plus one page's transfer on the request and answer connections.
    pub(crate) fn ping(&self, gpa: u64) -> Result<u64, MigrateError> {
        let a0 = self.answers.load(Ordering::SeqCst);
        let t0 = Instant::now();
        self.send(tag::REQUEST, &gpa.to_le_bytes())?;
        self.wait_until("the reference request", true, || {
            self.answers.load(Ordering::SeqCst) > a0
        })
        .map_err(|why| self.wait_failed(format!("post-copy reference: {why}")))?;
        Ok(t0.elapsed().as_nanos() as u64)
    }

    /// The error of a bounded wait that failed: a broken connection is an
    /// I/O error and a silent one a timeout, both of which a recovery can
    /// mend (the pages are all here, or will be resent; only the
    /// connections are gone); anything else (post-copy was failed) is not.
    pub(crate) fn wait_failed(&self, why: String) -> MigrateError {
        if self.failed.load(Ordering::SeqCst) {
            MigrateError::Setup(why)
        } else if self.broken.load(Ordering::SeqCst) {
            MigrateError::Io {
                what: "the post-copy connections".into(),
                error: why,
            }
        } else {
            MigrateError::Timeout { what: why }
        }
    }
}

impl<M: GuestRam> PageFetch for Fetcher<M> {
    fn fetch(&self, _vcpu: usize, gpa: u64) -> Result<bool, String> {
        let Some(i) = self.index(gpa) else {
            // Not guest memory: the engine reports it (MMIO).
            return Ok(false);
        };
        if bit(&self.present, i) {
            return Ok(false);
        }
        let t0 = Instant::now();
        if !set(&self.requested, i) {
            self.requests.fetch_add(1, Ordering::Relaxed);
            let page_gpa = gpa & !(PAGE_SIZE as u64 - 1);
            // A request lost to a broken connection is sent again after
            // the recovery (its bit stays set); without one, post-copy
            // fails and so does this wait.
            let _ = self.send(tag::REQUEST, &page_gpa.to_le_bytes());
        }
        self.wait_until("a vCPU's page request", false, || bit(&self.present, i))?;
        self.remote_faults.fetch_add(1, Ordering::Relaxed);
        let ns = t0.elapsed().as_nanos() as u64;
        for (l, yes) in [
            (&self.latencies, true),
            (&self.answered_latencies, bit(&self.by_answer, i)),
        ] {
            let mut l = l.lock().unwrap_or_else(|p| p.into_inner());
            if yes && l.len() < MAX_LATENCIES {
                l.push(ns);
            }
        }
        Ok(true)
    }
}
