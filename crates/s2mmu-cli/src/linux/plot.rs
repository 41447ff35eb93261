//! `s2mmu linux --plot FILE`: the exits per second over the run, by kind,
//! and the dirty rate at each harvest (pages logged per second since the
//! one before), stacked in one figure (SVG, and PNG beside it).

use s2mmu_arm64::linux::vm::{LinuxReport, EXIT_NAMES};
use s2mmu_plot::{stacked_png, stacked_svg, Chart, LineChart, Series};
use std::path::Path;

/// Writes the figure of `r` to `file` (SVG) and beside it (PNG).
///
/// # Errors
/// Nothing to draw, a drawing error, or a file that cannot be written.
pub(super) fn write(file: &Path, r: &LinuxReport) -> Result<(), String> {
    let mut charts = vec![exits(r)];
    charts.extend(dirty_rate(r));
    let (svg, png) = (stacked_svg(&charts)?, stacked_png(&charts)?);
    let png_path = file.with_extension("png");
    for (path, bytes) in [(file, svg.as_bytes()), (png_path.as_path(), &png[..])] {
        std::fs::write(path, bytes).map_err(|e| format!("--plot {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Each kind's exits per second between two samples.
fn exits(r: &LinuxReport) -> Chart {
    let series = EXIT_NAMES
        .iter()
        .enumerate()
        .map(|(k, name)| Series {
            name: name.to_string(),
            points: r
                .exit_samples
                .windows(2)
                .map(|w| {
                    (
                        w[1].0,
                        (w[1].1[k] - w[0].1[k]) as f64 / (w[1].0 - w[0].0).max(1e-9),
                    )
                })
                .collect(),
        })
        .collect();
    Chart::Line(LineChart {
        title: "exits per second, by kind".into(),
        x_label: "s since the start".into(),
        y_label: "exits/s".into(),
        series,
        ..LineChart::default()
    })
}

/// Pages logged per second at each harvest, when logging ran.
fn dirty_rate(r: &LinuxReport) -> Option<Chart> {
    let d = r.dirty.as_ref().filter(|d| d.per_harvest.len() > 1)?;
    let points = d
        .per_harvest
        .windows(2)
        .map(|w| {
            let dt = (w[1].0 - w[0].0) as f64 / 1e6;
            (w[1].0 as f64 / 1e6, w[1].1 as f64 / dt.max(1e-9))
        })
        .collect();
    Some(Chart::Line(LineChart {
        title: "dirty rate at each harvest".into(),
        x_label: "s since logging started".into(),
        y_label: "pages logged/s".into(),
        series: vec![Series {
            name: "pages logged".into(),
            points,
        }],
        ..LineChart::default()
    }))
}
