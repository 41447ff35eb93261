//! `--dirty` and `--harvest`: the one place a dirty mode's name on the
//! command line becomes the engine's [`DirtyMode`] (the workspace's one
//! dirty-mode type). The names are the engine's own
//! ([`DirtyMode::NAMES`], parsed by its `FromStr`), so a mode the engine
//! gains is offered here, by `dirty-log-perf` and `migrate` alike, without
//! a change to this file.

use s2mmu::mmu::DirtyMode;

/// A dirty mode's name that the command does not take: what was given and
/// the names it takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirtyModeArgError {
    /// The text given.
    pub given: String,
    /// Every name the command takes.
    pub accepted: Vec<&'static str>,
    /// Why the engine's parser refused it, or what the command lacks.
    pub why: String,
}

impl std::fmt::Display for DirtyModeArgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?}: {}; one of {}",
            self.given,
            self.why,
            self.accepted.join(", ")
        )
    }
}

impl std::error::Error for DirtyModeArgError {}

/// Parses one dirty mode: `wp` (or `manual`, or `bitmap`), `ring` (4096
/// entries per vCPU), `ring:N`, `hw`, `hw-blocks` or `pml`. Bitmap modes come with
/// manual protect and bitmaps that start clear; a command that has flags
/// for those applies them with [`DirtyMode::with_protect`].
///
/// # Errors
/// [`DirtyModeArgError`] naming the value and every mode.
pub fn parse_dirty_mode(s: &str) -> Result<DirtyMode, DirtyModeArgError> {
    let s = if s == "manual" { "wp" } else { s };
    s.parse()
        .map_err(|e: s2mmu::mmu::ParseDirtyModeError| DirtyModeArgError {
            given: s.to_owned(),
            accepted: DirtyMode::NAMES.to_vec(),
            why: e.to_string(),
        })
}

/// Every name `--dirty` takes where logging may be off: `off`, `manual`
/// (the same mode as `wp`, named for its manual protect: GET copies, CLEAR
/// protects) and the engine's [`DirtyMode::NAMES`].
pub const NAMES: [&str; 7] = ["off", "wp", "manual", "ring[:N]", "hw", "hw-blocks", "pml"];

/// `--dirty` where logging may be off: `off` (`None`) or
/// [`parse_dirty_mode`]'s names, with the engine's meanings. A command
/// refuses by name the modes it cannot run.
///
/// # Errors
/// [`DirtyModeArgError`] naming the value and [`NAMES`].
pub fn parse_dirty_or_off(s: &str) -> Result<Option<DirtyMode>, DirtyModeArgError> {
    match s {
        "off" => Ok(None),
        _ => parse_dirty_mode(s)
            .map(Some)
            .map_err(|e| DirtyModeArgError {
                accepted: NAMES.to_vec(),
                ..e
            }),
    }
}

/// The name [`parse_dirty_or_off`] takes for `mode`: `off`, else the
/// engine's name (`ring:N` for a ring).
pub fn dirty_name(mode: Option<DirtyMode>) -> String {
    match mode {
        None => "off".into(),
        Some(DirtyMode::Ring { entries }) => format!("ring:{entries}"),
        Some(m) => m.name().into(),
    }
}

/// Modes to run side by side: a comma-separated list of
/// [`parse_dirty_mode`]'s names, or `all` (wp, hw and pml); each mode
/// once, in the order given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirtyModes(pub Vec<DirtyMode>);

/// The modes `all` stands for: write protection, hardware dirty state
/// and PML.
pub const ALL: [DirtyMode; 3] = [DirtyMode::WP, DirtyMode::HW, DirtyMode::PML];

/// Parses [`DirtyModes`].
///
/// # Errors
/// As [`parse_dirty_mode`] for the first value that is not a mode; an
/// empty list.
pub fn parse_dirty_modes(s: &str) -> Result<DirtyModes, String> {
    let mut v: Vec<DirtyMode> = Vec::new();
    for name in s.split(',') {
        let add = match name {
            "all" => ALL.to_vec(),
            _ => vec![parse_dirty_mode(name).map_err(|e| e.to_string())?],
        };
        for m in add {
            if !v.contains(&m) {
                v.push(m);
            }
        }
    }
    if v.is_empty() {
        return Err("no dirty mode given".into());
    }
    Ok(DirtyModes(v))
}
