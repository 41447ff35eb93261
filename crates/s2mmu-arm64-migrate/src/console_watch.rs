//! Watching a Linux guest's console during a migration: the counter's
//! steps on it, the line a switch cut in two, and waiting for a line.

use crate::run_error::LinuxRunError;
use s2mmu_arm64::linux::migrate::LinuxVm;
use std::time::{Duration, Instant};

/// How long [`wait_for`] waits for a console line.
const WAIT_LIMIT: Duration = Duration::from_secs(900);

/// The counter's step numbers on a console (lines printed up to their
/// hash at least, so that each number is whole).
pub fn steps(text: &str) -> Vec<u64> {
    text.lines()
        .filter_map(|l| {
            let (n, _) = l.split("s2mmu-counter: n=").nth(1)?.split_once(" hash=")?;
            n.parse().ok()
        })
        .collect()
}

/// The counter steps whose lines began on a console: `n` of every
/// `s2mmu-counter: n=<n> ` (the number whole: a space follows it).
pub fn begun_steps(text: &str) -> Vec<u64> {
    text.split("s2mmu-counter: n=")
        .skip(1)
        .filter_map(|r| r.split_once(' ')?.0.parse().ok())
        .collect()
}

/// The end of a console's `text` after its last newline, `'\r'` dropped:
/// the start of a line the switch cut, whose end is the first line of the
/// other side's console. A counter step whose line was cut before its
/// number ended is whole on neither side, only in the two joined.
pub fn unfinished_line(text: &str) -> String {
    text.rsplit('\n').next().unwrap_or("").replace('\r', "")
}

/// Waits until `vm`'s console shows what `done` finds (its value).
///
/// # Errors
/// [`LinuxRunError::GuestCheck`] for a FAIL line of a guest program,
/// [`LinuxRunError::GuestStopped`], [`LinuxRunError::Timeout`] after
/// 900 s, each naming the machine `what`.
pub fn wait_for<T>(
    vm: &LinuxVm,
    what: &'static str,
    done: impl Fn(&str) -> Option<T>,
) -> Result<T, LinuxRunError> {
    let t = Instant::now();
    loop {
        let text = vm.console().contents();
        if let Some(l) = text.lines().find(|l| l.contains(": FAIL")) {
            return Err(LinuxRunError::GuestCheck {
                machine: what,
                line: l.to_string(),
            });
        }
        if let Some(v) = done(&text) {
            return Ok(v);
        }
        if let Some(r) = vm.stopped() {
            return Err(LinuxRunError::GuestStopped {
                machine: what,
                reason: format!("{r:?}"),
            });
        }
        if t.elapsed() > WAIT_LIMIT {
            return Err(LinuxRunError::Timeout {
                machine: what,
                limit: WAIT_LIMIT,
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
