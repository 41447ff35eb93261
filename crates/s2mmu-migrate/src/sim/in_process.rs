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
use crate::transport::{self, Listener, NetConfig};
use s2mmu::format::WithFormat;
use s2mmu_vm::KnownFormat;
use std::sync::Arc;

/// Runs `run` from a source in this thread to a destination thread
/// configured by `dest`, over loopback TCP secured as `net` says: both
/// ends through [`run_both_ends`].
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
        (Ok(s), Ok(d)) => Ok((s, d)),
        (Err(e), _) | (Ok(_), Err(e)) => Err(e),
    }
}
