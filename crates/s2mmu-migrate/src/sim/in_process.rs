//! A whole migration of the simulated guest in one process: a destination
//! thread serving a loopback port and the source connecting to it, both
//! secured as the network settings say.

use super::dest::serve;
use super::source::{migrate_source, SimRun};
use crate::session::dest::{DestConfig, DestOutcome};
use crate::session::source::SourceOutcome;
use crate::stream_error::MigrateError;
use crate::transport::{self, NetConfig, PlainLink};

const MIB: f64 = (1u64 << 20) as f64;

/// Plain TCP over loopback with the run's channel count and as many bytes
/// as the migration's own link probe sends.
fn plain_link(run: &SimRun, net: &NetConfig) -> Result<PlainLink, MigrateError> {
    let cfg = &run.session;
    let sink = transport::PlainSink::start("127.0.0.1:0", net.io_timeout)?;
    let l = transport::plain_tcp_link(
        sink.addr(),
        cfg.channels,
        run.guest.mem_size,
        net.io_timeout,
    )?;
    if cfg.progress.is_on() {
        cfg.progress.line(&format!(
            "{}plain TCP: {:.1} MiB in {:.1} ms at {:.1} MiB/s over {} connection(s) (no TLS, no framing, no checksum: what iperf3 measures)",
            cfg.label,
            l.bytes as f64 / MIB,
            l.elapsed.as_secs_f64() * 1e3,
            l.bytes_per_s() / MIB,
            l.channels
        ));
    }
    Ok(l)
}

/// Runs `run` from a source in this thread to a destination thread
/// configured by `dest`, over loopback TCP secured as `net` says.
///
/// # Errors
/// The source's error when it failed (the destination's then follows from
/// it), otherwise the destination's.
pub fn migrate_in_process(
    run: &SimRun,
    dest: &DestConfig,
    net: &NetConfig,
) -> Result<(SourceOutcome, DestOutcome), MigrateError> {
    let listener = transport::bind("127.0.0.1:0")?;
    let addr = listener.local();
    let (dcfg, dnet) = (dest.clone(), net.clone());
    let stop = dcfg.stop.clone();
    let dest_thread = std::thread::Builder::new()
        .name("migrate-dest".into())
        .spawn(move || serve(&*listener, &dcfg, &dnet))
        .map_err(|e| MigrateError::io("starting the destination thread", &e))?;
    // The honest link figure first: plain TCP between the same endpoints
    // (loopback, the same socket settings and connection count), nothing
    // else in the path, back to back with the migration.
    let plain = plain_link(run, net);
    let src = migrate_source(run, &mut |_| {
        let s = transport::connect(&addr, net)?;
        transport::client(s, net)
    })
    .map(|mut s| {
        s.plain_link = plain.ok();
        s
    });
    if src.is_err() {
        // A destination still waiting for the source's first connection
        // (the source failed before connecting): stop it. (A connection
        // would not: one that fails before authenticating never ends the
        // wait.)
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    let dst = dest_thread.join().unwrap_or_else(|_| {
        Err(MigrateError::Setup(
            "the destination thread panicked".into(),
        ))
    });
    match (src, dst) {
        (Ok(s), Ok(d)) => Ok((s, d)),
        (Err(e), _) | (Ok(_), Err(e)) => Err(e),
    }
}
