//! The destination's post-copy: the guest resumes with the missing pages
//! unmapped; a vCPU's fault on one is a REQUEST ([`Fetcher`], the VM's
//! page-fetch hook), its answer and the background stream are written
//! into guest memory by whichever copy lands first.

use super::super::dest::{check_end, DestConfig, DestOutcome};
use super::super::error::MigrateError;
use super::super::hash::{page_hash, ZERO_PAGE};
use super::super::net::BoxConn;
use super::super::source::source_digests;
use super::super::wire::{
    record_name, tag, Entry, GuestState, Record, WireReader, WireWriter, PAGE_SIZE,
};
use super::{encode_missing, median_p99, Final, PostcopyFigures};
use s2mmu_vm::{GuestMemory, PageFetch, Pattern, SlotInfo, Vm, Workload, WorkloadConfig};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Remote-fault waits kept for the percentiles at most.
const MAX_LATENCIES: usize = 1 << 20;
/// Sequential one-page requests timed for the reference.
const REFERENCE_PINGS: u64 = 64;

/// The missing pages of a post-copy destination and the way to ask for
/// them: the [`PageFetch`] hook of its VM.
pub struct Fetcher {
    slots: Vec<SlotInfo>,
    memory: Arc<GuestMemory>,
    pages: u64,
    /// Missing when the guest resumed (never changes).
    missing: Vec<u64>,
    /// Landed in guest memory (set once the page's data is checked).
    present: Vec<AtomicU64>,
    /// Claimed by the thread writing it (the first copy to arrive).
    claimed: Vec<AtomicU64>,
    /// Asked for by a vCPU.
    requested: Vec<AtomicU64>,
    /// Missing pages not landed yet.
    left: AtomicU64,
    last_landed: Mutex<Option<Instant>>,
    /// The request connection (only its sending half is used).
    req: Mutex<WireReader<BoxConn>>,
    lock: Mutex<()>,
    cv: Condvar,
    failed: AtomicBool,
    /// The current connections broke (a recovery may follow).
    broken: AtomicBool,
    why: Mutex<String>,
    io_timeout: Duration,
    latencies: Mutex<Vec<u64>>,
    remote_faults: AtomicU64,
    requests: AtomicU64,
    /// Answer records received (pings wait for the next one).
    answers: AtomicU64,
    background_pages: AtomicU64,
    answered_pages: AtomicU64,
    dropped: AtomicU64,
}

fn bit(v: &[AtomicU64], i: u64) -> bool {
    v[(i / 64) as usize].load(Ordering::SeqCst) & (1 << (i % 64)) != 0
}

fn set(v: &[AtomicU64], i: u64) -> bool {
    let b = 1u64 << (i % 64);
    v[(i / 64) as usize].fetch_or(b, Ordering::SeqCst) & b != 0
}

impl Fetcher {
    fn new(vm: &Vm, missing: Vec<u64>, req: WireReader<BoxConn>, io_timeout: Duration) -> Self {
        let pages = vm.memory().size() / PAGE_SIZE as u64;
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
            memory: vm.memory().clone(),
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
            remote_faults: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            answers: AtomicU64::new(0),
            background_pages: AtomicU64::new(0),
            answered_pages: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// The page index of `gpa` in guest memory.
    fn index(&self, gpa: u64) -> Option<u64> {
        self.slots
            .iter()
            .find(|s| gpa >= s.gpa && gpa - s.gpa < s.size)
            .map(|s| (s.mem_offset + (gpa - s.gpa)) / PAGE_SIZE as u64)
            .filter(|&i| i < self.pages)
    }

    fn gpa_of(&self, index: u64) -> u64 {
        let off = index * PAGE_SIZE as u64;
        self.slots
            .iter()
            .find(|s| off >= s.mem_offset && off - s.mem_offset < s.size)
            .map_or(off, |s| s.gpa + off - s.mem_offset)
    }

    fn is_missing(&self, i: u64) -> bool {
        self.missing[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    fn wake(&self) {
        drop(self.lock.lock().unwrap_or_else(|p| p.into_inner()));
        self.cv.notify_all();
    }

    /// Post-copy broke: every waiting vCPU gives up.
    fn fail(&self, why: &str) {
        {
            let mut w = self.why.lock().unwrap_or_else(|p| p.into_inner());
            if w.is_empty() {
                *w = why.to_string();
            }
        }
        self.failed.store(true, Ordering::SeqCst);
        self.wake();
    }

    fn send(&self, t: u8, body: &[u8]) -> Result<(), MigrateError> {
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
    fn wait_until(&self, what: &str, bounded: bool, done: impl Fn() -> bool) -> Result<(), String> {
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
    fn take<R: Read>(
        &self,
        rd: &mut WireReader<R>,
        at_byte: u64,
        answers: bool,
    ) -> Result<(), MigrateError> {
        let entries: Vec<Entry> = rd.entries().to_vec();
        let mut scratch = [0u8; PAGE_SIZE];
        let mut wake = answers;
        for e in entries {
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
            let mine = !set(&self.claimed, i);
            let data: &mut [u8] = if mine {
                // SAFETY: page `i` lies inside guest memory (`index`),
                // which `self.memory` keeps mapped; this thread claimed it
                // (the claim bit is set once), so no other thread writes
                // it; and no vCPU reads or writes it: it is not present,
                // so the fetch hook keeps it unmapped in stage 2 (dirty
                // logging keeps every mapping one page wide).
                unsafe {
                    std::slice::from_raw_parts_mut(
                        (self.memory.host_addr() + i * PAGE_SIZE as u64) as *mut u8,
                        PAGE_SIZE,
                    )
                }
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
            set(&self.present, i);
            if answers {
                self.answered_pages.fetch_add(1, Ordering::Relaxed);
            } else {
                self.background_pages.fetch_add(1, Ordering::Relaxed);
            }
            wake |= bit(&self.requested, i);
            if self.left.fetch_sub(1, Ordering::SeqCst) == 1 {
                *self.last_landed.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
                wake = true;
            }
        }
        if answers {
            self.answers.fetch_add(1, Ordering::SeqCst);
        }
        if wake {
            self.wake();
        }
        Ok(())
    }

    /// After a break, with no receiving thread running: the new request
    /// connection; a page claimed but not landed (its copy was cut short)
    /// is unclaimed. Returns the pages still missing (POSTCOPY's form).
    fn after_break(&self, req: WireReader<BoxConn>) -> Vec<u64> {
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
    fn rerequest(&self) -> Result<(), MigrateError> {
        for i in 0..self.pages {
            if bit(&self.requested, i) && !bit(&self.present, i) {
                self.send(tag::REQUEST, &self.gpa_of(i).to_le_bytes())?;
            }
        }
        Ok(())
    }

    /// One timed request for a page that is here already: a round trip
    /// plus one page's transfer on the request and answer connections.
    fn ping(&self, gpa: u64) -> Result<u64, MigrateError> {
        let a0 = self.answers.load(Ordering::SeqCst);
        let t0 = Instant::now();
        self.send(tag::REQUEST, &gpa.to_le_bytes())?;
        self.wait_until("the reference request", true, || {
            self.answers.load(Ordering::SeqCst) > a0
        })
        .map_err(|why| MigrateError::Setup(format!("post-copy reference: {why}")))?;
        Ok(t0.elapsed().as_nanos() as u64)
    }
}

impl PageFetch for Fetcher {
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
        let mut l = self.latencies.lock().unwrap_or_else(|p| p.into_inner());
        if l.len() < MAX_LATENCIES {
            l.push(t0.elapsed().as_nanos() as u64);
        }
        Ok(true)
    }
}

/// Recoveries the destination waits for before it gives post-copy up.
pub const MAX_RECOVERIES: u32 = 3;

/// Accepts the connections of a recovery: the channel numbers wanted, in
/// that order, within the time given.
pub type Recover<'a> =
    dyn FnMut(&[u16], Duration) -> Result<Vec<WireReader<BoxConn>>, MigrateError> + 'a;

/// What the destination's post-copy needs from the pre-copy phase.
pub struct Resume<'a, R: Read + Write> {
    /// The VM (no vCPU created yet).
    pub vm: &'a Arc<Vm>,
    /// The main connection, right after POSTCOPY, and its socket.
    pub main: &'a mut WireReader<R>,
    pub main_socket: Option<TcpStream>,
    /// The request and answer connections.
    pub req: WireReader<BoxConn>,
    pub answers: WireReader<BoxConn>,
    /// The vCPU state the source stopped in.
    pub state: &'a GuestState,
    /// POSTCOPY's bitmap.
    pub missing: Vec<u64>,
    pub cfg: &'a DestConfig,
    /// Page records, bytes and zero pages of the further data channels.
    pub extra_counts: (u64, u64, u64),
    /// Data channels.
    pub channels: u16,
    pub probe_bytes: u64,
    pub prefault: Duration,
    /// Accepts a recovery's connections.
    pub recover: &'a mut Recover<'a>,
}

/// Clones of the sockets under `conns`, to shut them down from another
/// thread.
fn sockets_of(main: Option<&TcpStream>, conns: [&mut WireReader<BoxConn>; 2]) -> Vec<TcpStream> {
    let mut v: Vec<TcpStream> = main.and_then(|s| s.try_clone().ok()).into_iter().collect();
    for c in conns {
        if let Some(s) = c.get_mut().tcp().and_then(|s| s.try_clone().ok()) {
            v.push(s);
        }
    }
    v
}

/// A break a new connection can mend (not a damaged stream).
fn recoverable(e: &MigrateError) -> bool {
    matches!(
        e,
        MigrateError::Io { .. } | MigrateError::Timeout { .. } | MigrateError::Truncated { .. }
    )
}

/// Resumes the guest with the missing pages unmapped, receives them
/// (accepting the source again after a connection breaks, up to
/// [`MAX_RECOVERIES`] times), runs the guest on, and sends FINAL.
///
/// # Errors
/// [`MigrateError::BadState`] before the resume; after it,
/// [`MigrateError::PostcopyBroken`] naming the stream's error (a damaged
/// or truncated post-copy stream, a connection that broke and was not
/// recovered).
pub fn resume<R: Read + Write + Send>(r: Resume<'_, R>) -> Result<DestOutcome, MigrateError> {
    let vm = r.vm;
    let missing_pages: u64 = r.missing.iter().map(|w| u64::from(w.count_ones())).sum();
    let mut req = r.req;
    let mut answers = r.answers;
    let mut sockets = sockets_of(r.main_socket.as_ref(), [&mut req, &mut answers]);
    let fetcher = Arc::new(Fetcher::new(vm, r.missing, req, r.cfg.io_timeout));
    // Page-wide mappings only while pages are missing: a block must not
    // map a page that has not landed.
    vm.enable_dirty_logging()
        .map_err(|e| MigrateError::Setup(format!("destination logging: {e}")))?;
    vm.set_page_fetch(Some(fetcher.clone()));
    let state = r.state;
    let wl_cfg = WorkloadConfig {
        bytes_per_vcpu: state.bytes_per_vcpu,
        write_percent: state.write_percent,
        pattern: if state.pattern == 1 {
            Pattern::Random
        } else {
            Pattern::Sequential
        },
        page_size: PAGE_SIZE as u64,
    };
    let wl = Workload::start_at(vm.clone(), wl_cfg, &state.vcpus)
        .map_err(|why| MigrateError::BadState { why })?;
    wl.control()
        .pace_pages_per_sec
        .store(state.pace_pages_per_sec, Ordering::Relaxed);
    wl.run_free();
    let resumed_at = Instant::now();
    let first = r.main;
    {
        let mut w = WireWriter::replies(first.get_mut());
        w.control(tag::POSTCOPY_RESUMED, &[])?;
        w.flush()?;
    }
    let f = &fetcher;
    let mut recovered: Option<WireReader<BoxConn>> = None;
    let mut recoveries = 0u32;
    let reference = loop {
        let res = match &mut recovered {
            Some(m) => phase(m, &mut answers, f, &sockets),
            None => phase(first, &mut answers, f, &sockets),
        };
        let e = match res {
            Ok(x) => break x,
            Err(e) => e,
        };
        let give_up = |why: String| {
            f.fail(&why);
            wl.pause();
            MigrateError::PostcopyBroken {
                why,
                missing_pages: Some(f.left.load(Ordering::SeqCst)),
            }
        };
        if !recoverable(&e) || recoveries >= MAX_RECOVERIES {
            return Err(give_up(format!(
                "the destination: {e}{}",
                if recoverable(&e) {
                    format!(" ({recoveries} recoveries already)")
                } else {
                    String::new()
                }
            )));
        }
        recoveries += 1;
        let wait = r.cfg.io_timeout * 4;
        eprintln!(
            "destination: POST-COPY BROKE ({e}): the guest's memory is split between the two hosts, {} pages are still on the source; vCPUs that need them wait; waiting up to {wait:?} for the source to resume over new connections",
            f.left.load(Ordering::SeqCst)
        );
        let ch = r.channels;
        let mut conns = match (r.recover)(&[0, ch, ch + 1], wait) {
            Ok(c) if c.len() == 3 => c.into_iter(),
            Ok(_) => return Err(give_up("the recovery's connections".into())),
            Err(e2) => return Err(give_up(format!("the destination: {e}; no recovery: {e2}"))),
        };
        let (Some(mut m), Some(mut rq), Some(mut an)) = (conns.next(), conns.next(), conns.next())
        else {
            return Err(give_up("the recovery's connections".into()));
        };
        let main_sock = m.get_mut().tcp().and_then(|s| s.try_clone().ok());
        sockets = sockets_of(main_sock.as_ref(), [&mut rq, &mut an]);
        let still = f.after_break(rq);
        let told = {
            let mut w = WireWriter::replies(m.get_mut());
            w.control(tag::MISSING, &encode_missing(&still))
                .and_then(|()| w.flush())
        };
        // A failure here shows in the next phase.
        let _ = told.and_then(|()| f.rerequest());
        answers = an;
        recovered = Some(m);
    };
    vm.set_page_fetch(None);
    // Every page is here: huge mappings may come back.
    vm.disable_dirty_logging()
        .map_err(|e| MigrateError::Setup(format!("destination logging off: {e}")))?;
    let writes0: u64 = state.vcpus.iter().map(|v| v.writes).sum();
    if let Some(rest) = r.cfg.run_after.checked_sub(resumed_at.elapsed()) {
        std::thread::sleep(rest);
    }
    let writes1: u64 = wl
        .control()
        .live
        .iter()
        .map(|l| l.writes.load(Ordering::Relaxed))
        .sum();
    let secs = resumed_at.elapsed().as_secs_f64();
    wl.pause();
    let vcpus = wl.vcpu_states();
    let digests = source_digests(vm);
    let mut lat = std::mem::take(&mut *fetcher.latencies.lock().unwrap_or_else(|p| p.into_inner()));
    let (fault_median_ns, fault_p99_ns) = median_p99(&mut lat);
    let last = fetcher
        .last_landed
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .map_or(Duration::ZERO, |t| t.saturating_duration_since(resumed_at));
    let figures = PostcopyFigures {
        missing_pages,
        remote_faults: fetcher.remote_faults.load(Ordering::Relaxed),
        requests: fetcher.requests.load(Ordering::Relaxed),
        fault_median_ns,
        fault_p99_ns,
        time_to_last_page_ns: last.as_nanos() as u64,
        reference_ns: reference.0,
        reference_samples: reference.1,
        background_pages: fetcher.background_pages.load(Ordering::Relaxed),
        answered_pages: fetcher.answered_pages.load(Ordering::Relaxed),
        dropped_duplicates: fetcher.dropped.load(Ordering::Relaxed),
        recoveries: u64::from(recoveries),
    };
    let fin = Final {
        figures: figures.clone(),
        vcpus: vcpus.clone(),
        digests: digests.clone(),
    };
    let counts = match &mut recovered {
        Some(m) => send_final(m, &fin)?,
        None => send_final(first, &fin)?,
    };
    Ok(DestOutcome {
        page_records: counts.0 + r.extra_counts.0,
        zero_pages: counts.2 + r.extra_counts.2,
        bytes: counts.1 + r.extra_counts.1,
        channels: r.channels,
        probe_bytes: r.probe_bytes,
        prefault: r.prefault,
        resumed_at: Some(resumed_at),
        slot_digests: digests,
        verify_mismatches: None,
        resumed_write_rate: writes1.saturating_sub(writes0) as f64 / secs.max(1e-9),
        resumed_passes: vcpus.iter().map(|s| s.pass).collect(),
        postcopy: Some(figures),
    })
}

/// Sends FINAL on `main`; returns its page records, bytes and zero pages
/// received.
fn send_final<M: Read + Write>(
    main: &mut WireReader<M>,
    fin: &Final,
) -> Result<(u64, u64, u64), MigrateError> {
    let mut w = WireWriter::replies(main.get_mut());
    w.control(tag::FINAL, &fin.encode())?;
    w.flush()?;
    Ok((main.pages, main.pos, main.zero_pages))
}

/// One stretch of post-copy over one set of connections: the answers on
/// their own thread, the background stream here. Either side's break
/// ends both (their sockets are shut down). Returns the reference.
fn phase<M: Read + Write + Send>(
    main: &mut WireReader<M>,
    answers: &mut WireReader<BoxConn>,
    f: &Fetcher,
    sockets: &[TcpStream],
) -> Result<(u64, u64), MigrateError> {
    f.broken.store(false, Ordering::SeqCst);
    let cut = || {
        f.broken.store(true, Ordering::SeqCst);
        f.wake();
        for s in sockets {
            super::super::net::shutdown(s);
        }
    };
    std::thread::scope(|sc| {
        let t = sc.spawn(|| {
            let r = answer_loop(answers, f);
            if r.is_err() {
                cut();
            }
            r
        });
        let r = receive_rest(main, f);
        if r.is_err() {
            cut();
        }
        let a = t
            .join()
            .unwrap_or_else(|_| Err(MigrateError::Setup("the answer thread panicked".into())));
        match (r, a) {
            (Ok(x), Ok(())) => Ok(x),
            (Err(e), Ok(())) | (Ok(_), Err(e)) => Err(e),
            // The damage, not the cut it caused.
            (Err(m), Err(a)) => Err(if recoverable(&m) && !recoverable(&a) {
                a
            } else {
                m
            }),
        }
    })
}

/// The answer connection: requested pages until END.
fn answer_loop(rd: &mut WireReader<BoxConn>, f: &Fetcher) -> Result<(), MigrateError> {
    loop {
        let at_byte = rd.pos;
        match rd.next_record()? {
            Record::Pages { .. } => f.take(rd, at_byte, true)?,
            Record::Control {
                tag: tag::PROGRESS, ..
            } => {}
            Record::Control {
                tag: tag::END,
                body,
                at_byte,
            } => return check_end(&body, at_byte, rd.pages),
            other => {
                return Err(MigrateError::Malformed {
                    record: "answer",
                    at_byte,
                    why: format!(
                        "the answer connection carries pages, PROGRESS and END, got {}",
                        record_name(&other)
                    ),
                })
            }
        }
    }
}

/// The background stream on the main connection until its END, then the
/// wait for the last page, the reference pings and DONE. Returns the
/// reference's median and its sample count.
fn receive_rest<R: Read + Write>(
    main: &mut WireReader<R>,
    f: &Fetcher,
) -> Result<(u64, u64), MigrateError> {
    let beat = f.io_timeout / 4;
    let mut last_beat = Instant::now();
    loop {
        if f.broken.load(Ordering::SeqCst) {
            return Err(MigrateError::Io {
                what: "the post-copy stream".into(),
                error: "the answer connection broke".into(),
            });
        }
        if last_beat.elapsed() >= beat {
            // The source's request reader and our answer reader are idle
            // while no vCPU faults: keep their deadlines from passing.
            f.send(tag::PROGRESS, &[])?;
            last_beat = Instant::now();
        }
        let at_byte = main.pos;
        match main.next_record()? {
            Record::Pages { .. } => f.take(main, at_byte, false)?,
            Record::Control {
                tag: tag::END,
                body,
                at_byte,
            } => {
                check_end(&body, at_byte, main.pages)?;
                break;
            }
            Record::Control {
                tag: tag::ABORT,
                body,
                ..
            } => {
                return Err(MigrateError::Aborted {
                    reason: String::from_utf8_lossy(&body).into_owned(),
                })
            }
            other => {
                return Err(MigrateError::Malformed {
                    record: "post-copy stream",
                    at_byte,
                    why: format!("{} is not expected in it", record_name(&other)),
                })
            }
        }
    }
    if f.left.load(Ordering::SeqCst) > 0 {
        // The rest are answers still on their way.
        if let Err(why) = f.wait_until("the last requested pages", true, || {
            f.left.load(Ordering::SeqCst) == 0
        }) {
            let left = f.left.load(Ordering::SeqCst);
            let first = (0..f.pages)
                .find(|&i| !bit(&f.present, i))
                .map_or(0, |i| f.gpa_of(i));
            return Err(MigrateError::Setup(format!(
                "{why}; {left} pages never arrived, the first at gpa {first:#x}"
            )));
        }
    }
    // Pages that were missing (the source answers those; the copies are
    // dropped here), spread over memory.
    let count: u64 = f.missing.iter().map(|w| u64::from(w.count_ones())).sum();
    let step = (count / REFERENCE_PINGS).max(1) as usize;
    let mut times = Vec::new();
    let pick = (0..f.pages).filter(|&i| f.is_missing(i)).step_by(step);
    for i in pick.take(REFERENCE_PINGS as usize) {
        times.push(f.ping(f.gpa_of(i))?);
    }
    f.send(tag::DONE, &[])?;
    Ok((median_p99(&mut times).0, times.len() as u64))
}
