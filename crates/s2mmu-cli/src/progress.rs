//! Progress on stderr for runs longer than a couple of seconds.
//!
//! A [`Progress`] draws an `indicatif` bar on stderr only when it is asked
//! for (no `--quiet`) and stderr is a terminal. When stderr is a file or a
//! pipe it writes one line instead, when the run starts (what runs and how
//! many steps), so a log shows what a long run is doing and no run is
//! silent for long; `--quiet` turns that off too. Nothing goes to stdout:
//! a command's table or `--json` envelope is byte for byte the same. Every command
//! that runs for more than about two seconds can take one: create it with
//! the number of steps, [`Progress::step`] after each, and let it drop.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

/// A progress bar on stderr, or nothing when progress is off.
pub struct Progress {
    bar: Option<ProgressBar>,
    /// Enabled but stderr is no terminal: [`Progress::note`] writes lines.
    lines: bool,
}

impl Progress {
    /// A bar of `steps` steps labelled `what`, drawn when `enabled` and
    /// stderr is a terminal; one start line when `enabled` and stderr is
    /// not a terminal; otherwise nothing ([`Progress::off`]).
    pub fn new(what: &str, steps: u64, enabled: bool) -> Self {
        if !enabled {
            return Progress::off();
        }
        if !std::io::stderr().is_terminal() {
            eprintln!("{what}: running, {steps} step(s)");
            return Progress {
                bar: None,
                lines: true,
            };
        }
        let bar = ProgressBar::with_draw_target(Some(steps), ProgressDrawTarget::stderr());
        // The template is a constant: if indicatif ever refused it, the
        // default style is still a bar.
        if let Ok(style) = ProgressStyle::with_template(
            "{prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed}, ~{eta} left)",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(what.to_string());
        // Redraw on a timer so a long step still shows the time moving.
        bar.enable_steady_tick(Duration::from_millis(250));
        Progress {
            bar: Some(bar),
            lines: false,
        }
    }

    /// Lines on stderr and no bar, with no start line: what a library
    /// caller gets by default (the per-round lines of a migration).
    pub fn lines_only() -> Self {
        Progress {
            bar: None,
            lines: true,
        }
    }

    /// No bar: every call is a no-op.
    pub fn off() -> Self {
        Progress {
            bar: None,
            lines: false,
        }
    }

    /// Whether a bar is drawn.
    pub fn is_drawn(&self) -> bool {
        self.bar.is_some()
    }

    /// Names the step now running (shown after the count).
    pub fn message(&self, msg: &str) {
        if let Some(b) = &self.bar {
            b.set_message(msg.to_string());
        }
    }

    /// Names a long step worth a line in a log: the bar's message on a
    /// terminal, a line on stderr when stderr is not one, nothing when off.
    pub fn note(&self, msg: &str) {
        if self.lines {
            eprintln!("{msg}");
        }
        self.message(msg);
    }

    /// Whether anything is shown (a bar or lines): lets a caller skip
    /// formatting a line nobody sees.
    pub fn is_on(&self) -> bool {
        self.lines || self.bar.is_some()
    }

    /// A whole line of progress: above the bar on a terminal (the bar
    /// stays at the bottom), on stderr when stderr is not a terminal,
    /// nothing when off.
    pub fn line(&self, msg: &str) {
        match &self.bar {
            Some(b) => b.println(msg),
            None if self.lines => eprintln!("{msg}"),
            None => {}
        }
    }

    /// One step done.
    pub fn step(&self) {
        if let Some(b) = &self.bar {
            b.inc(1);
        }
    }
}

/// The bar the benchmark engines advance.
impl s2mmu_bench::Progress for Progress {
    fn step(&self) {
        Progress::step(self);
    }
    fn message(&self, msg: &str) {
        Progress::message(self, msg);
    }
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress")
            .field("bar", &self.bar.is_some())
            .field("lines", &self.lines)
            .finish()
    }
}

impl Drop for Progress {
    /// Clears the bar so the command's own output starts on a clean line.
    fn drop(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// The engines' [`s2mmu_bench::Bars`]: a bar per phase, drawn when `enabled`.
pub fn bars(enabled: bool) -> impl Fn(&str, u64) -> Box<dyn s2mmu_bench::Progress> {
    move |what, steps| Box::new(Progress::new(what, steps, enabled))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disabled_progress_draws_nothing() {
        let p = Progress::new("x", 3, false);
        assert!(!p.is_drawn());
        p.message("m");
        p.line("l");
        p.step();
        assert!(!p.is_on());
        assert!(Progress::lines_only().is_on());
        assert!(!Progress::lines_only().is_drawn());
    }
}
