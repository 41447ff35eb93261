//! `s2mmu reproduce`: runs every seed's experiment with both policies side
//! by side and writes a report that puts the published figures next to the
//! ones measured on this machine, with plots (SVG and PNG files beside the report)
//! of seed 002's vCPU scaling and seed 004's comparison.

use crate::progress::Progress;
use crate::report::{host, Report};
use s2mmu_plot::write_svg_and_png;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

mod experiments;
mod plots;

/// Options of `reproduce`.
#[derive(Clone, Debug, clap::Args)]
pub struct Params {
    /// Where to write the Markdown report (plots go beside it, named after it; default: in the temporary directory).
    #[arg(long, default_value_t = std::env::temp_dir().join("s2mmu-reproduce.md").display().to_string())]
    pub out: String,
    /// Smaller sizes, for a quick look (about a third of the time).
    #[arg(long)]
    pub quick: bool,
    /// Skip the runs on the host's real KVM.
    #[arg(long)]
    pub no_kvm: bool,
    /// Print one JSON object (every experiment's envelope) instead of text.
    #[arg(long)]
    pub json: bool,
    /// No progress on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

/// The plot of experiment `seed`'s report, if it has one: written as
/// `<report stem>-seed-<seed>.svg` beside the report, and as the same name
/// with `.png`; returns the SVG file's name (relative to the report, for
/// the Markdown link).
fn write_plot(out: &Path, seed: &str, report: &Value) -> Result<Option<String>, String> {
    let stem = out
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("s2mmu-reproduce");
    let name = format!("{stem}-seed-{seed}.svg");
    let path: PathBuf = out.with_file_name(&name);
    let written = match seed {
        "002" => plots::vcpu_scaling(report).map(|c| write_svg_and_png(&c, &path)),
        "004" => plots::eager_vs_fault(report).map(|c| write_svg_and_png(&c, &path)),
        _ => None,
    };
    match written {
        None => Ok(None),
        Some(w) => w.map(|_| Some(name)),
    }
}

/// The report's opening: the host and build the figures come from.
fn preamble() -> String {
    let mut md = String::new();
    let h = host();
    let _ = writeln!(md, "# s2mmu: the seeds reproduced\n");
    let _ = writeln!(
        md,
        "Host: {} logical CPUs, kernel {}, CPU {}, s2mmu {} ({}), {} build.\n",
        h["logical_cpus"],
        h["kernel_release"].as_str().unwrap_or("?"),
        h["cpu_model"].as_str().unwrap_or("?"),
        h["engine_version"].as_str().unwrap_or("?"),
        h["git_revision"].as_str().unwrap_or("no git revision"),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    md
}

/// Runs `reproduce` from the command line.
///
/// # Errors
/// A message naming the experiment that failed; the others still run and
/// the report says which failed.
pub fn main(p: Params) -> Result<(), String> {
    let out = Path::new(&p.out);
    // The experiments take minutes: find out first that the report can be
    // written, not after them.
    std::fs::write(out, "").map_err(|e| format!("--out {}: cannot write: {e}", p.out))?;
    let mut md = preamble();
    let mut all = Vec::new();
    let mut failed = Vec::new();
    let list = experiments::all(p.quick, p.no_kvm)?;
    let bar = Progress::new("reproduce", list.len() as u64, !p.quiet);
    for e in list {
        bar.note(&format!("reproduce: {}: {} ...", e.heading, e.command));
        let t0 = Instant::now();
        let _ = writeln!(md, "## {}: {}\n", e.heading, e.title);
        let _ = writeln!(md, "Published: {}\n", e.published);
        let _ = writeln!(md, "Measured here with `{}`:\n", e.command);
        match (e.run)() {
            Ok(r) => {
                let _ = writeln!(md, "```text\n{}```\n", r.text());
                let j = r.to_json();
                let plot = write_plot(out, e.id, &j).unwrap_or_else(|err| {
                    let _ = writeln!(md, "(no plot: {err})\n");
                    None
                });
                if let Some(name) = &plot {
                    let png = Path::new(name).with_extension("png");
                    let _ = writeln!(
                        md,
                        "![{} plot]({name})\n\n(PNG: [{}]({}))\n",
                        e.heading,
                        png.display(),
                        png.display()
                    );
                }
                all.push(json!({"experiment": e.id, "seed": e.seed, "heading": e.heading, "command": e.command, "plot": plot, "report": j}));
            }
            Err(err) => {
                let _ = writeln!(md, "FAILED: {err}\n");
                failed.push(format!("{}: {err}", e.heading));
                all.push(json!({"experiment": e.id, "seed": e.seed, "heading": e.heading, "command": e.command, "error": err}));
            }
        }
        let _ = writeln!(md, "({:.1} s)\n", t0.elapsed().as_secs_f64());
        bar.step();
    }
    drop(bar);
    std::fs::write(out, &md).map_err(|e| format!("--out {}: cannot write: {e}", p.out))?;
    if p.json {
        let mut r = Report::new(
            "reproduce",
            json!({"out": p.out, "quick": p.quick, "no_kvm": p.no_kvm}),
        );
        for x in &all {
            r.result(x["experiment"].as_str().unwrap_or("?"), "both", x.clone());
        }
        crate::report::emit(&r, true);
    } else {
        print!("{md}");
        eprintln!("reproduce: report written to {}", p.out);
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} experiment(s) failed: {}",
            failed.len(),
            failed.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A section is titled "Seed N" only for a seed N that exists (000 to
    /// 004), and every section and JSON key is unique.
    #[test]
    fn every_section_is_named_by_what_it_reproduces() {
        let list = experiments::all(true, false).unwrap();
        let mut ids = std::collections::HashSet::new();
        let mut headings = std::collections::HashSet::new();
        for e in &list {
            assert!(ids.insert(e.id), "two experiments keyed {}", e.id);
            assert!(
                headings.insert(e.heading),
                "two sections titled {}",
                e.heading
            );
            match e.seed {
                Some(s) => {
                    assert!(["000", "001", "002", "003", "004"].contains(&s), "{s}");
                    assert_eq!(e.heading, format!("Seed {s}"));
                    assert_eq!(e.id, s);
                }
                None => assert!(!e.heading.starts_with("Seed"), "{}", e.heading),
            }
        }
    }

    #[test]
    fn a_seed_with_a_plot_gets_svg_and_png_beside_the_report() {
        let dir = std::env::temp_dir().join(format!("s2mmu-reproduce-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("r.md");
        let report = json!({"results": [
            {"case": "first_pass", "policy": "eager_split", "median_ns": 6e6},
            {"case": "first_pass", "policy": "split_on_fault", "median_ns": 27e6},
        ]});
        let name = write_plot(&out, "004", &report).unwrap();
        assert_eq!(name.as_deref(), Some("r-seed-004.svg"));
        let svg = std::fs::read_to_string(dir.join("r-seed-004.svg")).unwrap();
        assert!(svg.starts_with("<svg"));
        let png = std::fs::read(dir.join("r-seed-004.png")).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        // A seed without a plot, or a report without its rows: no file.
        assert_eq!(write_plot(&out, "000", &report).unwrap(), None);
        assert_eq!(write_plot(&out, "002", &report).unwrap(), None);
        assert!(!dir.join("r-seed-002.png").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
