//! `--dirty` and `--harvest`: the one place a dirty mode's name on the
//! command line becomes the engine's [`DirtyMode`] (the workspace's one
//! dirty-mode type). The names are the engine's own
//! ([`DirtyMode::NAMES`], parsed by its `FromStr`), so a mode the engine
//! gains is offered here, by `dirty-log-perf` and `migrate` alike, without
//! a change to this file.

use s2mmu::mmu::{DirtyMode, HwDirtyBlocks, Protect};
use s2mmu_arm64::linux::dirty as linux;

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

/// Parses one dirty mode: `wp` (or `bitmap`), `ring` (4096 entries per
/// vCPU), `ring:N`, `hw`, `hw-blocks` or `pml`. Bitmap modes come with
/// manual protect and bitmaps that start clear; a command that has flags
/// for those applies them with [`DirtyMode::with_protect`].
///
/// # Errors
/// [`DirtyModeArgError`] naming the value and every mode.
pub fn parse_dirty_mode(s: &str) -> Result<DirtyMode, DirtyModeArgError> {
    s.parse()
        .map_err(|e: s2mmu::mmu::ParseDirtyModeError| DirtyModeArgError {
            given: s.to_owned(),
            accepted: DirtyMode::NAMES.to_vec(),
            why: e.to_string(),
        })
}

/// The names `s2mmu linux --dirty` takes: no logging, then
/// [`linux_dirty_name`] of each mode the Linux harvester runs.
pub const LINUX_NAMES: [&str; 5] = ["off", "wp", "manual", "ring", "hw"];

/// `s2mmu linux --dirty`: `off` (no logging: `None`), `manual` (the
/// engine's `wp`: GET then CLEAR), or the engine's `wp`, `ring`,
/// `ring:N` or `hw` with GET re-protecting (`KVM_GET_DIRTY_LOG` alone),
/// as the Linux harvester ran them before it took the engine's type;
/// `ring` without a size has the harvester's [`linux::RING_ENTRIES`].
/// `hw-blocks` and `pml` are refused: no Linux run checks them on QEMU's
/// model (QEMU 7.2 has no FEAT_HDBSS).
///
/// # Errors
/// [`DirtyModeArgError`] naming the value and [`LINUX_NAMES`].
pub fn parse_linux_dirty(s: &str) -> Result<Option<DirtyMode>, DirtyModeArgError> {
    let refuse = |why: &str| DirtyModeArgError {
        given: s.to_owned(),
        accepted: LINUX_NAMES.to_vec(),
        why: why.to_owned(),
    };
    let mode = match s {
        "off" => return Ok(None),
        "manual" => return Ok(Some(linux::MANUAL)),
        "ring" => linux::RING,
        _ => parse_dirty_mode(s)
            .map_err(|_| refuse("no such mode (ring:N takes a power of two, 256..=65536)"))?,
    };
    let logs_blocks = DirtyMode::Hardware {
        protect: Protect::OnGet,
        blocks: HwDirtyBlocks::LogWholeBlocks,
    };
    if mode.pml() || mode.with_protect(Protect::OnGet) == logs_blocks {
        return Err(refuse("not a mode `linux` runs"));
    }
    Ok(Some(mode.with_protect(Protect::OnGet)))
}

/// The name [`parse_linux_dirty`] takes for `mode`: `off`, `manual` for a
/// write-protection mode with manual protect, else the engine's name
/// (`ring:N` for a ring of other than [`linux::RING_ENTRIES`]).
pub fn linux_dirty_name(mode: Option<DirtyMode>) -> String {
    match mode {
        None => "off".into(),
        Some(m) if m.name() == "wp" && m.manual_protect() => "manual".into(),
        Some(DirtyMode::Ring { entries }) if entries != linux::RING_ENTRIES => {
            format!("ring:{entries}")
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_engine_mode_parses_by_its_own_name() {
        for name in DirtyMode::NAMES {
            let m = parse_dirty_mode(name).unwrap();
            assert_eq!(m.name(), name);
        }
        assert_eq!(
            parse_dirty_mode("hw-blocks"),
            Ok(DirtyMode::Hardware {
                protect: Protect::MANUAL,
                blocks: HwDirtyBlocks::LogWholeBlocks
            })
        );
        assert_eq!(
            parse_dirty_mode("ring:1024"),
            Ok(DirtyMode::Ring { entries: 1024 })
        );
    }

    #[test]
    fn lists_expand_all_and_drop_repeats_and_bad_names_are_named() {
        assert_eq!(parse_dirty_modes("all,wp").unwrap().0, ALL.to_vec());
        assert_eq!(
            parse_dirty_modes("pml,hw-blocks,pml").unwrap().0,
            vec![DirtyMode::PML, DirtyMode::HW_BLOCKS]
        );
        let e = parse_dirty_modes("wp,dbm").unwrap_err();
        assert!(e.contains("\"dbm\"") && e.contains("hw-blocks"), "{e}");
        assert!(parse_dirty_mode("ring:x").is_err());
        assert!(parse_dirty_modes("").is_err());
    }

    #[test]
    fn linux_names_round_trip_and_bad_names_are_named() {
        for name in LINUX_NAMES.into_iter().chain(["ring:1024"]) {
            let mode = parse_linux_dirty(name).unwrap();
            assert_eq!(linux_dirty_name(mode), name);
        }
        assert_eq!(parse_linux_dirty("off"), Ok(None));
        assert_eq!(parse_linux_dirty("manual"), Ok(Some(DirtyMode::WP)));
        assert_eq!(
            parse_linux_dirty("wp"),
            Ok(Some(DirtyMode::Bitmap {
                protect: Protect::OnGet
            }))
        );
        assert_eq!(parse_linux_dirty("ring"), Ok(Some(linux::RING)));
        assert_eq!(parse_linux_dirty("hw"), Ok(Some(linux::HW)));
        for bad in ["dbm", "pml", "hw-blocks", "ring:x"] {
            let e = parse_linux_dirty(bad).unwrap_err();
            assert_eq!(e.given, bad);
            assert_eq!(e.accepted, LINUX_NAMES.to_vec());
            let text = e.to_string();
            assert!(
                text.contains(&format!("{bad:?}")) && text.contains("manual"),
                "{text}"
            );
        }
    }
}
