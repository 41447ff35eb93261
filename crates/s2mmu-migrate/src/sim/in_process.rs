//! A whole migration of the simulated guest in one process: a destination
//! thread serving a loopback port and the source connecting to it, both
//! secured as the network settings say.

use super::dest::SimDestConfig;
use super::source::{validate_run, SimRun, SimSource};
use crate::session::both_ends::{run_both_ends, BothEnds};
use crate::session::dest::DestOutcome;
use crate::session::guest::SourceGuest;
use crate::session::source::SourceOutcome;
use crate::stream_error::MigrateError;
use crate::transport::{self, Listener, NetConfig, PlainLink};
use s2mmu::format::WithFormat;
use s2mmu_vm::KnownFormat;
use std::sync::Arc;

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
/// configured by `dest`, over loopback TCP secured as `net` says: both
/// ends through [`run_both_ends`]; with the session's `link_probe`,
/// after plain TCP's figure between the same endpoints.
///
/// # Errors
/// The source's error when it failed (the destination's then follows from
/// it), otherwise the destination's.
pub fn migrate_in_process(
    run: &SimRun,
    dest: &SimDestConfig,
    net: &NetConfig,
) -> Result<(SourceOutcome, DestOutcome), MigrateError> {
    validate_run(run)?;
    let listener = transport::bind("127.0.0.1:0")?;
    // The honest link figure first, when asked for: plain TCP between the
    // same endpoints (loopback, the same socket settings and connection
    // count), nothing else in the path, back to back with the migration.
    let plain = run.session.link_probe.then(|| plain_link(run, net));
    /// The simulated source on its format's type.
    struct Source<'a>(
        Box<dyn Listener>,
        &'a SimRun,
        &'a SimDestConfig,
        &'a NetConfig,
    );
    impl WithFormat for Source<'_> {
        type Output = Result<BothEnds, MigrateError>;
        fn call<F: KnownFormat>(self) -> Self::Output {
            let Source(listener, run, dest, net) = self;
            let guest = SimSource::<F>::start(&run.guest, &run.session)?;
            dest.format.with(Dest(listener, &guest, run, dest, net))
        }
    }
    /// The simulated destination on its format's type.
    struct Dest<'a, G>(
        Box<dyn Listener>,
        &'a G,
        &'a SimRun,
        &'a SimDestConfig,
        &'a NetConfig,
    );
    impl<G: SourceGuest> WithFormat for Dest<'_, G> {
        type Output = Result<BothEnds, MigrateError>;
        fn call<F: KnownFormat>(self) -> Self::Output {
            let Dest(listener, guest, run, dest, net) = self;
            let factory = Arc::new(dest.factory::<F>());
            run_both_ends(listener, factory, guest, &run.session, &dest.dest, net)
        }
    }
    let both = run.guest.format.with(Source(listener, run, dest, net))?;
    match (both.source, both.dest) {
        (Ok(mut s), Ok(d)) => {
            s.plain_link = plain.and_then(Result::ok);
            Ok((s, d))
        }
        (Err(e), _) | (Ok(_), Err(e)) => Err(e),
    }
}
