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

use crate::dirty_log_perf::FormatArg;
use crate::report::{human, human_bytes, merge, paired_ratios, verdict, Report, Summary};
use s2mmu::format::arm64::{Arm64Stage2, Granule};
use s2mmu::format::ept::EptFormat;
use s2mmu::{HostMmOps, MapOptions, NoTlb, PageCache, PageTable, Prot, PteFormat, SplitPolicy};
use serde_json::json;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Options of `split-perf`.
#[derive(Clone, Debug, clap::Args)]
pub struct Params {
    /// Slot size (e.g. 1G, 512M).
    #[arg(long, default_value = "1G", value_parser = crate::report::parse_size)]
    pub size: u64,
    /// Repetitions per backing and policy.
    #[arg(long, default_value_t = 7)]
    pub runs: usize,
    /// Translation granule: 4k, 16k or 64k.
    #[arg(long, default_value = "4k", value_parser = parse_granule)]
    pub granule: Granule,
    /// The table's format: arm64 (the granule above) or x86 EPT (4-level,
    /// 4 KiB pages only).
    #[arg(long, value_enum, default_value = "arm64")]
    pub format: FormatArg,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

fn parse_granule(s: &str) -> Result<Granule, String> {
    let bytes = crate::report::parse_size(s)?;
    Granule::from_bytes(bytes).map_err(|e| e.to_string())
}

/// Runs `split-perf` from the command line.
///
/// # Errors
/// A message naming what failed.
pub fn main(p: Params) -> Result<(), String> {
    let r = run(&p, !p.json)?;
    crate::report::emit(&r, p.json);
    Ok(())
}

type Table<F> = PageTable<F, HostMmOps>;

/// How the slot is mapped before the split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backing {
    Pages,
    Level2Blocks,
    Level1Blocks,
}

const POLICIES: [SplitPolicy; 3] = [
    SplitPolicy::FullWalk,
    SplitPolicy::SkipReturns,
    SplitPolicy::NoLastLevelTables,
];

/// What is timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// One split of the whole slot, cache filled beforehand.
    Split,
    /// The split chunk by chunk with the cache top-ups timed too, as the
    /// seed's measurement of `kvm_mmu_split_huge_pages` does.
    SplitTopup,
    /// The engine's CLEAR: split and write-protect per 64-page word.
    Clear,
}

struct Case {
    name: String,
    backing: Backing,
    mode: Mode,
}

/// The engine's `Mmu::clear_dirty_log` on the table for an all-ones bitmap
/// with initially-set bitmaps: per 64-page word, split the word's range and
/// write-protect it; the cache is topped up before each lock chunk. Timed
/// whole, top-ups included (they are part of the ioctl).
fn clear_like_engine<F: PteFormat>(
    pt: &mut Table<F>,
    cache: &mut PageCache<HostMmOps>,
    base: u64,
    size: u64,
    policy: SplitPolicy,
) -> Result<(Duration, s2mmu::SplitStats), String> {
    let word = 64 * pt.format().page_size();
    let chunk = s2mmu::mmu::LOCK_CHUNK.min(size);
    let capacity = pt.split_capacity(chunk);
    let mut total = s2mmu::SplitStats {
        complete: true,
        ..Default::default()
    };
    let t0 = Instant::now();
    let mut c = base;
    while c < base + size {
        cache.top_up(capacity).map_err(|e| e.to_string())?;
        let mut a = c;
        while a < (c + chunk).min(base + size) {
            let st = pt
                .split(a, word, cache, policy)
                .map_err(|e| e.to_string())?;
            pt.wrprotect(a, word).map_err(|e| e.to_string())?;
            total.blocks_split += st.blocks_split;
            total.tables += st.tables;
            total.entries += st.entries;
            total.visits += st.visits;
            total.complete &= st.complete;
            a += word;
        }
        c += chunk;
    }
    Ok((t0.elapsed(), total))
}

/// Splits `[base, base + size)` chunk by chunk, topping the cache up before
/// each chunk as KVM's eager-split driver does between lock holds; the
/// top-ups are inside the timed region.
fn split_chunked<F: PteFormat>(
    pt: &mut Table<F>,
    cache: &mut PageCache<HostMmOps>,
    base: u64,
    size: u64,
    chunk: u64,
    policy: SplitPolicy,
) -> Result<(Duration, s2mmu::SplitStats), String> {
    let capacity = pt.split_capacity(chunk);
    let mut total = s2mmu::SplitStats {
        complete: true,
        ..Default::default()
    };
    let t0 = Instant::now();
    let mut a = base;
    while a < base + size {
        cache.top_up(capacity).map_err(|e| e.to_string())?;
        let st = pt
            .split(a, chunk, cache, policy)
            .map_err(|e| e.to_string())?;
        total.blocks_split += st.blocks_split;
        total.tables += st.tables;
        total.entries += st.entries;
        total.visits += st.visits;
        total.complete &= st.complete;
        a += chunk;
    }
    Ok((t0.elapsed(), total))
}

fn cases<F: PteFormat>(fmt: &F) -> Vec<Case> {
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

fn build<F: PteFormat + Copy>(
    fmt: F,
    mm: &HostMmOps,
    base: u64,
    size: u64,
    backing: Backing,
) -> Result<Table<F>, String> {
    let mut pt = PageTable::new(fmt, mm.clone(), Arc::new(NoTlb)).map_err(|e| e.to_string())?;
    let mut cache = PageCache::new(mm.clone());
    cache
        .top_up(pt.split_capacity(size) + 4)
        .map_err(|e| e.to_string())?;
    // The table maps the slot without touching guest memory: output
    // addresses only need the alignment of the backing.
    let pa = 0x40_0000_0000u64;
    let step = match backing {
        Backing::Pages | Backing::Level1Blocks => size,
        Backing::Level2Blocks => fmt.granule(2),
    };
    let opts = MapOptions {
        force_pages: backing == Backing::Pages,
    };
    let mut a = 0;
    while a < size {
        let n = step.min(size - a);
        pt.map(base + a, n, pa + a, Prot::RW, &mut cache, opts)
            .map_err(|e| e.to_string())?;
        a += n;
    }
    Ok(pt)
}

/// One measured split.
#[derive(Clone, Copy, Default)]
struct Sample {
    time: Duration,
    entries: u64,
    tables: u64,
    blocks: u64,
}

/// Runs the benchmark and returns its report.
///
/// # Errors
/// A message naming what failed (bad size, allocation failure).
pub fn run(p: &Params, progress: bool) -> Result<Report, String> {
    match p.format {
        FormatArg::Arm64 => {
            let fmt = Arm64Stage2::new(p.granule, 48).map_err(|e| e.to_string())?;
            run_on(p, fmt, progress)
        }
        FormatArg::Ept if p.granule != Granule::K4 => Err(format!(
            "--format ept has 4 KiB pages only: not with --granule {:?}",
            p.granule
        )),
        FormatArg::Ept => run_on(p, EptFormat::new(4).map_err(|e| e.to_string())?, progress),
    }
}

fn run_on<F: PteFormat + Copy>(p: &Params, fmt: F, progress: bool) -> Result<Report, String> {
    let top_block = if fmt.leaf_allowed(1) {
        fmt.granule(1)
    } else {
        fmt.granule(2)
    };
    if p.size == 0 || !p.size.is_multiple_of(top_block) {
        return Err(format!(
            "--size must be a non-zero multiple of {} (the largest block of this granule)",
            human_bytes(top_block)
        ));
    }
    if p.runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    let mm = HostMmOps::new(fmt.page_size() as usize).map_err(|e| e.to_string())?;
    let base = 1u64 << 40;
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
    let mut rows = Vec::new();
    for case in cases(&fmt) {
        let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); POLICIES.len()];
        // The already-split table does not change under a split, so build
        // it once (a CLEAR write-protects it: fresh tables there).
        let mut shared = if case.backing == Backing::Pages && case.mode != Mode::Clear {
            Some(build(fmt, &mm, base, p.size, case.backing)?)
        } else {
            None
        };
        let mut cache = PageCache::new(mm.clone());
        for run in 0..p.runs {
            // Rotate the order so no policy always runs first.
            for k in 0..POLICIES.len() {
                let pi = (k + run) % POLICIES.len();
                let mut fresh;
                let pt = match shared.as_mut() {
                    Some(pt) => pt,
                    None => {
                        fresh = build(fmt, &mm, base, p.size, case.backing)?;
                        &mut fresh
                    }
                };
                let (time, st) = match case.mode {
                    Mode::SplitTopup => {
                        cache.release_all();
                        split_chunked(pt, &mut cache, base, p.size, fmt.granule(2), POLICIES[pi])?
                    }
                    // The engine keeps its split cache across CLEARs.
                    Mode::Clear => clear_like_engine(pt, &mut cache, base, p.size, POLICIES[pi])?,
                    Mode::Split => {
                        cache
                            .top_up(pt.split_capacity(p.size))
                            .map_err(|e| e.to_string())?;
                        let t0 = Instant::now();
                        let st = pt
                            .split(base, p.size, &mut cache, POLICIES[pi])
                            .map_err(|e| e.to_string())?;
                        (t0.elapsed(), st)
                    }
                };
                if !st.complete {
                    return Err("split ran out of cache pages".into());
                }
                samples[pi].push(Sample {
                    time,
                    entries: st.entries,
                    tables: st.tables,
                    blocks: st.blocks_split,
                });
            }
            if progress {
                eprint!("\r{}: run {}/{}   ", case.name, run + 1, p.runs);
            }
        }
        if progress {
            eprint!("\r{:40}\r", "");
        }
        for (pi, policy) in POLICIES.iter().enumerate() {
            let s = &samples[pi];
            let times: Vec<Duration> = s.iter().map(|x| x.time).collect();
            let sum = Summary::of(&times);
            let last = s.last().copied().unwrap_or_default();
            report.result(
                &case.name,
                policy.name(),
                merge(
                    sum.json(),
                    json!({
                        "entries_visited": last.entries,
                        "tables_allocated": last.tables,
                        "blocks_split": last.blocks,
                    }),
                ),
            );
            rows.push(Row {
                name: case.name.clone(),
                policy: *policy,
                sum,
                last,
                secs: times.iter().map(Duration::as_secs_f64).collect(),
            });
        }
    }
    // Floor: write the last-level tables a level-2-backed split creates.
    let floor = store_floor(&fmt, &mm, p.size, p.runs)?;
    report.result(
        "store_floor",
        "plain_stores",
        merge(
            floor.json(),
            json!({"tables_written": p.size / fmt.granule(2), "entries_written": p.size / fmt.page_size()}),
        ),
    );
    let find = |name: &str, pol: SplitPolicy| {
        rows.iter()
            .find(|r| r.name == name && r.policy == pol)
            .map(|r| (r.sum, r.last, r.secs.clone()))
    };
    let mut lines = Vec::new();
    for case in cases(&fmt) {
        let (Some(full), Some(v1), Some(v2)) = (
            find(&case.name, SplitPolicy::FullWalk),
            find(&case.name, SplitPolicy::SkipReturns),
            find(&case.name, SplitPolicy::NoLastLevelTables),
        ) else {
            continue;
        };
        lines.extend(compare_case(&mut report, &case, full, v1, v2));
    }
    if let Some((skip2m, _, _)) = cases(&fmt)
        .iter()
        .find(|c| c.backing == Backing::Level2Blocks && c.mode == Mode::Split)
        .and_then(|c| find(&c.name, SplitPolicy::SkipReturns))
    {
        let ratio = skip2m.median.as_secs_f64() / floor.median.as_secs_f64();
        report.compare(
            "blocks_split_vs_floor",
            "median_ns",
            floor.median.as_nanos() as f64,
            skip2m.median.as_nanos() as f64,
        );
        lines.push(format!(
            "floor: writing {} new tables with plain stores takes {}; the level-2-block split takes {} = {:.2}x the floor  [target <= 3x: {}]",
            p.size / fmt.granule(2),
            human(floor.median),
            human(skip2m.median),
            ratio,
            verdict(ratio <= 3.0)
        ));
    }
    let text = render(p, &fmt, &rows, &lines);
    report.set_text(text);
    Ok(report)
}

/// One case measured under one policy.
struct Row {
    name: String,
    policy: SplitPolicy,
    sum: Summary,
    last: Sample,
    /// Each run's time in seconds, in run order (runs are paired: every
    /// run measures every policy).
    secs: Vec<f64>,
}

/// A row's median, last sample and per-run times.
type Measured = (Summary, Sample, Vec<f64>);

/// The comparisons of one case: v1 and v2 each against the full walk, and
/// v2 against v1 (JSON rows and the text lines).
fn compare_case(
    report: &mut Report,
    case: &Case,
    full: Measured,
    v1: Measured,
    v2: Measured,
) -> Vec<String> {
    let ns = |m: &Measured| m.0.median.as_nanos() as f64;
    let name = &case.name;
    let c1 = report.compare(name, "median_ns", ns(&full), ns(&v1));
    report.compare(
        name,
        "entries_visited",
        full.1.entries as f64,
        v1.1.entries as f64,
    );
    let c2 = report.compare(&format!("{name}_v2"), "median_ns", ns(&full), ns(&v2));
    report.compare(
        &format!("{name}_v2"),
        "entries_visited",
        full.1.entries as f64,
        v2.1.entries as f64,
    );
    let c21 = report.compare(&format!("{name}_v2_vs_v1"), "median_ns", ns(&v1), ns(&v2));
    let entries_ratio = full.1.entries as f64 / v1.1.entries.max(1) as f64;
    let (target, ok) = match case.backing {
        Backing::Pages => (
            "target >= 20x faster and >= 100x fewer entries",
            c1.speedup >= 20.0 && entries_ratio >= 100.0,
        ),
        _ => ("target >= 15 % faster", c1.improvement_pct >= 15.0),
    };
    let tail = match case.mode {
        Mode::SplitTopup => {
            "[cache top-ups timed too, as the seed measured; seed saw about -20 %]".to_string()
        }
        Mode::Clear => {
            "[CLEAR: split + write-protect per 64-page word; entries: the split walk's]".to_string()
        }
        Mode::Split => format!("[{target}: {}]", verdict(ok)),
    };
    let runs = full.0.runs.min(v1.0.runs).min(v2.0.runs);
    // v2/v1 run by run: the spread says whether a difference of medians is
    // more than run-to-run noise.
    let paired = paired_ratios(&v1.2, &v2.2);
    let spread = match (paired.first(), paired.last()) {
        (Some(lo), Some(hi)) => format!(
            "; v2/v1 per run {:+.1} % .. {:+.1} %",
            (lo - 1.0) * 100.0,
            (hi - 1.0) * 100.0
        ),
        _ => String::new(),
    };
    vec![
        format!(
            "{name:<22} v1 skip returns vs full walk: {:+.1} % time ({:.1}x faster), {entries_ratio:.0}x fewer entries  {tail}",
            -c1.improvement_pct, c1.speedup,
        ),
        format!(
            "{name:<22} v2 skip-level flag vs full walk: {:+.1} % time ({:.1}x faster); v2 vs v1: {:+.1} % time (medians of {runs} runs: full {}, v1 {}, v2 {}{spread})",
            -c2.improvement_pct,
            c2.speedup,
            -c21.improvement_pct,
            human(full.0.median),
            human(v1.0.median),
            human(v2.0.median),
        ),
    ]
}

/// Which version of seed 000 a policy is, for the table.
fn version(pol: SplitPolicy) -> &'static str {
    match pol {
        SplitPolicy::FullWalk => "--",
        SplitPolicy::SkipReturns => "v1",
        SplitPolicy::NoLastLevelTables => "v2",
    }
}

fn render<F: PteFormat>(p: &Params, fmt: &F, rows: &[Row], lines: &[String]) -> String {
    let mut s = format!(
        "split-perf: {} slot, {} pages, {} runs per policy ({} build)\n",
        human_bytes(p.size),
        human_bytes(fmt.page_size()),
        p.runs,
        if cfg!(debug_assertions) {
            "DEBUG"
        } else {
            "release"
        }
    );
    s += &format!(
        "{:<22} {:<22} {:>12} {:>12} {:>12} {:>10} {:>8} {:>8}\n",
        "backing", "policy", "median", "min", "max", "entries", "tables", "blocks"
    );
    for Row {
        name,
        policy: pol,
        sum,
        last,
        ..
    } in rows
    {
        s += &format!(
            "{:<22} {:<22} {:>12} {:>12} {:>12} {:>10} {:>8} {:>8}\n",
            name,
            format!("{} {}", version(*pol), pol.name()),
            human(sum.median),
            human(sum.min),
            human(sum.max),
            last.entries,
            last.tables,
            last.blocks
        );
    }
    for l in lines {
        s += l;
        s.push('\n');
    }
    s
}

/// Times writing the last-level tables that splitting `size` bytes of
/// level-2 blocks creates (one page per block, every entry a plain store of
/// a leaf), into pages already faulted in, as the split's cache pages are.
fn store_floor<F: PteFormat>(
    fmt: &F,
    mm: &HostMmOps,
    size: u64,
    runs: usize,
) -> Result<Summary, String> {
    use s2mmu::MmOps;
    let tables = (size / fmt.granule(2)) as usize;
    let pages: Vec<u64> = (0..tables)
        .map(|_| {
            mm.zalloc_page()
                .ok_or("out of memory for the floor's pages")
        })
        .collect::<Result<_, _>>()?;
    let entries = fmt.entries_per_table();
    let leaf = fmt
        .leaf_pte(0x40_0000_0000, fmt.last_level(), Prot::RW)
        .map_err(|e| e.to_string())?;
    let step = fmt.page_size();
    let mut times = Vec::new();
    // Three warm-up passes fault the pages in and warm the caches, as the
    // split's recycled cache pages are; then at least 20 measured passes.
    for pass in 0..runs.max(20) + 3 {
        let t0 = Instant::now();
        for (t, &pa) in pages.iter().enumerate() {
            // SAFETY: `pa` is a live page of `entries` u64s that only this
            // loop uses.
            let table = unsafe { std::slice::from_raw_parts_mut(mm.phys_to_virt(pa), entries) };
            fill(table, leaf + (t * entries) as u64 * step, step);
        }
        black_box(&pages);
        if pass >= 3 {
            times.push(t0.elapsed());
        }
    }
    for pa in pages {
        // SAFETY: allocated above, never linked into a table.
        unsafe { mm.free_page(pa) };
    }
    Ok(Summary::of(&times))
}

/// The floor's store loop: one leaf per entry, as a split writes them.
#[inline(never)]
fn fill(table: &mut [u64], first: u64, step: u64) {
    let mut leaf = first;
    for e in table.iter_mut() {
        *e = leaf;
        leaf = leaf.wrapping_add(step);
    }
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
        assert!(e.contains("--size"), "{e}");
    }

    #[test]
    fn a_size_that_is_no_whole_block_is_refused() {
        let e = run(&params("48M", 1), false).err().unwrap();
        assert!(e.contains("--size"), "{e}");
        let e = run(&params("64M", 0), false).err().unwrap();
        assert!(e.contains("--runs"), "{e}");
    }
}
