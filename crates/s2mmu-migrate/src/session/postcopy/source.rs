//! The source's post-copy: with its guest paused, it sends the vCPU state
//! and the missing pages' bitmap, answers the destination's requests on
//! their own connection as they come, streams every other missing page in
//! the background, and checks the destination's memory against its own
//! plus the destination guest's writes.

use super::super::page_copy::copy_page;
use super::super::replies::{read_reply, unexpected_reply, Connect};
use super::control::{self, Phase, Recovery, RecoveryMode};
use super::keepalive::Keepalives;
use super::{decode_missing, encode_missing, Final};
use crate::bandwidth::TokenBucket;
use crate::stream_error::MigrateError;
use crate::transport::{BoxConn, Connection};
use crate::vm::{GuestRam, SessionVm};
use crate::wire::{
    record_name, tag, Batch, CompressStats, Compression, Dec, Record, WireReader, WireWriter,
    PAGE_SIZE, SESSION_LEN,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Recoveries the source attempts before it gives post-copy up.
pub const MAX_RECOVERIES: u32 = 3;

/// What the switch needs (the main connection, which carries the
/// background pages and the replies, is passed alongside).
pub struct Switch<'a, V: SessionVm> {
    pub vm: &'a Arc<V>,
    /// The request connection (read) and the answer connection (written).
    pub req: WireWriter<BoxConn>,
    pub answers: WireWriter<BoxConn>,
    /// The paused guest's state (the STATE record's body).
    pub state: &'a [u8],
    /// The pages still dirty (bit i: page i of guest memory).
    pub missing: Vec<u64>,
    /// The link limit (background pages only).
    pub bucket: &'a Mutex<TokenBucket>,
}

/// What the source saw of post-copy.
#[derive(Clone, Debug)]
pub struct Done {
    /// When the destination said it resumed.
    pub resumed_at: Instant,
    /// When the background stream's END went out.
    pub background_end: Instant,
    /// Pages sent in the background and as answers.
    pub background_pages: u64,
    pub answered_pages: u64,
    /// Stream bytes of both.
    pub bytes: u64,
    /// The destination's FINAL.
    pub fin: Final,
    /// Connections that broke and were replaced.
    pub recoveries: u32,
    /// What compression did on the connections of post-copy's own: the
    /// answers, and a recovery's main connection (the first main
    /// connection's counts are its writer's).
    pub compression: CompressStats,
}

/// Sends STATE and POSTCOPY and waits for the resume. Returns when both
/// were flushed and when POSTCOPY_RESUMED was read.
///
/// # Errors
/// The stream's or the destination's error; the destination has not
/// resumed the guest (the source may).
pub fn switch<V: SessionVm>(
    sw: &Switch<'_, V>,
    main: &mut WireWriter<BoxConn>,
) -> Result<[Instant; 2], MigrateError> {
    main.control(tag::STATE, sw.state)?;
    main.control(tag::POSTCOPY, &encode_missing(&sw.missing))?;
    main.flush()?;
    let sent = Instant::now();
    match read_reply(main, 0)? {
        Record::Control {
            tag: tag::POSTCOPY_RESUMED,
            ..
        } => Ok([sent, Instant::now()]),
        other => Err(unexpected_reply(other, "POSTCOPY_RESUMED")),
    }
}

/// After the resume: [`finish`], and when a connection breaks, resumes
/// over new ones (`connect`, joining `session`): at once, at most
/// [`MAX_RECOVERIES`] times with `RecoveryMode::Auto`, then (or at once with
/// `manual`) when the operator says so on the control socket
/// ([`super::control`]). The guest stays paused here throughout.
///
/// # Errors
/// [`MigrateError::PostcopyBroken`]: the guest's memory is split.
pub fn run<V: SessionVm>(
    mut sw: Switch<'_, V>,
    main: &mut WireWriter<BoxConn>,
    resumed_at: Instant,
    connect: &mut Connect<'_>,
    (session, channels): (&[u8; SESSION_LEN], u16),
    rec: &Recovery,
) -> Result<Done, MigrateError> {
    let (vm, state, bucket) = (sw.vm, sw.state, sw.bucket);
    let first_missing = sw.missing.clone();
    let pages = vm.ram().size() / PAGE_SIZE as u64;
    let mut recovered: Option<WireWriter<BoxConn>> = None;
    let mut recoveries = 0;
    let compression = main.compression();
    let count = |bm: &[u64]| bm.iter().map(|w| u64::from(w.count_ones())).sum::<u64>();
    if let Some(c) = &rec.control {
        c.set(Phase::Postcopy, Some(count(&sw.missing)));
    }
    loop {
        let m = match recovered.as_mut() {
            Some(m) => m,
            None => &mut *main,
        };
        let last_count = count(&sw.missing);
        let e = match finish(sw, m, resumed_at) {
            Ok(mut d) => {
                d.recoveries = recoveries;
                if let Some(m) = &recovered {
                    d.compression.add(&m.compression_stats());
                }
                if let Some(c) = &rec.control {
                    c.set(Phase::Done, Some(0));
                }
                return Ok(d);
            }
            Err(e) => e,
        };
        let (m, req, answers, still) = recover(e, rec, (recoveries, last_count), &mut || {
            reconnect(connect, session, channels, pages, compression)
        })?;
        recoveries += 1;
        // Only pages that were missing: the destination has the rest.
        let missing: Vec<u64> = still
            .iter()
            .zip(&first_missing)
            .map(|(a, b)| a & b)
            .collect();
        if let Some(c) = &rec.control {
            c.recovered(count(&missing));
        }
        recovered = Some(m);
        sw = Switch {
            vm,
            req,
            answers,
            state,
            missing,
            bucket,
        };
    }
}

/// After `e` broke post-copy: new connections, at once (with `RecoveryMode::Auto`
/// auto`, the `recoveries`-th of at most [`MAX_RECOVERIES`]) or when the
/// operator says so; `last_count`: the pages missing before the break.
///
/// # Errors
/// [`MigrateError::PostcopyBroken`] when `e` cannot be mended or the
/// operator gave up.
fn recover(
    e: MigrateError,
    rec: &Recovery,
    (recoveries, last_count): (u32, u64),
    again: &mut dyn FnMut() -> Result<Reconnected, MigrateError>,
) -> Result<Reconnected, MigrateError> {
    let broken = |why: String| MigrateError::PostcopyBroken {
        why: format!("the source: {why}"),
        missing_pages: None,
    };
    let mendable = matches!(
        e,
        MigrateError::Io { .. } | MigrateError::Timeout { .. } | MigrateError::Truncated { .. }
    );
    if !mendable {
        if let Some(c) = &rec.control {
            c.set(Phase::Failed, None);
        }
        return Err(broken(e.to_string()));
    }
    let r = if rec.mode == RecoveryMode::Auto && recoveries < MAX_RECOVERIES {
        eprintln!(
                "source: POST-COPY BROKE ({e}): the guest's memory is split between the two hosts; it stays paused here; resuming over new connections (recovery {} of at most {MAX_RECOVERIES})",
                recoveries + 1
            );
        match again() {
            Ok(x) => x,
            Err(e2) => control::await_operator(
                rec,
                "source",
                format!("{e}; the recovery failed: {e2}"),
                last_count,
                |_| again(),
            )
            .map_err(broken)?,
        }
    } else {
        control::await_operator(rec, "source", e.to_string(), last_count, |_| again())
            .map_err(broken)?
    };
    Ok(r)
}

/// A recovery's main, request and answer connections and the pages the
/// destination still lacks.
type Reconnected = (
    WireWriter<BoxConn>,
    WireWriter<BoxConn>,
    WireWriter<BoxConn>,
    Vec<u64>,
);

/// A recovery's connections: the main one joins as channel 0, then the
/// request and answer connections; the destination answers with MISSING.
fn reconnect(
    connect: &mut Connect<'_>,
    session: &[u8; SESSION_LEN],
    channels: u16,
    pages: u64,
    compression: Compression,
) -> Result<Reconnected, MigrateError> {
    let mut main = WireWriter::join(connect(0)?, session, 0)?;
    main.set_compression(compression);
    let req = WireWriter::join(connect(channels)?, session, channels)?;
    let mut answers = WireWriter::join(connect(channels + 1)?, session, channels + 1)?;
    answers.set_compression(compression);
    match read_reply(&mut main, 0)? {
        Record::Control {
            tag: tag::MISSING,
            body,
            at_byte,
        } => {
            let still = decode_missing(&body, at_byte, pages)?;
            Ok((main, req, answers, still))
        }
        other => Err(unexpected_reply(other, "MISSING")),
    }
}

/// After the resume, over one set of connections: answers requests,
/// streams the rest, reads FINAL.
///
/// # Errors
/// The stream's error (the caller says the memory is split).
pub fn finish<V: SessionVm>(
    sw: Switch<'_, V>,
    main: &mut WireWriter<BoxConn>,
    resumed_at: Instant,
) -> Result<Done, MigrateError> {
    let vm = sw.vm;
    let sent: Vec<AtomicU64> = sw.missing.iter().map(|_| AtomicU64::new(0)).collect();
    let mut req_conn = sw.req;
    let req_sock = req_conn.get_mut().shutdown_handle().ok();
    let mut req = WireReader::replies(req_conn.into_inner());
    let mut answers = sw.answers;
    let r = std::thread::scope(|sc| {
        let sent = &sent;
        let server = sc.spawn(move || serve_requests(&**vm, &mut req, &mut answers, sent));
        let bg = background(&**vm, main, &sw.missing, sent, sw.bucket);
        let fin = bg.and_then(|(pages, bytes, end)| match read_reply(main, 0)? {
            Record::Control {
                tag: tag::FINAL,
                body,
                at_byte,
            } => Final::decode(&body, at_byte).map(|f| (pages, bytes, end, f)),
            other => Err(unexpected_reply(other, "FINAL")),
        });
        if fin.is_err() {
            // The request server would wait for DONE until its deadline,
            // the destination for the stream until its own.
            if let Some(s) = &req_sock {
                s.shutdown();
            }
            if let Ok(s) = main.get_mut().shutdown_handle() {
                s.shutdown();
            }
        }
        let served = server
            .join()
            .unwrap_or_else(|_| Err(MigrateError::Setup("the request server panicked".into())));
        match (fin, served) {
            (Ok((pages, bytes, end, fin)), Ok((answered, abytes, compression))) => Ok(Done {
                resumed_at,
                background_end: end,
                background_pages: pages,
                answered_pages: answered,
                bytes: bytes + abytes,
                fin,
                recoveries: 0,
                compression,
            }),
            (Err(e), _) | (_, Err(e)) => Err(e),
        }
    });
    r
}

/// The guest-physical address of page `index` of guest memory.
fn gpa_of<V: SessionVm>(vm: &V, index: u64) -> Option<(u64, u64)> {
    let off = index * PAGE_SIZE as u64;
    vm.slots()
        .iter()
        .find(|s| off >= s.mem_offset && off - s.mem_offset < s.size)
        .map(|s| (s.gpa + off - s.mem_offset, off))
}

fn claim(sent: &[AtomicU64], i: u64) -> bool {
    let b = 1u64 << (i % 64);
    sent[(i / 64) as usize].fetch_or(b, Ordering::SeqCst) & b == 0
}

/// Every missing page no request has taken yet, on the main connection,
/// then END. Returns pages, bytes and when END went out.
fn background<V: SessionVm>(
    vm: &V,
    main: &mut WireWriter<BoxConn>,
    missing: &[u64],
    sent: &[AtomicU64],
    bucket: &Mutex<TokenBucket>,
) -> Result<(u64, u64, Instant), MigrateError> {
    let (p0, b0) = (main.pages, main.pos);
    let mut batch = Batch::new();
    let memory = &**vm.ram();
    for (w, &word) in missing.iter().enumerate() {
        let mut m = word;
        while m != 0 {
            let i = w as u64 * 64 + u64::from(m.trailing_zeros());
            m &= m - 1;
            if !claim(sent, i) {
                continue;
            }
            let Some((gpa, off)) = gpa_of(vm, i) else {
                continue;
            };
            batch.push_known(gpa, |p| copy_page(memory, off, p));
            if batch.is_full() {
                // The limit counts the bytes on the wire, after compression.
                main.sealed_batch_paced(&mut batch, &mut |bytes| {
                    bucket.lock().unwrap_or_else(|p| p.into_inner()).take(bytes)
                })?;
            }
        }
    }
    main.sealed_batch(&mut batch)?;
    main.end()?;
    Ok((main.pages - p0, main.pos - b0, Instant::now()))
}

/// Answers REQUESTs on the answer connection (first, whatever the
/// background stream is doing), forwards heartbeats, ends at DONE.
/// Returns the pages answered and their bytes.
fn serve_requests<V: SessionVm>(
    vm: &V,
    req: &mut WireReader<BoxConn>,
    answers: &mut WireWriter<BoxConn>,
    sent: &[AtomicU64],
) -> Result<(u64, u64, CompressStats), MigrateError> {
    let (p0, b0) = (answers.pages, answers.pos);
    let mut batch = Batch::new();
    let mut keepalives = Keepalives::request(Instant::now());
    loop {
        match req.next_record()? {
            Record::Control {
                tag: tag::REQUEST,
                body,
                at_byte,
            } => {
                let mut d = Dec::new(&body, "REQUEST", at_byte);
                let gpa = d.u64()?;
                d.finish()?;
                let off = match vm.locate(gpa) {
                    Some((_, off)) if gpa.is_multiple_of(PAGE_SIZE as u64) => off,
                    _ => return Err(MigrateError::PageOutOfRange { gpa, at_byte }),
                };
                claim(sent, off / PAGE_SIZE as u64);
                batch.push_known(gpa, |p| copy_page(&**vm.ram(), off, p));
                answers.sealed_batch(&mut batch)?;
                answers.flush()?;
            }
            Record::Control {
                tag: tag::PROGRESS, ..
            } => {
                keepalives.take(Instant::now())?;
                answers.control(tag::PROGRESS, &[])?;
                answers.flush()?;
            }
            Record::Control { tag: tag::DONE, .. } => {
                answers.end()?;
                return Ok((
                    answers.pages - p0,
                    answers.pos - b0,
                    answers.compression_stats(),
                ));
            }
            other => {
                return Err(MigrateError::Malformed {
                    record: "request",
                    at_byte: req.pos,
                    why: format!(
                        "the request connection carries REQUEST, PROGRESS and DONE, got {}",
                        record_name(&other)
                    ),
                })
            }
        }
    }
}
