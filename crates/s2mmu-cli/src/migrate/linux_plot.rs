//! `migrate --guest linux --plot FILE`: each run's pre-copy rounds (pages
//! and milliseconds), its downtime's parts and the guest's console gap
//! (the time between the guest programs' lines as the host saw them, the
//! largest gap shaded), stacked in one figure through [`s2mmu_plot`]
//! (SVG, and PNG beside it).

use s2mmu_arm64_migrate::console_gap::Printer;
use s2mmu_arm64_migrate::session_run::{LinuxRun, RunDetails};
use s2mmu_plot::{stacked_png, stacked_svg, BarChart, Chart, LineChart, Phase, Series};
use std::path::Path;

/// Writes the figure of `runs` to `file` (SVG) and beside it (PNG).
///
/// # Errors
/// Nothing to draw, a drawing error, or a file that cannot be written.
pub fn write(file: &str, runs: &[LinuxRun]) -> Result<(), String> {
    let charts = charts(runs);
    let (svg, png) = (stacked_svg(&charts)?, stacked_png(&charts)?);
    let png_path = Path::new(file).with_extension("png");
    std::fs::write(file, svg).map_err(|e| format!("--plot {file}: {e}"))?;
    std::fs::write(&png_path, png).map_err(|e| format!("--plot {}: {e}", png_path.display()))
}

fn bars(title: &str, y: &str, categories: Vec<String>, groups: Vec<(String, Vec<f64>)>) -> Chart {
    Chart::Bar(BarChart {
        title: title.into(),
        y_label: y.into(),
        categories,
        groups,
    })
}

/// The rounds' pages and times, and the downtime's parts where the
/// session measured them.
fn charts(runs: &[LinuxRun]) -> Vec<Chart> {
    let rounds = runs.iter().map(|r| r.round_pages.len()).max().unwrap_or(0);
    let round_names: Vec<String> = (0..rounds).map(|i| i.to_string()).collect();
    let per_run = |f: &dyn Fn(&LinuxRun) -> Vec<f64>| -> Vec<(String, Vec<f64>)> {
        let name = |i: usize| format!("run {}", i + 1);
        runs.iter()
            .enumerate()
            .map(|(i, r)| (name(i), f(r)))
            .collect()
    };
    let mut charts = vec![
        bars(
            "pages sent per pre-copy round",
            "pages",
            round_names.clone(),
            per_run(&|r| r.round_pages.iter().map(|&p| p as f64).collect()),
        ),
        bars(
            "time of each pre-copy round",
            "ms",
            round_names,
            per_run(&|r| r.round_ms.clone()),
        ),
    ];
    let parts = [
        "pause",
        "harvest",
        "last pages",
        "state saved",
        "state sent",
        "until resumed",
    ];
    let downtime = per_run(&|r| {
        let d = match &r.details {
            RunDetails::Session { outcome, .. } => &outcome.downtime_parts,
            RunDetails::Postcopy { parts, .. } => parts,
        };
        [
            d.pause,
            d.harvest,
            d.last_pages,
            d.state_save,
            d.state_send,
            d.until_resumed,
        ]
        .iter()
        .map(|t| t.as_secs_f64() * 1e3)
        .collect()
    });
    let names = parts.iter().map(|s| s.to_string()).collect();
    charts.push(bars(
        "the downtime's parts (source's clock)",
        "ms",
        names,
        downtime,
    ));
    charts.extend(console_gap(runs));
    charts
}

/// Each run's gaps between the guest programs' console lines, source and
/// destination apart, each run's largest gap shaded and named with where
/// it falls; none when no run printed two lines.
fn console_gap(runs: &[LinuxRun]) -> Option<Chart> {
    let mut chart = LineChart {
        title: "the guest's console gap (host clock)".into(),
        x_label: "s since the guest program's first line".into(),
        y_label: "ms since the line before".into(),
        ..LineChart::default()
    };
    for (i, r) in runs.iter().enumerate() {
        let Some((l, place)) = r.console_gap.largest() else {
            continue;
        };
        for (who, machine) in [
            ("source", Printer::Source),
            ("destination", Printer::Destination),
        ] {
            let points: Vec<(f64, f64)> = (r.console_gap.lines.iter())
                .filter(|l| l.machine == machine)
                .map(|l| (l.at_s, l.gap_ms))
                .collect();
            if !points.is_empty() {
                let name = format!("run {}, {who}", i + 1);
                chart.series.push(Series { name, points });
            }
        }
        chart.phases.push(Phase {
            name: format!(
                "run {}: largest gap {:.1} ms, {}",
                i + 1,
                l.gap_ms,
                place.describe()
            ),
            start: l.at_s - l.gap_ms / 1e3,
            end: l.at_s,
        });
    }
    (!chart.series.is_empty()).then_some(Chart::Line(chart))
}
