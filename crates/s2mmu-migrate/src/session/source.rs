//! The source: runs the guest, logs its dirty pages and sends its memory in
//! pre-copy rounds until what is left fits the downtime budget, then pauses
//! it, sends the rest and the vCPU state, and waits for the destination to
//! resume it. Afterwards it checks the destination's memory against its own
//! (frozen) memory.
//!
//! Its parts: [`config`] (settings and checks), `sender` (pages onto the
//! channels), `precopy` (the round loop), `precopy_end` (where it left the
//! source, which both endings take), `stop_copy` (the stop, the
//! verification, the outcome), `postcopy_switch`, [`outcome`] and
//! `verify`.

use super::guest::{GuestShape, SourceGuest};
use super::postcopy::Postcopy;
use super::replies::{abort_and_reason, read_opening_reply, unexpected_reply, Connect};
use super::timeline::Timeline;
use crate::stream_error::MigrateError;
use crate::transport::BoxConn;
use crate::vm::SessionVm;
use crate::wire::{tag, Dec, Header, Record, WireWriter, PAGE_SIZE, SESSION_LEN};
use std::time::Instant;

mod auto_channels;
mod channel_choice;
pub mod config;
mod figures;
mod harvest;
pub mod outcome;
mod postcopy_switch;
mod precopy;
mod precopy_end;
mod sender;
mod stop_copy;
mod sync;
mod verify;

pub use auto_channels::{AutoChannels, MAX_AUTO_CANDIDATES, MAX_AUTO_PROBE_BYTES};
pub use channel_choice::{ChannelChoice, ChannelProbe, AUTO_MARGIN_PCT};
pub use config::{validate, validate_shape, Converge, Harvest, SourceConfig};
use figures::{counters, MIB};
use harvest::Harvester;
pub use outcome::{DowntimeParts, Phase, RoundStat, SetupParts, SourceOutcome};
use precopy::Precopy;
use precopy_end::PrecopyEnd;
use sender::{Chan, Sender};

/// Runs the source side for `guest`, already running: `connect` opens
/// each channel's connection once the guest is warm.
///
/// # Errors
/// [`MigrateError::Setup`], [`MigrateError::Io`], [`MigrateError::Timeout`],
/// [`MigrateError::Auth`], [`MigrateError::NotConverged`] (the destination
/// was told to abort and the source guest kept running),
/// [`MigrateError::Rejected`], [`MigrateError::MemoryMismatch`].
pub fn run_source<G: SourceGuest>(
    guest: &G,
    cfg: &SourceConfig,
    connect: &mut Connect<'_>,
) -> Result<SourceOutcome, MigrateError> {
    let Some(auto) = &cfg.auto_channels else {
        return run_source_with(guest, cfg, connect);
    };
    check_run(guest, cfg)?;
    // The guest runs during the probe; the warm-up (the reference of its
    // speed) follows it, so the probe's load is not in the reference.
    let vcpus = guest.shape().vcpus as usize;
    let probe_start = Instant::now();
    let choice = channel_choice::choose(guest.vm(), cfg, auto, vcpus)?;
    let channel_probe = probe_start.elapsed();
    if cfg.progress.is_on() {
        let probes: Vec<String> = choice
            .probes
            .iter()
            .map(|p| {
                format!(
                    "{}: {:.0} MiB/s",
                    p.channels,
                    p.pages_per_s() * PAGE_SIZE as f64 / MIB
                )
            })
            .collect();
        cfg.progress.line(&format!(
            "{}channels auto: {} (round 0's pipeline on this host, {})",
            cfg.label,
            choice.chosen,
            probes.join(", ")
        ));
    }
    let chosen = SourceConfig {
        channels: choice.chosen,
        auto_channels: None,
        ..cfg.clone()
    };
    run_source_with(guest, &chosen, connect).map(|o| SourceOutcome {
        channel_choice: Some(choice),
        setup: SetupParts {
            channel_probe,
            ..o.setup
        },
        ..o
    })
}

/// [`run_source`] with the channel count settled.
fn run_source_with<G: SourceGuest>(
    guest: &G,
    cfg: &SourceConfig,
    connect: &mut Connect<'_>,
) -> Result<SourceOutcome, MigrateError> {
    let shape = check_run(guest, cfg)?;
    let vm = guest.vm();
    let timeline = Timeline::start(guest.counter_source(), cfg.sample_every);
    let pace = guest.pace();
    let warm = counters(guest);
    std::thread::sleep(cfg.warmup);
    let warm_end = counters(guest);
    let warm_end_s = timeline.at(warm_end.0);
    // Connect, be accepted, join the further channels, measure the link.
    let connect_start = Instant::now();
    let (session, chans, pc_conns) = connect_channels(cfg, guest, connect)?;
    let connected = Instant::now();
    let harvester = Harvester::new(cfg.harvest, cfg.clear_chunk, shape.vcpus as usize);
    let mut s = Sender::new(vm, chans, cfg, harvester);
    let (link_bytes, link) = probe_link(&mut s, cfg, shape.mem_size)?;
    // Pre-copy.
    let log_start = Instant::now();
    let setup = SetupParts::between(connect_start, connected, log_start);
    let log_start_s = timeline.at(log_start);
    let at_log = counters(guest);
    vm.enable_dirty_logging()
        .map_err(|e| MigrateError::Setup(format!("enabling dirty logging: {e}")))?;
    // Whatever ends the run from here (done, refused, an I/O error, a
    // timeout), the log and the convergence help are the migration's:
    // they stop with it, so that a guest left here runs on as before.
    let ended = 'run: {
        let mut hook = match guest.begin_hook() {
            Ok(h) => h,
            Err(e) => break 'run Err(abort_and_reason(e, &mut s.chans[0].wire)),
        };
        let mut pre = Precopy::new(cfg, guest, &timeline, &shape, link, pace, log_start);
        let result = pre.run(&mut s, &mut hook);
        let Precopy {
            rounds,
            round,
            throttle_pct,
            max_throttle,
            switch,
            ..
        } = pre;
        let final_pace = guest.pace();
        if let Err(e) = result {
            // The guest stays here: unthrottled while the destination's
            // reason is awaited.
            guest.set_throttle_ns(0);
            guest.set_throttle_pct(0);
            break 'run Err(abort_and_reason(e, &mut s.chans[0].wire));
        }
        let end = PrecopyEnd {
            guest,
            s: &mut s,
            final_pace,
            round,
            max_throttle,
            rounds,
            timeline,
            log_start,
            log_start_s,
            warm,
            warm_end,
            warm_end_s,
            at_log,
            link,
            link_bytes,
            cfg,
        };
        if switch {
            postcopy_switch::run(end, pc_conns, connect, session)
        } else {
            stop_copy::run(end, hook, throttle_pct)
        }
    };
    stand_down(guest, pace);
    ended.map(|o| SourceOutcome { setup, ..o })
}

/// A further connection failed before ACCEPT was read: the destination's
/// REJECTED of the HEADER (it may have stopped listening after it) is the
/// better error where it sent one.
fn refusal_or(e: MigrateError, main: &mut WireWriter<BoxConn>, mem_size: u64) -> MigrateError {
    match read_opening_reply(main, mem_size) {
        Ok(
            r @ Record::Control {
                tag: tag::REJECTED, ..
            },
        ) => unexpected_reply(r, "ACCEPT"),
        _ => e,
    }
}

/// Checks the settings and the guest's shape before anything starts.
///
/// # Errors
/// [`MigrateError::Setup`] naming what is wrong.
fn check_run<G: SourceGuest>(guest: &G, cfg: &SourceConfig) -> Result<GuestShape, MigrateError> {
    config::validate(cfg)?;
    let shape = guest.shape();
    config::validate_shape(&shape)?;
    if cfg.postcopy != Postcopy::Off && !guest.supports_postcopy() {
        return Err(MigrateError::Setup(
            "post-copy: this guest cannot check a post-copy destination's memory".into(),
        ));
    }
    Ok(shape)
}

/// The migration ended (the guest went on at the destination, or stays
/// here): lifts the throttle, gives the vCPUs their pace from before the
/// run, and stops dirty logging, so that a guest that stays here runs as
/// before and a later migration can start logging afresh.
fn stand_down<G: SourceGuest>(guest: &G, pace: u64) {
    guest.set_throttle_ns(0);
    guest.set_throttle_pct(0);
    if guest.pace() != pace {
        guest.set_pace(pace);
    }
    if let Err(e) = guest.vm().disable_dirty_logging() {
        eprintln!("source: stopping dirty logging after the migration: {e}");
    }
}

/// The link figure before the migration (no guest, no checksum): bytes
/// sent and bytes per second. Without [`SourceConfig::link_probe`] the
/// probe is empty (the destination still answers it) and both are 0.
///
/// # Errors
/// Sending or the destination's reply failed.
fn probe_link<V: SessionVm>(
    s: &mut Sender<'_, V>,
    cfg: &SourceConfig,
    mem_size: u64,
) -> Result<(u64, f64), MigrateError> {
    if !cfg.link_probe {
        s.probe(0)?;
        return Ok((0, 0.0));
    }
    let (link_bytes, link_time) = s.probe(mem_size)?;
    let link = link_bytes as f64 / link_time.as_secs_f64().max(1e-9);
    if cfg.progress.is_on() {
        cfg.progress.line(&format!(
            "{}link: {:.1} MiB in {:.1} ms at {:.1} MiB/s over {} channel(s) (no guest, no checksum)",
            cfg.label,
            link_bytes as f64 / MIB,
            link_time.as_secs_f64() * 1e3,
            link / MIB,
            cfg.channels
        ));
    }
    Ok((link_bytes, link))
}

/// The main connection (header sent, ACCEPT read), the further data
/// channels joined to its session, and post-copy's request and answer
/// connections after them when post-copy is on.
type Connected = ([u8; SESSION_LEN], Vec<Chan>, Vec<WireWriter<BoxConn>>);

/// Opens and joins every connection the run needs: the main one and its
/// HEADER, then the others while the destination answers, each JOINed
/// once ACCEPT gave the session id.
///
/// # Errors
/// Connecting or the handshake failed, or the destination did not accept.
fn connect_channels<G: SourceGuest>(
    cfg: &SourceConfig,
    guest: &G,
    connect: &mut Connect<'_>,
) -> Result<Connected, MigrateError> {
    let shape = guest.shape();
    let header = Header {
        mem_size: shape.mem_size,
        slots: shape.slots,
        gpa_base: guest.vm().gpa_base(),
        vcpus: shape.vcpus,
        channels: cfg.channels,
        backing: shape.backing,
        verify_full: cfg.verify_full,
        postcopy: cfg.postcopy != Postcopy::Off,
        format: shape.format,
        image: cfg.image,
    };
    let main = connect(0)?;
    let mut main = WireWriter::new(main, &header)?;
    main.set_compression(cfg.compression);
    main.flush()?;
    // The further connections (their TCP, TLS and key exchange) open
    // while the destination checks the HEADER and answers: only their
    // JOINs wait for ACCEPT's session id. Post-copy's request and answer
    // connections come after the data channels.
    let mut numbers: Vec<u16> = (1..cfg.channels).collect();
    if cfg.postcopy != Postcopy::Off {
        numbers.extend([cfg.channels, cfg.channels + 1]);
    }
    let mut further = Vec::with_capacity(numbers.len());
    for &c in &numbers {
        match connect(c) {
            Ok(conn) => further.push((c, conn)),
            Err(e) => return Err(refusal_or(e, &mut main, shape.mem_size)),
        }
    }
    let session = match read_opening_reply(&mut main, shape.mem_size)? {
        Record::Control {
            tag: tag::ACCEPT,
            body,
            at_byte,
        } => {
            let mut d = Dec::new(&body, "ACCEPT", at_byte);
            let mut s = [0u8; SESSION_LEN];
            s.copy_from_slice(d.bytes(SESSION_LEN)?);
            d.finish()?;
            s
        }
        other => return Err(unexpected_reply(other, "ACCEPT")),
    };
    let mut chans = vec![Chan::new(main)];
    let mut pc_conns = Vec::new();
    for (c, conn) in further {
        let mut w = WireWriter::join(conn, &session, c)?;
        w.set_compression(cfg.compression);
        if c < cfg.channels {
            chans.push(Chan::new(w));
        } else {
            pc_conns.push(w);
        }
    }
    Ok((session, chans, pc_conns))
}
