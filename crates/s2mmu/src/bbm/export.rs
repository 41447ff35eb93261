//! The monitor's events as data: handed to an embedder's sink in a
//! `no_std` build (`bbm-export`), and replayed into the checker on a host
//! (`bbm-trace`), so the rules are checked for an engine that runs where
//! no checker can (at EL2).

pub use super::event::{Event, Flush};

#[cfg(feature = "bbm-export")]
static SINK: core::sync::atomic::AtomicPtr<()> =
    core::sync::atomic::AtomicPtr::new(core::ptr::null_mut());

/// Installs `sink`: from now on every trace point of this build calls it
/// (on the CPU that runs the operation, inside the operation: it must not
/// call the engine). One sink for the whole program.
#[cfg(feature = "bbm-export")]
pub fn set_sink(sink: fn(&Event)) {
    SINK.store(sink as *mut (), core::sync::atomic::Ordering::Release);
}

/// Hands `e` to the sink, if one is installed.
#[cfg(feature = "bbm-export")]
#[inline(always)]
pub(crate) fn emit(e: &Event) {
    let p = SINK.load(core::sync::atomic::Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: the only non-null value ever stored is a `fn(&Event)`
        // (`set_sink`), and function pointers and data pointers have the
        // same size and representation on every target the engine builds
        // for.
        let f: fn(&Event) = unsafe { core::mem::transmute::<*mut (), fn(&Event)>(p) };
        f(e);
    }
}

/// Feeds `e` to this process's checker as if the engine had run it here;
/// `fmt` decodes the stored descriptors. Events must come in the order
/// they happened.
#[cfg(feature = "bbm-trace")]
pub fn replay<F: crate::format::PteFormat>(fmt: &F, e: &Event) {
    use super::checker;
    match *e {
        Event::Store {
            table,
            start,
            level,
            old,
            new,
        } => checker::store(table, fmt, start, level, old, new),
        Event::Invalidate { table, flush } => checker::invalidated(table, flush),
        Event::FreeTable { table, pa } => checker::free_tables(table, &[pa]),
        Event::ReportClean { table } => checker::report_clean(table),
        Event::Teardown { table, gone } => checker::teardown(table, gone),
    }
}
