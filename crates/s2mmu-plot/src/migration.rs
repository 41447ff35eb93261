//! The migration drawn through [`crate`] (plotters, SVG): three
//! charts stacked in one figure. The guest's write rate over time and its
//! execution time per write (log scale; dirty-log-perf's per-interval
//! degradation while dirty logging is on), each over the shaded phases of
//! every run (dirty logging, paused until resumed, and a post-copy
//! migration's phase on the destination from the resume to the last
//! page); then the pages sent in every round.

use crate::{stacked_png, stacked_svg, BarChart, Chart, LineChart, Phase, Series};
use s2mmu_migrate::session::source::SourceOutcome;
use s2mmu_migrate::session::timeline::{intervals, Interval};

/// One migration to draw.
pub struct PlotRun<'a> {
    /// Legend name.
    pub label: &'a str,
    /// What the source recorded.
    pub outcome: &'a SourceOutcome,
}

/// The SVG document.
///
/// # Errors
/// Nothing to plot (no run with a sample), or plotters' drawing error.
pub fn svg(title: &str, runs: &[PlotRun<'_>]) -> Result<String, String> {
    stacked_svg(&charts(title, runs))
}

/// The same figure as a PNG file's bytes.
///
/// # Errors
/// Nothing to plot (no run with a sample), or a drawing or encoding error.
pub fn png(title: &str, runs: &[PlotRun<'_>]) -> Result<Vec<u8>, String> {
    stacked_png(&charts(title, runs))
}

/// One series per run, named by its label: `point` of each of its
/// timeline intervals `ivs` that has one.
fn series_of(
    runs: &[PlotRun<'_>],
    ivs: &[Vec<Interval>],
    point: impl Fn(&Interval) -> Option<(f64, f64)>,
) -> Vec<Series> {
    runs.iter()
        .zip(ivs)
        .map(|(r, iv)| Series {
            name: r.label.to_string(),
            points: iv.iter().filter_map(&point).collect(),
        })
        .collect()
}

/// The figure's charts, top to bottom.
fn charts(title: &str, runs: &[PlotRun<'_>]) -> Vec<Chart> {
    let phases: Vec<Phase> = runs.iter().flat_map(|r| phases_of(r, runs.len())).collect();
    // Each run's timeline intervals, for both time series.
    let ivs: Vec<_> = runs.iter().map(|r| intervals(&r.outcome.samples)).collect();
    let rate = LineChart {
        title: format!("{title}: guest dirty rate"),
        x_label: "time (s)".into(),
        y_label: "guest dirty rate (MiB/s, wall time)".into(),
        series: series_of(runs, &ivs, |i| {
            Some((i.t_s, i.write_rate * 4096.0 / (1u64 << 20) as f64))
        }),
        phases: phases.clone(),
        log_y: false,
    };
    let per_write = LineChart {
        title: "guest execution time per write".into(),
        x_label: "time (s)".into(),
        y_label: "ns per write (log scale; faults included)".into(),
        series: series_of(runs, &ivs, |i| i.speed.map(|v| (i.t_s, 1e9 / v))),
        phases,
        log_y: true,
    };
    let mut charts = vec![Chart::Line(rate)];
    // A log axis needs a positive point (a run too short for two samples
    // has none): the chart is left out rather than the plot failed.
    if per_write
        .series
        .iter()
        .any(|s| s.points.iter().any(|p| p.1 > 0.0))
    {
        charts.push(Chart::Line(per_write));
    }
    charts.extend(rounds_chart(runs).map(Chart::Bar));
    charts
}

/// A run's phases: dirty logging on (from its start to the pause), paused
/// until resumed (the downtime), and with post-copy the guest running on
/// the destination while the missing pages arrive. Named after the run
/// when there are several.
fn phases_of(r: &PlotRun<'_>, runs: usize) -> Vec<Phase> {
    let o = r.outcome;
    let who = if runs > 1 {
        format!("{}: ", r.label)
    } else {
        String::new()
    };
    let mut v = vec![
        Phase {
            name: format!("{who}dirty logging"),
            start: o.log_start_s,
            end: o.pause_s,
        },
        Phase {
            name: format!("{who}paused until resumed"),
            start: o.pause_s,
            end: o.resumed_s,
        },
    ];
    if let Some(pc) = &o.postcopy {
        v.push(Phase {
            name: format!(
                "{who}post-copy: {} remote faults, last page at +{:.0} ms",
                pc.figures.remote_faults,
                pc.figures.time_to_last_page_ns as f64 / 1e6
            ),
            start: o.resumed_s,
            end: pc.background_end_s.max(o.resumed_s),
        });
    }
    v
}

/// Pages sent per round (each round sends the dirty set of the one before;
/// the last is the stop-and-copy with the vCPUs paused), one bar per run.
/// `None` when no run has a round.
fn rounds_chart(runs: &[PlotRun<'_>]) -> Option<BarChart> {
    let longest = runs.iter().max_by_key(|r| r.outcome.rounds.len())?;
    if longest.outcome.rounds.is_empty() {
        return None;
    }
    let categories = longest
        .outcome
        .rounds
        .iter()
        .map(|r| match r.final_round {
            true => format!("{} (paused)", r.round),
            false => r.round.to_string(),
        })
        .collect::<Vec<_>>();
    let groups = runs
        .iter()
        .map(|r| {
            let mut pages: Vec<f64> = r.outcome.rounds.iter().map(|x| x.pages as f64).collect();
            pages.resize(categories.len(), 0.0);
            (r.label.to_string(), pages)
        })
        .collect();
    Some(BarChart {
        title: "pages sent per round".into(),
        y_label: "pages".into(),
        categories,
        groups,
    })
}
