//! The session's progress callback: the caller decides where lines go (a
//! terminal bar, stderr, nowhere); the session only says what happened.

use std::fmt;
use std::sync::Arc;

/// What the session reports as it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressEvent<'a> {
    /// A line of text (the link, a round, the resume).
    Line(&'a str),
    /// One step done (one pre-copy round).
    Step,
}

type Sink = dyn Fn(ProgressEvent<'_>) + Send + Sync;

/// Where a run's progress goes: a callback, or nowhere.
#[derive(Clone, Default)]
pub struct Progress {
    sink: Option<Arc<Sink>>,
}

impl Progress {
    /// Progress to nowhere (no line is even formatted).
    pub fn off() -> Self {
        Progress { sink: None }
    }

    /// Progress to `f`.
    pub fn to(f: impl Fn(ProgressEvent<'_>) + Send + Sync + 'static) -> Self {
        Progress {
            sink: Some(Arc::new(f)),
        }
    }

    /// Whether anything listens (callers format lines only then).
    pub fn is_on(&self) -> bool {
        self.sink.is_some()
    }

    /// Reports a line.
    pub fn line(&self, text: &str) {
        if let Some(s) = &self.sink {
            s(ProgressEvent::Line(text));
        }
    }

    /// Reports a step.
    pub fn step(&self) {
        if let Some(s) = &self.sink {
            s(ProgressEvent::Step);
        }
    }
}

impl fmt::Debug for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_on() {
            "Progress(on)"
        } else {
            "Progress(off)"
        })
    }
}
