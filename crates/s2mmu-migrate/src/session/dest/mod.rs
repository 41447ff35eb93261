//! The destination: authenticates the source, checks what the stream asks
//! for against its own limits before it allocates anything, receives the
//! pages straight into its guest memory over one or more channels,
//! verifies every page and the whole, and resumes the guest only from a
//! complete, valid stream.

use super::postcopy;
use crate::stream_error::MigrateError;
use crate::transport::{self, BoxConn, Connection, Duplex, Listener, NetConfig};
use crate::wire::WireFormat;
use crate::wire::{tag, Header, Opening, WireReader, WireWriter, PAGE_SIZE};
use s2mmu::format::arm64::Arm64Stage2;
use s2mmu::format::ept::EptFormat;
use s2mmu::memslot::TreeMemslots;
use s2mmu::mmu::{DirtyMode, MmuPolicy};
use s2mmu_vm::{Backing, Vm, VmConfig, VmFormat};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod checks;
pub mod config;
mod join;
// Writes received pages straight into guest memory.
#[allow(unsafe_code)]
mod receive;
mod resume;

use checks::{check_complete, check_state, snapshot_for};
pub use config::{DestConfig, DestOutcome, Limits};
pub(crate) use join::Join;
use join::{accept_and_join, join_channels, opener, Refusals};
pub(crate) use receive::check_end;
use receive::{populate, receive_channels, RawMem, Shared};
use resume::resume_after_end;
pub(crate) use resume::{run_resumed, start_workload};

/// Accepts one source on `listener`, authenticates it as `net` says,
/// joins its further channels and receives the migration. Connections
/// are authenticated concurrently ([`net::Admission`]); one that fails
/// before it authenticates (a scan, a probe, a reset, a stall, a wrong
/// key or certificate) is logged and the wait goes on: only an
/// authenticated source's failure ends it.
///
/// # Errors
/// After `cfg.accept_wait` with no source: the last refused connection's
/// error ([`MigrateError::Auth`] for a failed authentication,
/// [`MigrateError::Timeout`] for a stall), or [`MigrateError::Timeout`]
/// when none came; otherwise as [`receive_from`].
pub fn serve(
    listener: &dyn Listener,
    cfg: &DestConfig,
    net: &NetConfig,
) -> Result<DestOutcome, MigrateError> {
    let (peer, rd, header) = admit_source(listener, cfg, net)?;
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
        cfg,
        &mut |session, wanted, wait| {
            // After the operator's `recover ADDR`: a post-copy recovery is
            // accepted on a new listener at ADDR.
            match cfg.recovery.control.as_ref().and_then(|c| c.redirect()) {
                Some(addr) => {
                    let l = transport::bind(&addr)?;
                    eprintln!("destination: accepting the recovery on {}", l.local());
                    join_channels(&*l, net, wait, session, wanted, &mut refused)
                }
                None => join_channels(listener, net, wait, session, wanted, &mut refused),
            }
        },
    )
}

/// The first connection that authenticates and opens a migration
/// (HEADER); every other is refused and logged.
fn admit_source(
    listener: &dyn Listener,
    cfg: &DestConfig,
    net: &NetConfig,
) -> Result<(String, WireReader<BoxConn>, Header), MigrateError> {
    let deadline = cfg.accept_wait.map(|w| Instant::now() + w);
    let mut admission = transport::Admission::new(net, opener(net.io_timeout));
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

/// Receives one migration from `input`, replying on `reply`: one channel,
/// no authentication (a recorded stream, a fuzzer's, a test's).
///
/// # Errors
/// Any stream error ([`MigrateError::Truncated`],
/// [`MigrateError::PageChecksum`], ...), [`MigrateError::OverLimit`],
/// [`MigrateError::BadState`], [`MigrateError::Incomplete`],
/// [`MigrateError::Aborted`]. On an error the guest is not resumed and the
/// source is told why when the connection still works.
pub fn receive_from<R: Read + Send, W: Write + Send>(
    input: R,
    reply: W,
    cfg: &DestConfig,
) -> Result<DestOutcome, MigrateError> {
    receive_core(
        Duplex {
            input,
            output: reply,
        },
        None,
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
/// (one channel only).
///
/// # Errors
/// As [`receive_from`].
pub fn receive(stream: TcpStream, cfg: &DestConfig) -> Result<DestOutcome, MigrateError> {
    transport::configure(&stream, cfg.io_timeout)?;
    receive_from(
        stream
            .try_clone()
            .map_err(|e| MigrateError::io("the connection", &e))?,
        stream,
        cfg,
    )
}

/// Receives on `main`; `opened`: its HEADER and the bytes of its opening
/// when they were read already (by the admission).
fn receive_core<C: Connection>(
    mut main: C,
    opened: Option<(Header, u64)>,
    cfg: &DestConfig,
    join: &mut Join<'_>,
) -> Result<DestOutcome, MigrateError> {
    let result = receive_inner(&mut main, opened, cfg, join);
    if let Err(e) = &result {
        if !matches!(e, MigrateError::Aborted { .. }) {
            let mut r = WireWriter::replies(&mut main);
            let _ = r.control(tag::REJECTED, e.to_string().as_bytes());
            let _ = r.flush();
        }
    }
    result
}

fn receive_inner<C: Connection>(
    main: &mut C,
    opened: Option<(Header, u64)>,
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
    Backing::parse(&header.backing).map_err(MigrateError::Setup)?;
    if header.format != cfg.format {
        return Err(MigrateError::FormatMismatch {
            stream: header.format.name(),
            destination: cfg.format.name(),
        });
    }
    match cfg.format {
        WireFormat::Arm64 => receive_guest::<C, Arm64Stage2>(rd, &header, cfg, join),
        WireFormat::Ept => receive_guest::<C, EptFormat>(rd, &header, cfg, join),
    }
}

/// Builds the guest `header` describes on format `F` and receives it.
fn receive_guest<C: Connection, F: VmFormat>(
    mut rd: WireReader<&mut C>,
    header: &Header,
    cfg: &DestConfig,
    join: &mut Join<'_>,
) -> Result<DestOutcome, MigrateError> {
    let page_count = header.mem_size / PAGE_SIZE as u64;
    let vm = Arc::new(build_vm::<F>(header, cfg.policy)?);
    let prefault = if cfg.prefault {
        populate(&vm, &mut rd)?
    } else {
        Duration::ZERO
    };
    let (session, mut extras, pc_conns) = accept_and_join(&mut rd, header, cfg, join)?;
    let sh = Shared {
        vm: &vm,
        raw: RawMem {
            base: vm.memory().host_addr() as *mut u8,
            size: vm.memory().size(),
        },
        channels: header.channels,
        received: (0..page_count.div_ceil(64))
            .map(|_| AtomicU64::new(0))
            .collect(),
        hashes: (0..page_count).map(|_| AtomicU64::new(0)).collect(),
        snapshot: snapshot_for(header)?,
    };
    let got = receive_channels(&mut rd, &mut extras, &sh, header)?;
    let extra_counts = extras.iter().fold((0u64, 0u64, 0u64), |(a, b, z), x| {
        (a + x.pages, b + x.pos, z + x.zero_pages)
    });
    // Never resume from incomplete memory (post-copy: every page but the
    // missing ones, which come after the resume).
    check_complete(&sh, got.postcopy_missing.as_deref(), &vm)?;
    let state = got.state.ok_or(MigrateError::Malformed {
        record: "END",
        at_byte: rd.pos,
        why: "the stream carried no vCPU STATE".into(),
    })?;
    check_state(&state, header)?;
    if let Some(missing) = got.postcopy_missing {
        let mut pc = pc_conns.into_iter();
        let (Some(req), Some(answers)) = (pc.next(), pc.next()) else {
            return Err(MigrateError::Setup(
                "post-copy's connections did not join".into(),
            ));
        };
        let main_socket = rd.get_mut().shutdown_handle().ok();
        return postcopy::dest::resume(postcopy::dest::Resume {
            vm: &vm,
            main: &mut rd,
            main_socket,
            req,
            answers,
            state: &state,
            missing,
            cfg,
            extra_counts,
            channels: header.channels,
            probe_bytes: got.probe_bytes,
            prefault,
            recover: &mut |wanted, wait| join(&session, wanted, wait),
        });
    }
    let mut outcome = resume_after_end(&mut rd, &vm, &sh, &state, cfg)?;
    outcome.page_records += extra_counts.0;
    outcome.bytes += extra_counts.1;
    outcome.zero_pages += extra_counts.2;
    outcome.channels = header.channels;
    outcome.probe_bytes = got.probe_bytes;
    outcome.prefault = prefault;
    Ok(outcome)
}

/// The destination's VM: the source's geometry with the destination's
/// own MMU policy.
///
/// # Errors
/// [`MigrateError::Setup`].
pub fn build_vm<F: VmFormat>(
    h: &Header,
    policy: MmuPolicy,
) -> Result<Vm<TreeMemslots, F>, MigrateError> {
    let backing = Backing::parse(&h.backing).map_err(MigrateError::Setup)?;
    Vm::new(VmConfig {
        mem_size: h.mem_size,
        backing,
        slots: h.slots,
        gpa_base: h.gpa_base,
        // The destination does not log dirty pages.
        policy: MmuPolicy {
            dirty: DirtyMode::Bitmap,
            ..policy
        },
        ..VmConfig::default()
    })
    .map_err(|e| MigrateError::Setup(format!("destination guest: {e}")))
}
