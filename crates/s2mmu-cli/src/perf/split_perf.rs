//! `s2mmu split-perf`: the seed-000 experiment ("Optimize S2 page splitting").
//!
//! A slot (1 GiB by default) is mapped three ways: already split to pages,
//! by level-2 blocks (2 MiB with 4K pages: THP-backed memory), and by level-1
//! blocks (1 GiB: hugetlb). The whole range is split with each walk policy in
//! the same process, interleaved, several times; each row reports the median
//! time, the entries the walker read and the tables allocated. The policies
//! are the full walk (mainline), the RFC's skip returns ("v1") and the
//! series that replaced them with a walker flag that skips the last level
//! ("v2", `KVM_PGTABLE_WALK_SKIP_LEVEL3`).
//!
//! The `clear_*` cases replay what the engine's `KVM_CLEAR_DIRTY_LOG` does
//! to the table with manual protect and initially-set bitmaps (the only
//! CLEAR that splits, as in KVM): per 64-page bitmap word, split that range
//! and write-protect it, the page cache topped up once per lock chunk. The
//! write-protect walk is the same for every policy; only the split walk
//! differs (the `entries` column counts the split walk's reads only). A floor is measured too: writing the new last-level tables with
//! plain stores, the least work any split of that backing must do.

use crate::perf::dirty_log_perf::FormatArg;
use crate::progress::Progress;
use crate::report::Report;
use s2mmu::format::arm64::{Arm64Stage2, Granule};
use s2mmu::{HostMmOps, PteFormat};
use s2mmu_bench::split::{cases, measure, POLICIES};
use s2mmu_cli::vm_format::WithFormat;
use s2mmu_vm::KnownFormat;
use serde_json::json;

mod params;
mod report;

pub use params::Params;

/// Runs `split-perf` from the command line.
///
/// # Errors
/// A message naming what failed.
pub fn main(p: Params) -> Result<(), String> {
    let r = run(&p, !p.quiet)?;
    crate::report::emit(&r, p.json);
    Ok(())
}

/// The format for `--granule`, once `--mem` and `--runs` are checked
/// against it and against the host's memory, before anything is allocated.
///
/// # Errors
/// A message naming the flag and its limit.
fn check<F: PteFormat>(p: &Params, fmt: F) -> Result<F, String> {
    s2mmu_bench::split::check(&fmt, p.size, p.runs)?;
    Ok(fmt)
}

/// Runs the benchmark and returns its report.
///
/// # Errors
/// A message naming what failed (bad size, allocation failure).
pub fn run(p: &Params, progress: bool) -> Result<Report, String> {
    match (p.format, p.granule) {
        (format, Granule::K4) => format.with(SplitOn { p, progress }),
        // The other granules are arm64's.
        (FormatArg::Arm64, granule) => {
            let fmt = Arm64Stage2::new(granule, 48).map_err(|e| e.to_string())?;
            run_on(p, fmt, progress)
        }
        (format, granule) => Err(format!(
            "--format {} has 4 KiB pages only: not with --granule {granule:?}",
            format.name()
        )),
    }
}

/// [`run_on`] the format type [`FormatArg::with`] gives, 4 KiB pages and
/// 48 address bits.
struct SplitOn<'a> {
    p: &'a Params,
    progress: bool,
}

impl WithFormat for SplitOn<'_> {
    type Output = Result<Report, String>;
    fn call<F: KnownFormat>(self) -> Result<Report, String> {
        run_on(
            self.p,
            F::for_vm(48).map_err(|e| e.to_string())?,
            self.progress,
        )
    }
}

fn run_on<F: PteFormat>(p: &Params, fmt: F, progress: bool) -> Result<Report, String> {
    let fmt = check(p, fmt)?;
    let mm = HostMmOps::new(fmt.page_size() as usize).map_err(|e| e.to_string())?;
    let mut report = Report::new(
        "split-perf",
        json!({
            "size_bytes": p.size,
            "runs": p.runs,
            "granule_bytes": fmt.page_size(),
            "format": p.format.name(),
            "ipa_bits": 48,
            "policies": POLICIES.iter().map(|x| x.name()).collect::<Vec<_>>(),
            "versions": {"skip": "v1 (RFC skip returns)", "no_last_level_flag": "v2 (skip-level walker flag)"},
        }),
    );
    let all = cases(&fmt);
    let steps = (all.len() as u64).saturating_mul(p.runs as u64) + 1;
    let bar = Progress::new("split-perf", steps, progress);
    let mut rows = Vec::new();
    for case in &all {
        bar.message(&case.name);
        let samples = measure::case(fmt.clone(), &mm, p.size, p.runs, case, &bar)?;
        rows.extend(report::case_rows(&mut report, case, &samples));
    }
    // Floor: write the last-level tables a level-2-backed split creates.
    bar.message("store floor");
    let floor = measure::store_floor(&fmt, &mm, p.size, p.runs)?;
    drop(bar);
    report::finish(&mut report, p, &fmt, &rows, &floor);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(size: &str, runs: usize) -> Params {
        Params {
            size: crate::report::parse_size(size).unwrap(),
            runs,
            granule: Granule::K16,
            format: FormatArg::Arm64,
            json: true,
            quiet: true,
        }
    }

    #[test]
    fn every_case_has_the_three_policies_and_the_v2_comparisons() {
        let r = run(&params("64M", 1), false).unwrap().to_json();
        let results = r["results"].as_array().unwrap();
        let entries = |case: &str, pol: &str| {
            results
                .iter()
                .find(|x| x["case"] == case && x["policy"] == pol)
                .unwrap_or_else(|| panic!("no row {case}/{pol}"))["entries_visited"]
                .as_u64()
                .unwrap()
        };
        for case in [
            "already_16k",
            "blocks_32m",
            "clear_already_16k",
            "clear_blocks_32m",
        ] {
            let full = entries(case, "full_walk");
            let v1 = entries(case, "skip");
            let v2 = entries(case, "no_last_level_flag");
            assert!(v2 <= v1 && v1 < full, "{case}: {full} {v1} {v2}");
        }
        let cmp = r["comparisons"].as_array().unwrap();
        for case in [
            "already_16k_v2",
            "already_16k_v2_vs_v1",
            "clear_blocks_32m_v2_vs_v1",
        ] {
            assert!(
                cmp.iter().any(|c| c["case"] == case),
                "no comparison {case}"
            );
        }
        assert!(r["results"][0]["runs"].as_u64() == Some(1));
    }

    #[test]
    fn ept_runs_with_4k_pages_only() {
        let p = Params {
            format: FormatArg::Ept,
            ..params("1G", 1)
        };
        let e = run(&p, false).err().unwrap();
        assert!(e.contains("--format ept"), "{e}");
        // 1 GiB is no whole number of EPT's largest block here either.
        let p = Params {
            format: FormatArg::Ept,
            granule: Granule::K4,
            ..params("512M", 1)
        };
        let e = run(&p, false).err().unwrap();
        assert!(e.contains("--mem"), "{e}");
    }

    #[test]
    fn a_size_that_is_no_whole_block_is_refused() {
        let e = run(&params("48M", 1), false).err().unwrap();
        assert!(e.contains("--mem"), "{e}");
        let e = run(&params("64M", 0), false).err().unwrap();
        assert!(e.contains("--runs"), "{e}");
    }

    #[test]
    fn a_size_beyond_the_hosts_memory_is_refused_before_allocating() {
        // 255 TiB split to 16K pages: 128 GiB of last-level tables alone.
        let p = params("255T", 1);
        let need = (255u64 << 40) / (16 << 10) * 8 * 4;
        let fmt = Arm64Stage2::new(p.granule, 48).unwrap();
        match crate::limits::available_memory() {
            Some(have) if have < need => {
                let e = check(&p, fmt).err().unwrap();
                assert!(e.starts_with("--mem 255TiB: needs about"), "{e}");
            }
            // A host with the memory: the check lets it through.
            _ => assert!(check(&p, fmt).is_ok()),
        }
    }
}
