//! A failed migration's source: the session resumed its guest (or never
//! paused it) whenever the destination's guest did not run, and this
//! proves the guest went on before the failure is reported: the counter
//! printed its next step (every step once, in order: its running hash
//! checks what it wrote before), or any other guest printed a new line.
//! A guest the session kept paused on purpose (the memory split by
//! post-copy, or resumed on the destination) is left so.

use crate::console_watch::{begun_steps, steps, wait_for};
use crate::run_error::LinuxRunError;
use crate::session_source::LinuxSource;
use s2mmu_migrate::session::guest::SourceGuest;
use s2mmu_migrate::stream_error::MigrateError;

/// `error` of a migration of `src`'s guest (`counter`: its program prints
/// the counter's steps, as `counter` and `fill` do), after it: when the guest runs
/// on here, [`LinuxRunError::SourceResumed`] once it showed it went on, or
/// [`LinuxRunError::SourceStuck`] when it did not; `error` itself when the
/// session kept the guest paused (it must not run twice) or when the
/// source's own guest stopped (powered off, reset: nothing to resume, and
/// its stop is the failure's cause).
pub(crate) fn after_failure(
    counter: bool,
    src: &LinuxSource,
    error: LinuxRunError,
) -> LinuxRunError {
    if matches!(
        error,
        LinuxRunError::Session {
            error: MigrateError::SourceGuestStopped { .. },
            ..
        }
    ) {
        return error;
    }
    let text = {
        let a = src.vm().lock();
        if a.is_paused() {
            return error;
        }
        a.console().contents()
    };
    // The session's resume (a no-op on a guest never paused).
    src.vm().resume_vcpus();
    let a = src.vm().lock();
    let went_on = match counter {
        true => {
            let last = begun_steps(&text).last().copied().unwrap_or(0);
            wait_for(&a, "the source", |t| {
                steps(t).last().filter(|&&n| n > last).copied()
            })
            .and_then(|n| in_order(&a.console().contents()).map(|()| n))
            .map(|n| format!("its counter printed step {n}, every step once and in order"))
        }
        false => {
            let whole = text.rfind('\n').map_or(0, |i| i + 1);
            wait_for(&a, "the source", |t| {
                t.get(whole..)?
                    .split_inclusive('\n')
                    .find(|l| l.ends_with('\n') && !l.trim().is_empty())
                    .map(|l| l.trim().to_string())
            })
            .map(|l| format!("its guest printed {l:?}"))
        }
    };
    let error = Box::new(error);
    match went_on {
        Ok(went_on) => LinuxRunError::SourceResumed { error, went_on },
        Err(why) => LinuxRunError::SourceStuck {
            error,
            why: Box::new(why),
        },
    }
}

/// Every counter step on the console once and in order.
fn in_order(text: &str) -> Result<(), LinuxRunError> {
    let all = steps(text);
    if all.windows(2).any(|w| w[1] != w[0] + 1) {
        return Err(LinuxRunError::WentWrong(format!(
            "the source's counter steps after its resume: {all:?}"
        )));
    }
    Ok(())
}
