//! `--dirty` and `--harvest`: the one place a dirty mode's name on the
//! command line becomes the engine's [`DirtyMode`] (the workspace's one
//! dirty-mode type). The names are the engine's own
//! ([`DirtyMode::NAMES`], parsed by its `FromStr`), so a mode the engine
//! gains is offered here, by `dirty-log-perf` and `migrate` alike, without
//! a change to this file.

use s2mmu::mmu::DirtyMode;

/// Parses one dirty mode: `wp` (or `bitmap`), `ring` (4096 entries per
/// vCPU), `ring:N`, `hw`, `hw-blocks` or `pml`. Bitmap modes come with
/// manual protect and bitmaps that start clear; a command that has flags
/// for those applies them with [`DirtyMode::with_protect`].
///
/// # Errors
/// A message naming the value and every mode.
pub fn parse_dirty_mode(s: &str) -> Result<DirtyMode, String> {
    s.parse()
        .map_err(|e| format!("{s:?}: {e}; one of {}", DirtyMode::NAMES.join(", ")))
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
            _ => vec![parse_dirty_mode(name)?],
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
    use s2mmu::mmu::{HwDirtyBlocks, Protect};

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
}
