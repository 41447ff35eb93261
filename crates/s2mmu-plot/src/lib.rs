//! Plots through `plotters`, as SVG and as PNG: line charts of named
//! series over a numeric axis, optionally over shaded phases (a time series
//! such as a migration's, with its pre-copy rounds and stop-and-copy), and
//! grouped bar charts of a few cases measured under a few policies.
//!
//! SVG writes text as `<text>`, but plotters measures every label with a
//! font to lay the chart out, and PNG rasterises the labels: the bitmap
//! backend draws into an RGB buffer. The font is Noto Sans, bundled as
//! bytes by `ttf-noto-sans` and registered with plotters' `ab_glyph`
//! renderer, so no system font or font library is needed; `png` encodes
//! the buffer. [`write_svg_and_png`] writes both files of any
//! [`Chart`]. [`migration`] draws a migration's time series and rounds.

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{register_font, FontStyle};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One named line: `(x, y)` points in x order.
#[derive(Clone, Debug)]
pub struct Series {
    /// The legend's label.
    pub name: String,
    /// The points, in the order they are joined.
    pub points: Vec<(f64, f64)>,
}

/// A shaded stretch of the x axis with its name (a migration phase).
#[derive(Clone, Debug)]
pub struct Phase {
    /// The label written at its top.
    pub name: String,
    /// Where it starts on the x axis.
    pub start: f64,
    /// Where it ends on the x axis.
    pub end: f64,
}

/// A line chart: series over shaded phases.
#[derive(Clone, Debug, Default)]
pub struct LineChart {
    /// The title above the plot.
    pub title: String,
    /// The x axis' label, with its unit.
    pub x_label: String,
    /// The y axis' label, with its unit.
    pub y_label: String,
    /// The lines.
    pub series: Vec<Series>,
    /// Shaded stretches behind the lines (none for a plain chart).
    pub phases: Vec<Phase>,
    /// A logarithmic y axis (points at or below zero are left out): for
    /// values over several orders of magnitude, such as a time per write
    /// with faults in it.
    pub log_y: bool,
}

/// A grouped bar chart: for each category one bar per group.
#[derive(Clone, Debug, Default)]
pub struct BarChart {
    /// The title above the plot.
    pub title: String,
    /// The y axis' label, with its unit.
    pub y_label: String,
    /// The categories along the x axis.
    pub categories: Vec<String>,
    /// Each group's name and its value per category (same order).
    pub groups: Vec<(String, Vec<f64>)>,
}

/// The plot's size in pixels (width, height), for SVG and PNG alike.
pub const SIZE: (u32, u32) = (800, 450);

fn color(i: usize) -> RGBColor {
    // Palette99's first colours, named so a reader can match the legend.
    const COLORS: [RGBColor; 6] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
    ];
    COLORS[i % COLORS.len()]
}

/// The smallest and largest finite values, widened when they are equal so
/// an axis always has a length.
fn range(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if lo > hi {
        return None;
    }
    if lo == hi {
        let pad = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
        return Some((lo - pad, hi + pad));
    }
    Some((lo, hi))
}

fn err<E: std::fmt::Display>(e: E) -> String {
    format!("plot: {e}")
}

impl LineChart {
    /// The chart as an SVG document.
    ///
    /// # Errors
    /// No finite point to plot, or a drawing error from plotters.
    pub fn svg(&self) -> Result<String, String> {
        svg_sized(SIZE, |root| self.draw(root))
    }

    /// The chart as a PNG file's bytes, [`SIZE`] pixels.
    ///
    /// # Errors
    /// No finite point to plot, or a drawing or encoding error.
    pub fn png(&self) -> Result<Vec<u8>, String> {
        png_of(|root| self.draw(root))
    }

    /// The series' points as drawn: with a log y axis, `(x, log10 y)` of
    /// the positive ones.
    fn drawn_points(&self) -> Vec<Vec<(f64, f64)>> {
        self.series
            .iter()
            .map(|s| match self.log_y {
                false => s.points.clone(),
                true => s
                    .points
                    .iter()
                    .filter(|p| p.1 > 0.0)
                    .map(|&(x, y)| (x, y.log10()))
                    .collect(),
            })
            .collect()
    }

    /// Draws the chart on `root` (a whole document or one panel of a
    /// [`stacked_svg`] figure).
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let drawn = self.drawn_points();
        let points = || drawn.iter().flatten();
        let phase_x = self.phases.iter().flat_map(|p| [p.start, p.end]);
        let (x0, x1) = range(points().map(|p| p.0).chain(phase_x))
            .ok_or_else(|| format!("plot '{}': no point to plot", self.title))?;
        let no_point = || format!("plot '{}': no point to plot", self.title);
        // A log axis spans whole decades; a linear one starts at zero.
        let (y0, y1) = if self.log_y {
            let (lo, hi) = range(points().map(|p| p.1)).ok_or_else(no_point)?;
            (lo.floor(), hi.ceil().max(lo.floor() + 1.0))
        } else {
            let (_, hi) = range(points().map(|p| p.1).chain([0.0])).ok_or_else(no_point)?;
            (0.0, hi * 1.1)
        };
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, (FAMILY, 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(err)?;
        let log_y = self.log_y;
        // Counts (every y a whole number) get whole-number ticks only; a log
        // axis names its decades only (10, 100, 1k), never 10^2.3.
        let whole_y = !log_y && points().all(|p| p.1 == p.1.trunc());
        let whole_x = points().all(|p| p.0 == p.0.trunc());
        let x_tick = |v: &f64| match whole_x && (v - v.round()).abs() > 1e-9 {
            true => String::new(),
            false => tick_label(*v),
        };
        let y_tick = |v: &f64| match (log_y, whole_y) {
            _ if (log_y || whole_y) && (v - v.round()).abs() > 1e-9 => String::new(),
            (true, _) => tick_label(three_digits(10f64.powf(v.round()))),
            (false, _) => tick_label(*v),
        };
        let mut mesh = chart.configure_mesh();
        if log_y {
            // One label per decade: plotters then puts them on the integers.
            mesh.y_labels(((y1 - y0) as usize + 1).min(12));
        }
        mesh.x_desc(&self.x_label)
            .y_desc(&self.y_label)
            .x_label_formatter(&x_tick)
            .y_label_formatter(&y_tick)
            .draw()
            .map_err(err)?;
        let width = root.dim_in_pixel().0;
        draw_phases(&mut chart, &self.phases, (x0, x1, y0, y1), width)?;
        for (i, (s, points)) in self.series.iter().zip(&drawn).enumerate() {
            let c = color(i);
            chart
                .draw_series(LineSeries::new(points.iter().copied(), c.stroke_width(2)))
                .map_err(err)?
                .label(&s.name)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], c.stroke_width(2)));
            chart
                .draw_series(PointSeries::of_element(
                    points.iter().copied(),
                    3,
                    c.filled(),
                    &|p, size, style| EmptyElement::at(p) + Circle::new((0, 0), size, style),
                ))
                .map_err(err)?;
        }
        // A legend only tells lines apart: one line needs none (the title
        // and axis names it).
        if self.series.len() > 1 {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(err)?;
        }
        Ok(())
    }
}

/// Shades each phase over the plot's height and writes its name at its
/// top: one below the other, so phases that start close together stay
/// readable; a name that would run past the plot's right edge is written
/// from the phase's end leftwards instead. `width` is the chart's width in
/// pixels, `(x0, x1, y0, y1)` its ranges.
fn draw_phases<DB: DrawingBackend>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    phases: &[Phase],
    (x0, x1, y0, y1): (f64, f64, f64, f64),
    width: u32,
) -> Result<(), String> {
    // About 7 pixels a character at size 12, over the plot's width.
    let per_px = (x1 - x0) / f64::from(width.saturating_sub(100).max(1));
    for (i, ph) in phases.iter().enumerate() {
        let shade = color(i + 3).mix(0.12);
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(ph.start, y0), (ph.end, y1)],
                shade.filled(),
            )))
            .map_err(err)?;
        let row = (i % 6) as f64 + 1.0;
        let y = y1 - (y1 - y0) * 0.05 * row;
        let fits = ph.start + ph.name.chars().count() as f64 * 7.0 * per_px <= x1;
        let (x, h) = match fits {
            true => (ph.start.max(x0), HPos::Left),
            false => (ph.end.min(x1), HPos::Right),
        };
        let style = TextStyle::from((FAMILY, 12)).pos(Pos::new(h, VPos::Top));
        chart
            .draw_series(std::iter::once(Text::new(ph.name.clone(), (x, y), style)))
            .map_err(err)?;
    }
    Ok(())
}

/// An axis tick: thousands and millions with k and M (1k, 1.5k, 10k, 2M),
/// whole numbers as such, small ones with up to two decimals, never a
/// trailing zero.
fn tick_label(v: f64) -> String {
    let a = v.abs();
    let trim = |x: f64| {
        let s = format!("{x:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e3 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

/// `v` to three significant digits (a log axis' tick, 10^1 computed as
/// 10.000000000000002, reads 10).
fn three_digits(v: f64) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let unit = 10f64.powi(v.abs().log10().floor() as i32 - 2);
    (v / unit).round() * unit
}

/// One chart of a [`stacked_svg`] figure.
#[derive(Clone, Debug)]
pub enum Chart {
    /// A line chart.
    Line(LineChart),
    /// A grouped bar chart.
    Bar(BarChart),
}

/// Charts stacked top to bottom in one SVG document, each the size of a
/// single chart.
///
/// # Errors
/// No chart, or the first chart that cannot be drawn (see
/// [`LineChart::svg`] and [`BarChart::svg`]).
pub fn stacked_svg(charts: &[Chart]) -> Result<String, String> {
    svg_sized(stacked_size(charts)?, |root| draw_stacked(root, charts))
}

/// [`stacked_svg`]'s figure as a PNG file's bytes, [`SIZE`] per chart.
///
/// # Errors
/// As [`stacked_svg`], or an encoding error.
pub fn stacked_png(charts: &[Chart]) -> Result<Vec<u8>, String> {
    png_sized(stacked_size(charts)?, |root| draw_stacked(root, charts))
}

/// The size of a figure of `charts` one above the other: [`SIZE`] per
/// chart, 1 to 16 charts.
fn stacked_size(charts: &[Chart]) -> Result<(u32, u32), String> {
    let n = u32::try_from(charts.len())
        .ok()
        .filter(|&n| (1..=16).contains(&n))
        .ok_or_else(|| format!("plot: {} charts in one figure (1 to 16)", charts.len()))?;
    Ok((SIZE.0, SIZE.1 * n))
}

/// Draws `charts` one above the other on a white `root`.
fn draw_stacked<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    charts: &[Chart],
) -> Result<(), String> {
    root.fill(&WHITE).map_err(err)?;
    for (area, chart) in root.split_evenly((charts.len(), 1)).iter().zip(charts) {
        match chart {
            Chart::Line(c) => c.draw(area)?,
            Chart::Bar(c) => c.draw(area)?,
        }
    }
    Ok(())
}

/// A bar's value as its label: three significant digits, so a bar too
/// short to see still says what it measured; a count (`whole`) as the
/// whole number it is.
fn value_label(v: f64, whole: bool) -> String {
    if whole || v == 0.0 || !v.is_finite() {
        return format!("{v:.0}");
    }
    let digits = (2 - v.abs().log10().floor() as i32).clamp(0, 6) as usize;
    format!("{v:.digits$}")
}

impl BarChart {
    /// The chart as an SVG document.
    ///
    /// # Errors
    /// No finite value, groups whose lengths differ from the categories',
    /// or a drawing error from plotters.
    pub fn svg(&self) -> Result<String, String> {
        svg_sized(SIZE, |root| self.draw(root))
    }

    /// The chart as a PNG file's bytes, [`SIZE`] pixels.
    ///
    /// # Errors
    /// As [`BarChart::svg`], or an encoding error.
    pub fn png(&self) -> Result<Vec<u8>, String> {
        png_of(|root| self.draw(root))
    }

    /// The top of the y axis: the largest value with room above for the
    /// value labels; refuses a chart whose groups do not have one finite
    /// value per category.
    fn y_top(&self) -> Result<f64, String> {
        let n = self.categories.len();
        if n == 0 || self.groups.iter().any(|(_, v)| v.len() != n) {
            return Err(format!(
                "plot '{}': every group needs one value per category",
                self.title
            ));
        }
        let (_, y1) = range(
            self.groups
                .iter()
                .flat_map(|(_, v)| v.iter().copied())
                .chain([0.0]),
        )
        .ok_or_else(|| format!("plot '{}': no value to plot", self.title))?;
        Ok(y1 * 1.15)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        let y1 = self.y_top()?;
        let n = self.categories.len();
        root.fill(&WHITE).map_err(err)?;
        let categories = self.categories.clone();
        let mut chart = ChartBuilder::on(root)
            .caption(&self.title, (FAMILY, 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..n as f64, 0.0..y1)
            .map_err(err)?;
        // Counts (every value a whole number): whole-number ticks and labels.
        let whole = self
            .groups
            .iter()
            .flat_map(|(_, v)| v.iter())
            .all(|v| *v == v.trunc());
        let y_tick = |v: &f64| match whole && (v - v.round()).abs() > 1e-9 {
            true => String::new(),
            false => tick_label(*v),
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .y_label_formatter(&y_tick)
            .x_labels(n * 2 + 1)
            .x_label_formatter(&|x| {
                // Label each category at its centre (x = i + 0.5) only.
                let i = x.floor();
                if (x - i - 0.5).abs() < 1e-6 && (i as usize) < categories.len() {
                    categories[i as usize].clone()
                } else {
                    String::new()
                }
            })
            .y_desc(&self.y_label)
            .draw()
            .map_err(err)?;
        let groups = self.groups.len() as f64;
        let width = 0.8 / groups;
        for (g, (name, values)) in self.groups.iter().enumerate() {
            let c = color(g);
            let bars = values.iter().enumerate().map(|(i, &v)| {
                let left = i as f64 + 0.1 + g as f64 * width;
                Rectangle::new([(left, 0.0), (left + width * 0.9, v)], c.filled())
            });
            chart
                .draw_series(bars)
                .map_err(err)?
                .label(name)
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
            let labels = values.iter().enumerate().map(|(i, &v)| {
                let left = i as f64 + 0.1 + g as f64 * width;
                Text::new(value_label(v, whole), (left, v + y1 * 0.03), (FAMILY, 11))
            });
            chart.draw_series(labels).map_err(err)?;
        }
        if self.groups.len() > 1 {
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(err)?;
        }
        Ok(())
    }
}

/// The font family the charts' text asks for; drawing registers the
/// bundled font under it.
const FAMILY: &str = "sans-serif";

/// Registers the bundled Noto Sans as [`FAMILY`] with plotters (once per
/// process), so the bitmap backend finds a font without a system one.
fn register_bundled_font() -> Result<(), String> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            register_font(FAMILY, FontStyle::Normal, ttf_noto_sans::REGULAR)
                .map_err(|_| "plot: the bundled Noto Sans font does not parse".to_string())
        })
        .clone()
}

/// An SVG document of `(w, h)` drawn by `draw`.
fn svg_sized(
    size: (u32, u32),
    draw: impl FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> Result<(), String>,
) -> Result<String, String> {
    // plotters lays text out with the registered font, SVG too.
    register_bundled_font()?;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        draw(&root)?;
        root.present().map_err(err)?;
    }
    Ok(out)
}

/// Draws a chart into an RGB buffer of [`SIZE`] and encodes it as PNG.
fn png_of(
    draw: impl FnOnce(&DrawingArea<BitMapBackend<'_>, Shift>) -> Result<(), String>,
) -> Result<Vec<u8>, String> {
    png_sized(SIZE, draw)
}

/// A PNG of `(w, h)` pixels drawn by `draw`.
fn png_sized(
    (w, h): (u32, u32),
    draw: impl FnOnce(&DrawingArea<BitMapBackend<'_>, Shift>) -> Result<(), String>,
) -> Result<Vec<u8>, String> {
    register_bundled_font()?;
    let mut rgb = vec![0u8; w as usize * h as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
        draw(&root)?;
        root.present().map_err(err)?;
    }
    encode_png(&rgb, w, h)
}

/// `rgb` (8-bit RGB rows, `w` by `h`) as a PNG file's bytes.
fn encode_png(rgb: &[u8], w: u32, h: u32) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, w, h);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(err)?;
    writer.write_image_data(rgb).map_err(err)?;
    writer.finish().map_err(err)?;
    Ok(out)
}

/// A chart drawn both ways: SVG for the browser, PNG where SVG is not shown.
pub trait Figure {
    /// The chart as an SVG document.
    ///
    /// # Errors
    /// Nothing to plot, or a drawing error.
    fn to_svg(&self) -> Result<String, String>;
    /// The chart as a PNG file's bytes.
    ///
    /// # Errors
    /// Nothing to plot, or a drawing or encoding error.
    fn to_png(&self) -> Result<Vec<u8>, String>;
}

impl Figure for LineChart {
    fn to_svg(&self) -> Result<String, String> {
        self.svg()
    }
    fn to_png(&self) -> Result<Vec<u8>, String> {
        self.png()
    }
}

impl Figure for BarChart {
    fn to_svg(&self) -> Result<String, String> {
        self.svg()
    }
    fn to_png(&self) -> Result<Vec<u8>, String> {
        self.png()
    }
}

/// Writes `chart` as SVG to `svg_path` and as PNG beside it (the same path
/// with the extension `png`); returns the PNG's path. Both are drawn before
/// either is written, so a chart that cannot be drawn leaves no file.
///
/// # Errors
/// The chart cannot be drawn, or a file cannot be written (naming it).
pub fn write_svg_and_png(chart: &impl Figure, svg_path: &Path) -> Result<PathBuf, String> {
    let svg = chart.to_svg()?;
    let png = chart.to_png()?;
    let png_path = svg_path.with_extension("png");
    for (path, bytes) in [(svg_path, svg.as_bytes()), (png_path.as_path(), &png[..])] {
        std::fs::write(path, bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(png_path)
}

pub mod migration;

#[cfg(test)]
mod tests;
