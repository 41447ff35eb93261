//! The migration's plots: every chart, series and phase named, post-copy
//! and several runs included.
use s2mmu_migrate::session::postcopy::{PostcopyFigures, PostcopyOutcome};
use s2mmu_migrate::session::source::RoundStat;
use s2mmu_migrate::session::source::SourceOutcome;
use s2mmu_migrate::session::timeline::Sample;
use s2mmu_plot::migration::*;

fn outcome() -> SourceOutcome {
    SourceOutcome {
        samples: (0u32..10)
            .map(|i| Sample {
                t_s: f64::from(i) * 0.1,
                writes: u64::from(i) * 1000,
                guest_ns: u64::from(i) * 50_000,
            })
            .collect(),
        rounds: vec![
            RoundStat {
                pages: 1000,
                ..RoundStat::default()
            },
            RoundStat {
                round: 1,
                pages: 10,
                final_round: true,
                ..RoundStat::default()
            },
        ],
        log_start_s: 0.3,
        pause_s: 0.8,
        resumed_s: 0.82,
        ..SourceOutcome::default()
    }
}

/// The texts of an SVG document (plotters writes each on its own line).
fn texts(svg: &str) -> Vec<&str> {
    svg.lines().map(str::trim).collect()
}

#[test]
fn names_every_chart_series_and_phase() {
    let o = outcome();
    let s = svg(
        "a <test>",
        &[PlotRun {
            label: "fast_path",
            outcome: &o,
        }],
    )
    .unwrap();
    assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
    let t = texts(&s);
    for name in [
        "a &lt;test&gt;: guest dirty rate",
        "guest execution time per write",
        "pages sent per round",
        "dirty logging",
        "paused until resumed",
        "1 (paused)",
    ] {
        assert!(t.contains(&name), "no {name}");
    }
    assert!(!t.iter().any(|x| x.starts_with("post-copy")));
    // One run: no legend (the title says what the lines are).
    assert!(!t.contains(&"fast_path"), "a legend for one run");
    assert!(!s.contains("NaN") && !s.contains("inf"));
}

#[test]
fn post_copy_and_several_runs_are_named() {
    let a = outcome();
    let mut b = outcome();
    b.postcopy = Some(PostcopyOutcome {
        figures: PostcopyFigures {
            remote_faults: 7,
            time_to_last_page_ns: 120_000_000,
            ..PostcopyFigures::default()
        },
        background_end_s: 0.95,
        ..PostcopyOutcome::default()
    });
    let s = svg(
        "two",
        &[
            PlotRun {
                label: "fast_path",
                outcome: &a,
            },
            PlotRun {
                label: "baseline",
                outcome: &b,
            },
        ],
    )
    .unwrap();
    let t = texts(&s);
    for name in [
        "fast_path: dirty logging",
        "baseline: paused until resumed",
        "baseline: post-copy: 7 remote faults, last page at +120 ms",
        "baseline",
    ] {
        assert!(t.contains(&name), "no {name}");
    }
    let none = svg("none", &[]).unwrap_err();
    assert!(none.contains("no point"), "{none}");
}
