//! Both ends of one migration in this process: the destination serves a
//! listener on a thread of its own while this thread runs the source into
//! it. What an embedder needs to move a guest between two VMs it hosts
//! (and what the simulated guest's, the Linux guest's and the tests'
//! in-process runs share).

use super::dest::{serve_with, DestConfig, DestFactory, DestOutcome};
use super::guest::SourceGuest;
use super::source::{run_source, SourceConfig, SourceOutcome};
use crate::stream_error::MigrateError;
use crate::transport::{self, Listener, NetConfig};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What each end of [`run_both_ends`] returned.
#[derive(Debug)]
pub struct BothEnds {
    /// The source's outcome (or why it failed).
    pub source: Result<SourceOutcome, MigrateError>,
    /// The destination's outcome (or why it failed; a destination thread
    /// that panicked is [`MigrateError::Setup`]).
    pub dest: Result<DestOutcome, MigrateError>,
}

/// Migrates `guest` (already running) into a guest `factory` builds: the
/// destination serves `listener` on a thread named `thread`, and the
/// source connects each channel to the listener's address, secured as
/// `net` says. A source that fails stops the destination's wait for it
/// (through `dest.stop`), so both ends always return.
///
/// # Errors
/// [`MigrateError::Io`] when the destination's thread cannot start
/// (nothing has run then). Each end's own failure is in [`BothEnds`].
pub fn run_both_ends<G, D>(
    listener: Box<dyn Listener>,
    factory: Arc<D>,
    guest: &G,
    source: &SourceConfig,
    dest: &DestConfig,
    net: &NetConfig,
) -> Result<BothEnds, MigrateError>
where
    G: SourceGuest,
    D: DestFactory + Send + 'static,
{
    let addr = listener.local();
    let (dcfg, dnet) = (dest.clone(), net.clone());
    let served = std::thread::Builder::new()
        .name("migrate-dest".into())
        .spawn(move || serve_with(&*listener, &*factory, &dcfg, &dnet))
        .map_err(|e| MigrateError::io("starting the destination thread", &e))?;
    let src = run_source(guest, source, &mut |_| {
        transport::client(transport::connect(&addr, net)?, net)
    });
    if src.is_err() {
        // A destination still waiting for the source's first connection
        // (one that fails before authenticating never ends the wait).
        dest.stop.store(true, Ordering::SeqCst);
    }
    let dst = served.join().unwrap_or_else(|_| {
        Err(MigrateError::Setup(
            "the destination thread panicked".into(),
        ))
    });
    Ok(BothEnds {
        source: src,
        dest: dst,
    })
}
