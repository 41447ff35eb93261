//! The destination's post-copy: the guest resumes with the missing pages
//! unmapped; a vCPU's fault on one is a REQUEST ([`Fetcher`], the VM's
//! page-fetch hook), its answer and the background stream are written
//! into guest memory by whichever copy lands first.

use super::config::{DestConfig, DestOutcome, ResumeParts};
use super::{check_end, resumed_at, run_resumed, DestGuest, ResumedGuest};
use crate::session::digests::source_digests;
use crate::session::postcopy::control::{self, Phase, RecoveryMode};
use crate::session::postcopy::fetch::{bit, Fetcher, REFERENCE_PINGS};
use crate::session::postcopy::keepalive::Keepalives;
use crate::session::postcopy::{encode_missing, median_p99, Final, PostcopyFigures};
use crate::stream_error::MigrateError;
use crate::transport::BoxConn;
use crate::transport::{Connection, ShutdownHandle};
use crate::vm::{GuestRam, GuestRun, SessionVm};
use crate::wire::{record_name, tag, Record, WireReader, WireWriter};
use std::io::{Read, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Recoveries the destination waits for before it gives post-copy up.
pub const MAX_RECOVERIES: u32 = 3;

/// Accepts the connections of a recovery: the channel numbers wanted, in
/// that order, within the time given.
pub type Recover<'a> =
    dyn FnMut(&[u16], Duration) -> Result<Vec<WireReader<BoxConn>>, MigrateError> + 'a;

/// What the destination's post-copy needs from the pre-copy phase.
pub struct Resume<'a, R: Read + Write, G: DestGuest> {
    /// The guest (no vCPU runs yet).
    pub guest: &'a G,
    /// The main connection, right after POSTCOPY, and its shutdown
    /// handle.
    pub main: &'a mut WireReader<R>,
    pub main_socket: Option<ShutdownHandle>,
    /// The request and answer connections.
    pub req: WireReader<BoxConn>,
    pub answers: WireReader<BoxConn>,
    /// The vCPU state the source stopped in.
    pub state: &'a G::State,
    /// POSTCOPY's bitmap.
    pub missing: Vec<u64>,
    /// Whether the dirty log is on already (turned on, and the VM readied
    /// for post-copy, when the SYNC that announced the switch came, before
    /// the source paused its guest): the resume then only sets the
    /// page-fetch hook.
    pub logging: bool,
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

/// The shutdown handles of `main` and `conns`, to shut them down from
/// another thread.
fn sockets_of(
    main: Option<&ShutdownHandle>,
    conns: [&mut WireReader<BoxConn>; 2],
) -> Vec<ShutdownHandle> {
    let mut v: Vec<ShutdownHandle> = main.cloned().into_iter().collect();
    for c in conns {
        if let Ok(s) = c.get_mut().shutdown_handle() {
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

/// Turns the dirty log on (unless `logging` says it is) and sets
/// `fetcher` as the page fetch: page-wide mappings only while pages are
/// missing, since a block must not map a page that has not landed.
fn set_fetch<V: SessionVm>(
    vm: &V,
    logging: bool,
    fetcher: Arc<dyn crate::vm::PageFetch>,
) -> Result<(), MigrateError> {
    if !logging {
        vm.enable_dirty_logging()
            .map_err(|e| MigrateError::Setup(format!("destination logging: {e}")))?;
    }
    vm.set_page_fetch(Some(fetcher))
        .map_err(|e| MigrateError::Setup(format!("destination page fetch: {e}")))
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
pub fn resume<R: Read + Write + Send, G: DestGuest>(
    r: Resume<'_, R, G>,
) -> Result<DestOutcome, MigrateError> {
    let vm = r.guest.vm();
    let missing_pages: u64 = r.missing.iter().map(|w| u64::from(w.count_ones())).sum();
    let mut req = r.req;
    let mut answers = r.answers;
    let sockets = sockets_of(r.main_socket.as_ref(), [&mut req, &mut answers]);
    let fetcher = Arc::new(Fetcher::new(&**vm, r.missing, req, r.cfg.io_timeout));
    let t0 = Instant::now();
    set_fetch(&**vm, r.logging, fetcher.clone())?;
    let fetch_set = Instant::now();
    let wl = r.guest.start(r.state)?;
    let resumed_at = resumed_at(&wl);
    let writes0 = wl.counters().writes;
    let first = r.main;
    {
        let mut w = WireWriter::replies(first.get_mut());
        w.control(tag::POSTCOPY_RESUMED, &[])?;
        w.flush()?;
    }
    // Drain and decode come from the caller's clock.
    let resume_parts = ResumeParts {
        page_fetch: fetch_set - t0,
        start: resumed_at - fetch_set,
        reply: resumed_at.elapsed(),
        ..ResumeParts::default()
    };
    let mut links = Links {
        answers,
        sockets,
        recovered: None,
        recoveries: 0,
    };
    let reference = receive_missing(
        first,
        &mut links,
        &fetcher,
        &wl,
        (r.cfg, r.channels),
        r.recover,
    )?;
    vm.set_page_fetch(None)
        .map_err(|e| MigrateError::Setup(format!("destination page fetch off: {e}")))?;
    // Every page is here: huge mappings may come back.
    vm.disable_dirty_logging()
        .map_err(|e| MigrateError::Setup(format!("destination logging off: {e}")))?;
    let resumed_write_rate = run_resumed(&wl, writes0, r.cfg.run_after, resumed_at);
    let digests = source_digests(&**vm);
    let mut figures = figures_of(&fetcher, resumed_at, reference);
    figures.missing_pages = missing_pages;
    figures.recoveries = u64::from(links.recoveries);
    let fin = Final {
        figures: figures.clone(),
        state: wl.final_state(),
        digests: digests.clone(),
    };
    let counts = match &mut links.recovered {
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
        verify_error: None,
        resumed_write_rate,
        resumed_progress: wl.progress(),
        postcopy: Some(figures),
        recv_stages: Default::default(),
        resume_parts,
    })
}

/// The connections post-copy receives on after the resume, replaced by a
/// recovery's.
struct Links {
    /// The answer connection.
    answers: WireReader<BoxConn>,
    /// Shutdown handles of the live connections, to cut them all when one
    /// breaks.
    sockets: Vec<ShutdownHandle>,
    /// The main connection of the last recovery (the first one until then).
    recovered: Option<WireReader<BoxConn>>,
    /// Recoveries so far.
    recoveries: u32,
}

/// Receives the missing pages until DONE; after a break it can mend,
/// accepts the source again: at once (`RecoveryMode::Auto`, at most
/// [`MAX_RECOVERIES`] times), then (or at once with `manual`) when the
/// operator says `recover` on the control socket ([`crate::session::postcopy::control`]).
/// Returns the reference round trip (nanoseconds, samples).
fn receive_missing<M: Read + Write + Send, G: GuestRam, W: GuestRun>(
    first: &mut WireReader<M>,
    links: &mut Links,
    f: &Fetcher<G>,
    wl: &W,
    (cfg, channels): (&DestConfig, u16),
    recover: &mut Recover<'_>,
) -> Result<(u64, u64), MigrateError> {
    let ctl = cfg.recovery.control.as_ref();
    if let Some(c) = ctl {
        c.set(Phase::Postcopy, Some(f.left.load(Ordering::SeqCst)));
    }
    loop {
        let res = match &mut links.recovered {
            Some(m) => phase(m, &mut links.answers, f, &links.sockets),
            None => phase(first, &mut links.answers, f, &links.sockets),
        };
        let e = match res {
            Ok(x) => {
                if let Some(c) = ctl {
                    c.set(Phase::Done, Some(0));
                }
                return Ok(x);
            }
            Err(e) => e,
        };
        if !recoverable(&e) {
            if let Some(c) = ctl {
                c.set(Phase::Failed, None);
            }
            return Err(give_up(f, wl, format!("the destination: {e}")));
        }
        // Paused until the recovery (a vCPU waiting for a page pauses once
        // its page is there).
        wl.request_pause();
        let conns = await_recovery(&e, (cfg, channels), links.recoveries, f, recover);
        let mut conns = match conns {
            Ok(c) => c.into_iter(),
            Err(why) => return Err(give_up(f, wl, format!("the destination: {why}"))),
        };
        links.recoveries += 1;
        let (Some(mut m), Some(mut rq), Some(an)) = (conns.next(), conns.next(), conns.next())
        else {
            return Err(give_up(f, wl, "the recovery's connections".into()));
        };
        let mut an = an;
        let main_sock = m.get_mut().shutdown_handle().ok();
        links.sockets = sockets_of(main_sock.as_ref(), [&mut rq, &mut an]);
        let still = f.after_break(rq);
        let told = {
            let mut w = WireWriter::replies(m.get_mut());
            w.control(tag::MISSING, &encode_missing(&still))
                .and_then(|()| w.flush())
        };
        // A failure here shows in the next phase.
        let _ = told.and_then(|()| f.rerequest());
        if let Some(c) = ctl {
            c.recovered(f.left.load(Ordering::SeqCst));
        }
        links.answers = an;
        links.recovered = Some(m);
        wl.resume();
    }
}

/// After `e` broke post-copy: the source's new main, request and answer
/// connections, at once (`RecoveryMode::Auto`, the `recoveries`-th of at most
/// [`MAX_RECOVERIES`]) or when the operator says so.
///
/// # Errors
/// Why no recovery came (the operator gave up, or none was possible).
fn await_recovery<G: GuestRam>(
    e: &MigrateError,
    (cfg, channels): (&DestConfig, u16),
    recoveries: u32,
    f: &Fetcher<G>,
    recover: &mut Recover<'_>,
) -> Result<Vec<WireReader<BoxConn>>, String> {
    let wanted = [0, channels, channels + 1];
    let wait = cfg.io_timeout * 4;
    let left = f.left.load(Ordering::SeqCst);
    let mut accept = |_: Option<&str>| match recover(&wanted, wait) {
        Ok(c) if c.len() == 3 => Ok(c),
        Ok(_) => Err(MigrateError::Setup("the recovery's connections".into())),
        Err(e) => Err(e),
    };
    if cfg.recovery.mode == RecoveryMode::Auto && recoveries < MAX_RECOVERIES {
        eprintln!(
            "destination: POST-COPY BROKE ({e}): the guest's memory is split between the two hosts, {left} pages are still on the source; the guest is paused here; waiting up to {wait:?} for the source to resume over new connections"
        );
        accept(None).or_else(|e2| {
            control::await_operator(
                &cfg.recovery,
                "destination",
                format!("{e}; no recovery: {e2}"),
                left,
                &mut accept,
            )
        })
    } else {
        let why = match cfg.recovery.mode {
            RecoveryMode::Auto => format!("{e} ({} recoveries already)", recoveries),
            RecoveryMode::Manual => e.to_string(),
        };
        control::await_operator(&cfg.recovery, "destination", why, left, &mut accept)
    }
}

/// Post-copy given up: the fetcher fails its waiting vCPUs, the guest is
/// paused, and the error says how many pages never came.
fn give_up<G: GuestRam, W: GuestRun>(f: &Fetcher<G>, wl: &W, why: String) -> MigrateError {
    f.fail(&why);
    wl.pause();
    MigrateError::PostcopyBroken {
        why,
        missing_pages: Some(f.left.load(Ordering::SeqCst)),
    }
}

/// The fetcher's figures after the last page landed (the caller fills in
/// the missing pages and the recoveries).
fn figures_of<G: GuestRam>(
    fetcher: &Fetcher<G>,
    resumed_at: Instant,
    reference: (u64, u64),
) -> PostcopyFigures {
    let lat = std::mem::take(&mut *fetcher.latencies.lock().unwrap_or_else(|p| p.into_inner()));
    let (fault_median_ns, fault_p99_ns) = median_p99(&lat);
    let alat = std::mem::take(
        &mut *fetcher
            .answered_latencies
            .lock()
            .unwrap_or_else(|p| p.into_inner()),
    );
    let (answered_median_ns, answered_p99_ns) = median_p99(&alat);
    let last = fetcher
        .last_landed
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .map_or(Duration::ZERO, |t| t.saturating_duration_since(resumed_at));
    PostcopyFigures {
        missing_pages: 0,
        remote_faults: fetcher.remote_faults.load(Ordering::Relaxed),
        requests: fetcher.requests.load(Ordering::Relaxed),
        fault_median_ns,
        fault_p99_ns,
        answered_faults: alat.len() as u64,
        answered_median_ns,
        answered_p99_ns,
        time_to_last_page_ns: last.as_nanos() as u64,
        reference_ns: reference.0,
        reference_samples: reference.1,
        background_pages: fetcher.background_pages.load(Ordering::Relaxed),
        answered_pages: fetcher.answered_pages.load(Ordering::Relaxed),
        dropped_duplicates: fetcher.dropped.load(Ordering::Relaxed),
        recoveries: 0,
    }
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
fn phase<M: Read + Write + Send, G: GuestRam>(
    main: &mut WireReader<M>,
    answers: &mut WireReader<BoxConn>,
    f: &Fetcher<G>,
    sockets: &[ShutdownHandle],
) -> Result<(u64, u64), MigrateError> {
    f.broken.store(false, Ordering::SeqCst);
    let cut = || {
        f.broken.store(true, Ordering::SeqCst);
        f.wake();
        for s in sockets {
            s.shutdown();
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
fn answer_loop<G: GuestRam>(
    rd: &mut WireReader<BoxConn>,
    f: &Fetcher<G>,
) -> Result<(), MigrateError> {
    let mut keepalives = Keepalives::answer(Instant::now());
    loop {
        let at_byte = rd.pos;
        match rd.next_record()? {
            Record::Pages { .. } => f.take(rd, at_byte, true)?,
            Record::Control {
                tag: tag::PROGRESS, ..
            } => keepalives.take(Instant::now())?,
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
fn receive_rest<R: Read + Write, G: GuestRam>(
    main: &mut WireReader<R>,
    f: &Fetcher<G>,
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
            } => return Err(MigrateError::aborted(&body)),
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
            return Err(f.wait_failed(format!(
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
    Ok((median_p99(&times).0, times.len() as u64))
}
