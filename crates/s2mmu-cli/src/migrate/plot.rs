//! The migration drawn as a hand-written SVG: the guest's write rate and
//! its execution time per write over time (seed 002's per-interval
//! degradation while dirty logging is on), and the dirty set of every
//! round; a post-copy migration's phase on the destination is outlined
//! from the resume to the last page.

use super::source::SourceOutcome;
use super::timeline::intervals;
use std::fmt::Write;

const W: f64 = 960.0;
const PANEL_H: f64 = 230.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const GAP: f64 = 70.0;
const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

/// One migration to draw.
pub struct PlotRun<'a> {
    /// Legend name.
    pub label: &'a str,
    /// What the source recorded.
    pub outcome: &'a SourceOutcome,
}

/// The SVG document.
pub fn svg(title: &str, runs: &[PlotRun<'_>]) -> String {
    let h = TOP + 3.0 * PANEL_H + 2.0 * GAP + 60.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        W / 2.0,
        esc(title)
    );
    let t_max = runs
        .iter()
        .flat_map(|r| r.outcome.samples.last().map(|s| s.t_s))
        .fold(0.0f64, f64::max)
        .max(1e-3);

    // Panel 1: guest writes per second of wall time.
    let series: Vec<Vec<(f64, f64)>> = runs
        .iter()
        .map(|r| {
            intervals(&r.outcome.samples)
                .iter()
                .map(|i| (i.t_s, i.write_rate * 4096.0 / (1u64 << 20) as f64))
                .collect()
        })
        .collect();
    let y0 = TOP;
    let y_max = series
        .iter()
        .flatten()
        .map(|p| p.1)
        .fold(0.0f64, f64::max)
        .max(1e-3)
        * 1.1;
    let frame = Frame {
        y0,
        t_max,
        lo: 0.0,
        hi: y_max,
        log: false,
    };
    frame.axes(&mut s, "guest dirty rate (MiB/s, wall time)", "time (s)");
    for (k, (r, pts)) in runs.iter().zip(&series).enumerate() {
        frame.markers(&mut s, r.outcome, k);
        frame.line(&mut s, pts, COLORS[k % COLORS.len()]);
    }

    // Panel 2: guest execution time per write (log scale).
    let series: Vec<Vec<(f64, f64)>> = runs
        .iter()
        .map(|r| {
            intervals(&r.outcome.samples)
                .iter()
                .filter_map(|i| i.speed.map(|v| (i.t_s, 1e9 / v)))
                .collect()
        })
        .collect();
    let (lo, hi) = series
        .iter()
        .flatten()
        .fold((f64::MAX, 0.0f64), |(lo, hi), p| (lo.min(p.1), hi.max(p.1)));
    let (lo, hi) = if hi > 0.0 {
        (
            lo.max(1.0).log10().floor(),
            hi.log10().ceil().max(lo.log10() + 1.0),
        )
    } else {
        (0.0, 1.0)
    };
    let frame = Frame {
        y0: y0 + PANEL_H + GAP,
        t_max,
        lo,
        hi,
        log: true,
    };
    frame.axes(
        &mut s,
        "guest execution time per write (ns, log scale; faults included)",
        "time (s)",
    );
    for (k, (r, pts)) in runs.iter().zip(&series).enumerate() {
        frame.markers(&mut s, r.outcome, k);
        frame.line(&mut s, pts, COLORS[k % COLORS.len()]);
    }

    // Panel 3: pages sent per round (the dirty set of the round before).
    let y0 = y0 + 2.0 * (PANEL_H + GAP);
    let n_rounds = runs
        .iter()
        .map(|r| r.outcome.rounds.len())
        .max()
        .unwrap_or(0)
        .max(1);
    let p_max = runs
        .iter()
        .flat_map(|r| r.outcome.rounds.iter().map(|x| x.pages))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let (plo, phi) = (0.0, p_max.log10().ceil().max(1.0));
    let frame = Frame {
        y0,
        t_max: n_rounds as f64,
        lo: plo,
        hi: phi,
        log: true,
    };
    frame.y_axis(&mut s, "pages sent per round (log scale; last = paused)");
    let slot = (W - LEFT - RIGHT) / n_rounds as f64;
    let bar = slot * 0.8 / runs.len().max(1) as f64;
    for (k, r) in runs.iter().enumerate() {
        for (i, round) in r.outcome.rounds.iter().enumerate() {
            let x = LEFT + i as f64 * slot + slot * 0.1 + k as f64 * bar;
            let top = frame.y((round.pages.max(1)) as f64);
            let base = y0 + PANEL_H;
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{}" opacity="{}"><title>{} round {}: {} pages</title></rect>"#,
                bar.max(1.0),
                (base - top).max(0.0),
                COLORS[k % COLORS.len()],
                if round.final_round { 0.5 } else { 0.9 },
                esc(r.label),
                round.round,
                round.pages
            );
        }
    }
    for i in 0..n_rounds {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{i}</text>"#,
            LEFT + (i as f64 + 0.5) * slot,
            y0 + PANEL_H + 16.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">round</text>"#,
        LEFT + (W - LEFT - RIGHT) / 2.0,
        y0 + PANEL_H + 34.0
    );

    // Legend.
    let ly = y0 + PANEL_H + 52.0;
    for (k, r) in runs.iter().enumerate() {
        let x = LEFT + k as f64 * 300.0;
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="{:.1}" width="14" height="10" fill="{}"/><text x="{}" y="{ly:.1}">{} (dashed: logging on; shaded: paused until resumed)</text>"#,
            ly - 9.0,
            COLORS[k % COLORS.len()],
            x + 18.0,
            esc(r.label)
        );
    }
    s.push_str("</svg>\n");
    s
}

struct Frame {
    y0: f64,
    t_max: f64,
    lo: f64,
    hi: f64,
    log: bool,
}

impl Frame {
    fn x(&self, t: f64) -> f64 {
        LEFT + t / self.t_max * (W - LEFT - RIGHT)
    }

    fn y(&self, v: f64) -> f64 {
        let v = if self.log { v.max(1e-9).log10() } else { v };
        let f = ((v - self.lo) / (self.hi - self.lo).max(1e-12)).clamp(0.0, 1.0);
        self.y0 + PANEL_H - f * PANEL_H
    }

    fn y_axis(&self, s: &mut String, label: &str) {
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{}" width="{}" height="{PANEL_H}" fill="none" stroke="#444"/>"##,
            self.y0,
            W - LEFT - RIGHT
        );
        let _ = writeln!(
            s,
            r#"<text x="{LEFT}" y="{}">{}</text>"#,
            self.y0 - 8.0,
            esc(label)
        );
        let ticks: Vec<f64> = if self.log {
            (self.lo as i32..=self.hi as i32)
                .map(|e| 10f64.powi(e))
                .collect()
        } else {
            (0..=4)
                .map(|i| self.lo + (self.hi - self.lo) * i as f64 / 4.0)
                .collect()
        };
        for v in ticks {
            let y = self.y(v);
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                W - RIGHT,
                LEFT - 6.0,
                y + 4.0,
                num(v)
            );
        }
    }

    fn axes(&self, s: &mut String, label: &str, x_label: &str) {
        self.y_axis(s, label);
        for i in 0..=8 {
            let t = self.t_max * f64::from(i) / 8.0;
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{t:.1}</text>"#,
                self.x(t),
                self.y0 + PANEL_H + 16.0
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            LEFT + (W - LEFT - RIGHT) / 2.0,
            self.y0 + PANEL_H + 34.0,
            esc(x_label)
        );
    }

    fn markers(&self, s: &mut String, o: &SourceOutcome, k: usize) {
        let c = COLORS[k % COLORS.len()];
        let x = self.x(o.log_start_s);
        let _ = writeln!(
            s,
            r#"<line x1="{x:.1}" x2="{x:.1}" y1="{}" y2="{}" stroke="{c}" stroke-dasharray="5,4"/>"#,
            self.y0,
            self.y0 + PANEL_H
        );
        let (a, b) = (self.x(o.pause_s), self.x(o.resumed_s));
        let _ = writeln!(
            s,
            r#"<rect x="{a:.1}" y="{}" width="{:.1}" height="{PANEL_H}" fill="{c}" opacity="0.15"/>"#,
            self.y0,
            (b - a).max(1.0)
        );
        if let Some(pc) = &o.postcopy {
            // Post-copy: the guest runs on the destination while the
            // missing pages arrive (from the resume to the background
            // stream's end), outlined and labelled.
            let e = self.x(pc.background_end_s);
            let _ = writeln!(
                s,
                r#"<rect x="{b:.1}" y="{}" width="{:.1}" height="{PANEL_H}" fill="{c}" opacity="0.06" stroke="{c}" stroke-dasharray="2,3"/>"#,
                self.y0,
                (e - b).max(1.0)
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{}" font-size="11" fill="{c}">post-copy: {} remote faults, last page at +{:.0} ms</text>"#,
                b + 4.0,
                self.y0 + 14.0,
                pc.figures.remote_faults,
                pc.figures.time_to_last_page_ns as f64 / 1e6
            );
        }
    }

    fn line(&self, s: &mut String, pts: &[(f64, f64)], color: &str) {
        if pts.is_empty() {
            return;
        }
        let mut d = String::new();
        for (i, (t, v)) in pts.iter().enumerate() {
            let _ = write!(
                d,
                "{}{:.1},{:.1} ",
                if i == 0 { "M" } else { "L" },
                self.x(*t),
                self.y(*v)
            );
        }
        let _ = writeln!(
            s,
            r#"<path d="{}" fill="none" stroke="{color}" stroke-width="1.5"/>"#,
            d.trim_end()
        );
    }
}

fn num(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.0}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.0}k", v / 1e3)
    } else if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migrate::source::RoundStat;
    use crate::migrate::timeline::Sample;

    #[test]
    fn draws_a_well_formed_document() {
        let o = SourceOutcome {
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
        };
        let s = svg(
            "a <test>",
            &[PlotRun {
                label: "x",
                outcome: &o,
            }],
        );
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"));
        assert!(s.contains("a &lt;test&gt;"));
        assert_eq!(s.matches("<path").count(), 2);
        assert!(!s.contains("NaN") && !s.contains("inf"));
    }
}
