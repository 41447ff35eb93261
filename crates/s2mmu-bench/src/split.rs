//! The engine of `s2mmu split-perf`: building a mapped slot and timing its
//! eager split.

mod bounds;
mod case;
pub mod measure;

pub use bounds::{check, MAX_SIZE};
pub use case::{Backing, Case, Mode, Sample, Table, POLICIES};

use crate::human_bytes;
use s2mmu::PteFormat;

/// The cases the format `fmt` has: a split of pages, of each block size it
/// maps, with cache top-ups, and the engine's CLEAR over each.
pub fn cases<F: PteFormat>(fmt: &F) -> Vec<Case> {
    let page = human_bytes(fmt.page_size())
        .to_lowercase()
        .replace("kib", "k");
    let mut v = vec![Case {
        name: format!("already_{page}"),
        backing: Backing::Pages,
        mode: Mode::Split,
    }];
    let mut blocks = Vec::new();
    if fmt.leaf_allowed(2) {
        let name = format!(
            "blocks_{}",
            human_bytes(fmt.granule(2)).to_lowercase().replace("ib", "")
        );
        blocks.push((name, Backing::Level2Blocks));
    }
    if fmt.leaf_allowed(1) {
        let name = format!(
            "block_{}",
            human_bytes(fmt.granule(1)).to_lowercase().replace("ib", "")
        );
        blocks.push((name, Backing::Level1Blocks));
    }
    for mode in [Mode::Split, Mode::SplitTopup] {
        for (name, backing) in &blocks {
            v.push(Case {
                name: if mode == Mode::SplitTopup {
                    format!("{name}_topup")
                } else {
                    name.clone()
                },
                backing: *backing,
                mode,
            });
        }
    }
    let clears: Vec<Case> = std::iter::once((format!("already_{page}"), Backing::Pages))
        .chain(blocks)
        .map(|(name, backing)| Case {
            name: format!("clear_{name}"),
            backing,
            mode: Mode::Clear,
        })
        .collect();
    v.extend(clears);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use s2mmu::format::arm64::{Arm64Stage2, Granule};
    use s2mmu::HostMmOps;

    #[test]
    fn a_case_refuses_bad_sizes_and_runs_before_it_allocates() {
        let fmt = Arm64Stage2::new(Granule::K4, 48).unwrap();
        let mm = HostMmOps::new(4096).unwrap();
        let case = &cases(&fmt)[0];
        let refused = |size: u64, runs: usize, says: &str| {
            let e = measure::case(fmt, &mm, size, runs, case, &crate::NoProgress)
                .err()
                .unwrap_or_default();
            assert!(e.contains(says), "{e:?} should name {says}");
            let e = measure::store_floor(&fmt, &mm, size, runs).expect_err("refused");
            assert!(e.contains(says), "{e:?} should name {says}");
        };
        refused(0, 1, "--mem");
        refused((1 << 30) + 4096, 1, "non-zero multiple");
        refused(MAX_SIZE + (1 << 30), 1, "at most");
        refused(1 << 30, 0, "--runs");
        assert!(check(&fmt, 1 << 30, 1).is_ok());
    }
}
