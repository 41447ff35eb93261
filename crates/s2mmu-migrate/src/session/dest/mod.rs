//! The destination: authenticates the source, checks what the stream asks
//! for against its own limits before it allocates anything, receives the
//! pages straight into its guest memory over one or more channels,
//! verifies every page and the whole, and resumes the guest only from a
//! complete, valid stream.

use crate::stream_error::MigrateError;
use crate::transport::{self, BoxConn, Connection, Duplex, Listener, NetConfig};
use crate::vm::{GuestRam, SessionVm};
use crate::wire::{tag, Header, Opening, WireReader, WireWriter, PAGE_SIZE};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod checks;
pub mod config;
pub mod guest;
mod join;
pub mod postcopy;
// Writes received pages straight into guest memory.
#[allow(unsafe_code)]
mod receive;
mod resume;
mod sync;

use checks::{check_complete, snapshot_for};
pub use config::{DestConfig, DestOutcome, Limits, ResumeParts};
pub use guest::{DestFactory, DestGuest, ResumedGuest};
pub(crate) use join::Join;
use join::{accept_and_join, join_channels, opener, Refusals};
pub(crate) use receive::check_end;
use receive::{populate, receive_channels, RawMem, ReceiveState};
use resume::resume_after_end;
pub(crate) use resume::{resumed_at, run_resumed};

/// Accepts one source on `listener` into the guest `factory` builds,
/// authenticates it as `net` says,
/// joins its further channels and receives the migration. Connections
/// are authenticated concurrently ([`transport::Admission`]); one that fails
/// before it authenticates (a scan, a probe, a reset, a stall, a wrong
/// key or certificate) is logged and the wait goes on: only an
/// authenticated source's failure ends it.
///
/// # Errors
/// After `cfg.accept_wait` with no source: the last refused connection's
/// error ([`MigrateError::Auth`] for a failed authentication,
/// [`MigrateError::Timeout`] for a stall), or [`MigrateError::Timeout`]
/// when none came; otherwise as [`receive_from_with`].
pub fn serve_with<D: DestFactory>(
    listener: &dyn Listener,
    factory: &D,
    cfg: &DestConfig,
    net: &NetConfig,
) -> Result<DestOutcome, MigrateError> {
    // One admission for the whole session: the source's further
    // connections may arrive (and authenticate) while the main one opens.
    let mut admission = transport::Admission::new(net, opener(net.io_timeout));
    let (peer, rd, header) = admit_source(listener, &mut admission, cfg)?;
    if cfg.progress {
        eprintln!("source connected from {peer}");
    }
    let pos = rd.pos;
    let main = rd.into_inner();
    let ctl = cfg.recovery.control.clone();
    let mut refused = |why: &str| {
        if let Some(c) = &ctl {
            c.refused(why);
        }
    };
    receive_core(
        main,
        Some((header, pos)),
        factory,
        cfg,
        &mut |session, wanted, wait| {
            // After the operator's `recover ADDR`: a post-copy recovery is
            // accepted on a new listener at ADDR.
            match cfg.recovery.control.as_ref().and_then(|c| c.redirect()) {
                Some(addr) => {
                    let l = transport::bind(&addr)?;
                    eprintln!("destination: accepting the recovery on {}", l.local());
                    let mut fresh = transport::Admission::new(net, opener(net.io_timeout));
                    join_channels(&*l, &mut fresh, wait, session, wanted, &mut refused)
                }
                None => join_channels(
                    listener,
                    &mut admission,
                    wait,
                    session,
                    wanted,
                    &mut refused,
                ),
            }
        },
    )
}

/// The first connection that authenticates and opens a migration
/// (HEADER); every other that finished its opening is refused and logged.
/// Connections still in their handshake or waiting to send their opening
/// stay in `admission` (a source's further channels, whose JOIN follows
/// ACCEPT).
fn admit_source(
    listener: &dyn Listener,
    admission: &mut transport::Admission<join::Opened>,
    cfg: &DestConfig,
) -> Result<(String, WireReader<BoxConn>, Header), MigrateError> {
    let deadline = cfg.accept_wait.map(|w| Instant::now() + w);
    let mut no = Refusals::default();
    let quiet = &mut |_: &str| {};
    loop {
        // A short wait at a time, to see `stop`.
        let soon = Instant::now() + Duration::from_millis(100);
        let until = deadline.map_or(soon, |d| d.min(soon));
        if cfg.stop.load(Ordering::SeqCst) {
            return Err(MigrateError::Setup(
                "stopped before a source connected".into(),
            ));
        }
        match admission.next(listener, Some(until))? {
            None if deadline.is_none_or(|d| Instant::now() < d) => {}
            Some((peer, Ok((rd, Opening::Main(header))))) => return Ok((peer, rd, header)),
            Some((peer, Ok((_, Opening::Join { .. })))) => no.note(
                format!("{peer} joined a channel before any migration started"),
                quiet,
            ),
            // An authenticated source whose opening failed: an attempt.
            Some((_, Err(r))) if r.authenticated => return Err(r.error),
            Some((peer, Err(r))) => no.note_refused(peer, r, quiet),
            None => {
                return Err(no.last_error.unwrap_or(MigrateError::Timeout {
                    what: "waiting for a source".into(),
                }))
            }
        }
    }
}

/// Receives one migration from `input` into the guest `factory` builds,
/// replying on `reply`: one channel,
/// no authentication (a recorded stream, a fuzzer's, a test's).
///
/// # Errors
/// Any stream error ([`MigrateError::Truncated`],
/// [`MigrateError::PageChecksum`], ...), [`MigrateError::OverLimit`],
/// [`MigrateError::BadState`], [`MigrateError::Incomplete`],
/// [`MigrateError::Aborted`]. On an error the guest is not resumed and the
/// source is told why when the connection still works.
pub fn receive_from_with<R: Read + Send, W: Write + Send, D: DestFactory>(
    input: R,
    reply: W,
    factory: &D,
    cfg: &DestConfig,
) -> Result<DestOutcome, MigrateError> {
    receive_core(
        Duplex {
            input,
            output: reply,
        },
        None,
        factory,
        cfg,
        &mut |_, wanted, _| {
            Err(MigrateError::OverLimit {
                what: "connections",
                asked: wanted.len() as u64 + 1,
                allowed: 1,
            })
        },
    )
}

/// Receives one migration on an accepted, authenticated TCP connection
/// (one channel only) into the guest `factory` builds.
///
/// # Errors
/// As [`receive_from_with`].
pub fn receive_with<D: DestFactory>(
    stream: TcpStream,
    factory: &D,
    cfg: &DestConfig,
) -> Result<DestOutcome, MigrateError> {
    transport::configure(&stream, cfg.io_timeout)?;
    receive_from_with(
        stream
            .try_clone()
            .map_err(|e| MigrateError::io("the connection", &e))?,
        stream,
        factory,
        cfg,
    )
}

/// Receives on `main`; `opened`: its HEADER and the bytes of its opening
/// when they were read already (by the admission).
fn receive_core<C: Connection, D: DestFactory>(
    mut main: C,
    opened: Option<(Header, u64)>,
    factory: &D,
    cfg: &DestConfig,
    join: &mut Join<'_>,
) -> Result<DestOutcome, MigrateError> {
    let result = receive_inner(&mut main, opened, factory, cfg, join);
    if let Err(e) = &result {
        if !matches!(e, MigrateError::Aborted { .. }) {
            let mut r = WireWriter::replies(&mut main);
            let _ = r.control(tag::REJECTED, e.to_string().as_bytes());
            let _ = r.flush();
        }
    }
    result
}

fn receive_inner<C: Connection, D: DestFactory>(
    main: &mut C,
    opened: Option<(Header, u64)>,
    factory: &D,
    cfg: &DestConfig,
    join: &mut Join<'_>,
) -> Result<DestOutcome, MigrateError> {
    let (rd, header) = match opened {
        Some((header, pos)) => (WireReader::continued(main, pos), header),
        None => WireReader::new(main)?,
    };
    let rd = rd.with_grace(cfg.io_timeout);
    // Nothing is allocated before the stream is known to fit.
    cfg.limits.check(&header)?;
    config::Limits::check_image(cfg.image.as_ref(), &header)?;
    let guest = factory.build(&header)?;
    receive_guest(rd, &guest, &header, cfg, join)
}

/// What the receiving threads share, for `header`'s guest in `vm`; SYNC
/// waits up to `sync_wait` at a time for the other channels' pages.
///
/// # Errors
/// verify-full's snapshot cannot be had, or the guest's RAM is smaller
/// than the stream's memory.
fn shared_for<'a, V: SessionVm>(
    vm: &'a V,
    header: &Header,
    sync_wait: Duration,
) -> Result<ReceiveState<'a, V>, MigrateError> {
    let page_count = header.mem_size / PAGE_SIZE as u64;
    if vm.ram().size() < header.mem_size {
        return Err(MigrateError::Setup(format!(
            "the destination guest has {} bytes of RAM, the stream {}",
            vm.ram().size(),
            header.mem_size
        )));
    }
    Ok(ReceiveState {
        vm,
        raw: RawMem { ram: &**vm.ram() },
        channels: header.channels,
        received: (0..page_count.div_ceil(64))
            .map(|_| AtomicU64::new(0))
            .collect(),
        hashes: (0..page_count).map(|_| AtomicU64::new(0)).collect(),
        snapshot: snapshot_for(header)?,
        sync: sync::SyncProgress::new(header.channels, sync_wait, header.postcopy),
    })
}

/// Receives `header`'s stream into `guest` and resumes it.
fn receive_guest<C: Connection, G: DestGuest>(
    mut rd: WireReader<&mut C>,
    guest: &G,
    header: &Header,
    cfg: &DestConfig,
    join: &mut Join<'_>,
) -> Result<DestOutcome, MigrateError> {
    let vm: &G::Vm = guest.vm();
    let prefault = if cfg.prefault {
        populate(vm, &mut rd)?
    } else {
        Duration::ZERO
    };
    let (session, mut extras, pc_conns) = accept_and_join(&mut rd, header, cfg, join)?;
    let sh = shared_for(vm, header, cfg.io_timeout)?;
    let got = receive_channels(&mut rd, &mut extras, &sh, header)?;
    let extra_counts = extras.iter().fold((0u64, 0u64, 0u64), |(a, b, z), x| {
        (a + x.pages, b + x.pos, z + x.zero_pages)
    });
    let mut recv_stages = rd.stages;
    for x in &extras {
        recv_stages.add(&x.stages);
    }
    // Never resume from incomplete memory (post-copy: every page but the
    // missing ones, which come after the resume).
    check_complete(&sh, got.postcopy_missing.as_deref(), vm)?;
    let drained = Instant::now();
    let (body, at_byte) = got.state.ok_or(MigrateError::Malformed {
        record: "END",
        at_byte: rd.pos,
        why: "the stream carried no vCPU STATE".into(),
    })?;
    let state = guest.decode_state(&body, header, at_byte)?;
    let clock = resume::Clock {
        state_at: got.state_at.unwrap_or(drained),
        drained,
        decoded: Instant::now(),
        logging: sh.sync.logging.load(Ordering::Acquire),
    };
    if let Some(missing) = got.postcopy_missing {
        let mut pc = pc_conns.into_iter();
        let (Some(req), Some(answers)) = (pc.next(), pc.next()) else {
            return Err(MigrateError::Setup(
                "post-copy's connections did not join".into(),
            ));
        };
        let main_socket = rd.get_mut().shutdown_handle().ok();
        return postcopy::resume(postcopy::Resume {
            guest,
            main: &mut rd,
            main_socket,
            req,
            answers,
            state: &state,
            missing,
            logging: sh.sync.logging.load(Ordering::Acquire),
            cfg,
            extra_counts,
            channels: header.channels,
            probe_bytes: got.probe_bytes,
            prefault,
            recover: &mut |wanted, wait| join(&session, wanted, wait),
        })
        .map(|mut o| {
            o.recv_stages = recv_stages;
            o.resume_parts.drain = clock.drained.saturating_duration_since(clock.state_at);
            o.resume_parts.decode = clock.decoded.saturating_duration_since(clock.drained);
            o
        });
    }
    let mut outcome = resume_after_end(&mut rd, guest, &sh, &state, cfg, clock)?;
    outcome.page_records += extra_counts.0;
    outcome.bytes += extra_counts.1;
    outcome.zero_pages += extra_counts.2;
    outcome.channels = header.channels;
    outcome.probe_bytes = got.probe_bytes;
    outcome.prefault = prefault;
    outcome.recv_stages = recv_stages;
    Ok(outcome)
}
