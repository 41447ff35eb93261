//! A whole migration of the simulated guest in one process: a destination
//! thread serving a loopback port and the source connecting to it, both
//! secured as the network settings say.

use super::source::{migrate_source, SimRun};
use crate::session::dest::{serve, DestConfig, DestOutcome};
use crate::session::source::SourceOutcome;
use crate::stream_error::MigrateError;
use crate::transport::{self, NetConfig};

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
    let src = migrate_source(run, &mut |_| {
        let s = transport::connect(&addr, net)?;
        transport::client(s, net)
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
