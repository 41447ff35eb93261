//! The plots' tests: every chart, series and phase named, PNGs decoded.
use s2mmu_plot::*;

/// Decodes a PNG, checking its signature and IHDR by hand first:
/// returns (width, height, RGB pixels).
fn decode_png(bytes: &[u8]) -> (u32, u32, Vec<u8>) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    assert_eq!(&bytes[12..16], b"IHDR", "first chunk");
    let be = |o: usize| u32::from_be_bytes(bytes[o..o + 4].try_into().unwrap());
    let (w, h) = (be(16), be(20));
    assert_eq!((bytes[24], bytes[25]), (8, 2), "8-bit RGB");
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (w, h));
    buf.truncate(info.buffer_size());
    (w, h, buf)
}

/// Pixels darker than light grey in rows `rows` (text is drawn black).
fn dark_pixels(rgb: &[u8], w: u32, rows: std::ops::Range<u32>) -> usize {
    let row = w as usize * 3;
    rgb[rows.start as usize * row..rows.end as usize * row]
        .chunks(3)
        .filter(|p| p.iter().all(|&c| c < 100))
        .count()
}

fn bars() -> BarChart {
    BarChart {
        title: "eager split against split on fault".into(),
        y_label: "ms".into(),
        categories: vec!["first pass".into(), "enable".into()],
        groups: vec![
            ("eager".into(), vec![3.0, 40.0]),
            ("on fault".into(), vec![30.0, 1.0]),
        ],
    }
}

#[test]
fn png_charts_decode_at_the_plot_size_with_their_text_drawn() {
    let line = LineChart {
        title: "vCPU scaling".into(),
        x_label: "vCPUs".into(),
        y_label: "ms".into(),
        series: vec![Series {
            name: "fast".into(),
            points: vec![(1.0, 2.0), (8.0, 5.0)],
        }],
        phases: vec![],
        log_y: false,
    };
    for png in [line.png().unwrap(), bars().png().unwrap()] {
        let (w, h, rgb) = decode_png(&png);
        assert_eq!((w, h), SIZE);
        assert_eq!(rgb.len(), w as usize * h as usize * 3);
        // The caption is the only thing in the top rows: dark pixels
        // there are the title's glyphs, drawn with the bundled font.
        assert!(dark_pixels(&rgb, w, 0..28) > 50, "no title text");
    }
    let untitled = BarChart {
        title: String::new(),
        ..bars()
    };
    let (w, _, rgb) = decode_png(&untitled.png().unwrap());
    assert_eq!(dark_pixels(&rgb, w, 0..12), 0, "ink above an empty title");
}

#[test]
fn a_stacked_png_is_one_plot_size_per_chart() {
    let charts = [Chart::Bar(bars()), Chart::Bar(bars())];
    let (w, h, _) = decode_png(&stacked_png(&charts).unwrap());
    assert_eq!((w, h), (SIZE.0, SIZE.1 * 2));
    assert!(stacked_png(&[]).is_err());
}

#[test]
fn write_svg_and_png_writes_both_or_neither() {
    let dir = std::env::temp_dir().join(format!("s2mmu-plot-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg_path = dir.join("chart.svg");
    let png_path = write_svg_and_png(&bars(), &svg_path).unwrap();
    assert_eq!(png_path, dir.join("chart.png"));
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<svg"));
    let (w, h, _) = decode_png(&std::fs::read(&png_path).unwrap());
    assert_eq!((w, h), SIZE);
    let bad = BarChart {
        groups: vec![("eager".into(), vec![1.0])],
        ..bars()
    };
    let none = dir.join("bad.svg");
    assert!(write_svg_and_png(&bad, &none).is_err());
    assert!(!none.exists() && !dir.join("bad.png").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_line_chart_over_phases_is_svg_with_every_label() {
    let c = LineChart {
        title: "migration".into(),
        x_label: "time (s)".into(),
        y_label: "dirty pages".into(),
        series: vec![Series {
            name: "remaining".into(),
            points: vec![(0.0, 100.0), (1.0, 40.0), (2.0, 5.0)],
        }],
        phases: vec![
            Phase {
                name: "pre-copy".into(),
                start: 0.0,
                end: 1.5,
            },
            Phase {
                name: "stop-and-copy".into(),
                start: 1.5,
                end: 2.0,
            },
        ],
        log_y: false,
    };
    let svg = c.svg().unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..40.min(svg.len())]);
    for label in [
        "migration",
        "time (s)",
        "dirty pages",
        "pre-copy",
        "stop-and-copy",
    ] {
        assert!(svg.contains(label), "no {label}");
    }
    // One line needs no legend; two get one naming each.
    assert!(!svg.contains("remaining"), "a legend for a single line");
    let two = LineChart {
        series: vec![
            c.series[0].clone(),
            Series {
                name: "second".into(),
                points: vec![(0.0, 1.0), (2.0, 3.0)],
            },
        ],
        ..c.clone()
    };
    let svg2 = two.svg().unwrap();
    assert!(svg2.contains("remaining") && svg2.contains("second"));
    // The series is a polyline of its three points in its colour (the
    // legend's sample line is one of two points).
    let series_lines: Vec<&str> = svg
        .split('<')
        .filter(|e| e.starts_with("polyline") && e.contains("#1F77B4"))
        .collect();
    assert!(
        series_lines
            .iter()
            .any(|e| e.split("points=\"").nth(1).map(|p| p
                .split('"')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .count())
                == Some(3)),
        "{series_lines:?}"
    );
}

#[test]
fn a_log_axis_spans_decades_and_a_stacked_figure_holds_every_chart() {
    let line = LineChart {
        title: "per write".into(),
        x_label: "time (s)".into(),
        y_label: "ns".into(),
        series: vec![Series {
            name: "run".into(),
            // The zero cannot be on a log axis: left out, not an error.
            points: vec![(0.0, 50.0), (1.0, 0.0), (2.0, 20_000.0)],
        }],
        phases: Vec::new(),
        log_y: true,
    };
    let svg = line.svg().unwrap();
    // Decades 10 .. 100k: the ticks name them (plotters writes each
    // text on its own line).
    let texts: Vec<&str> = svg.lines().map(str::trim).collect();
    for tick in ["10", "100", "1k", "10k", "100k"] {
        assert!(texts.contains(&tick), "no tick {tick}");
    }
    // Only decades: no tick between them (10^2.5 would read 316).
    assert!(
        !texts.iter().any(|t| ["316", "31.6", "3.16k"].contains(t)),
        "{texts:?}"
    );
    let bars = BarChart {
        title: "rounds".into(),
        y_label: "pages".into(),
        categories: vec!["0".into()],
        groups: vec![("run".into(), vec![3.0])],
    };
    let fig = stacked_svg(&[Chart::Line(line.clone()), Chart::Bar(bars)]).unwrap();
    assert!(fig.contains("per write") && fig.contains("rounds"));
    assert!(fig.contains("height=\"900\""), "two charts of 450 pixels");
    assert!(stacked_svg(&[]).unwrap_err().contains("0 charts"));
    let none = LineChart {
        series: vec![Series {
            name: "zeros".into(),
            points: vec![(0.0, 0.0)],
        }],
        ..line
    };
    assert!(none.svg().unwrap_err().contains("no point"));
}

#[test]
fn a_bar_chart_has_one_bar_per_group_and_category() {
    let c = BarChart {
        title: "eager vs fault".into(),
        y_label: "ms".into(),
        categories: vec!["first pass".into(), "splitting".into()],
        groups: vec![
            ("eager_split".into(), vec![6.0, 0.2]),
            ("split_on_fault".into(), vec![27.0, 0.1]),
        ],
    };
    let svg = c.svg().unwrap();
    for label in [
        "first pass",
        "splitting",
        "eager_split",
        "split_on_fault",
        "6.00",
        "0.200",
        "27.0",
    ] {
        assert!(svg.contains(label), "no {label}");
    }
    let bad = BarChart {
        groups: vec![("x".into(), vec![1.0])],
        ..c
    };
    assert!(bad.svg().unwrap_err().contains("one value per category"));
    let empty = LineChart::default();
    assert!(empty.svg().unwrap_err().contains("no point"));
}

/// Writes a PNG of each kind of chart the commands draw, shaped like their
/// real data, for a person to look at (labels inside the picture, round
/// ticks, whole counts, legends only where they tell lines apart):
/// `S2MMU_PLOT_GALLERY=/tmp/g cargo test -p s2mmu-cli --test plot gallery -- --ignored`.
#[test]
#[ignore = "writes PNGs for a person to look at (set S2MMU_PLOT_GALLERY to a directory)"]
fn gallery() {
    let dir = std::path::PathBuf::from(std::env::var("S2MMU_PLOT_GALLERY").unwrap());
    std::fs::create_dir_all(&dir).unwrap();
    gallery_migrate(&dir);
    let scaling = LineChart {
        title: "Fault paths: dirty memory time per vCPU count".into(),
        x_label: "vCPUs".into(),
        y_label: "dirty memory time, median (ms)".into(),
        series: vec![
            Series {
                name: "fast_path".into(),
                points: vec![(1.0, 31.2), (2.0, 35.9), (4.0, 61.0)],
            },
            Series {
                name: "write_lock".into(),
                points: vec![(1.0, 38.5), (2.0, 71.3), (4.0, 160.4)],
            },
        ],
        ..LineChart::default()
    };
    write_svg_and_png(&scaling, &dir.join("seed-002.svg")).unwrap();
    let eager = BarChart {
        title: "Eager split vs split on fault".into(),
        y_label: "median (ms)".into(),
        categories: ["first pass", "enabling dirty logging", "splitting"]
            .map(String::from)
            .to_vec(),
        groups: vec![
            ("eager_split".into(), vec![6.1, 41.7, 0.21]),
            ("split_on_fault".into(), vec![27.4, 0.9, 0.13]),
        ],
    };
    write_svg_and_png(&eager, &dir.join("seed-004.svg")).unwrap();
    let few = BarChart {
        title: "a few pages".into(),
        y_label: "pages".into(),
        categories: vec!["0".into(), "1 (paused)".into()],
        groups: vec![("run".into(), vec![3.0, 1.0])],
    };
    write_svg_and_png(&few, &dir.join("few.svg")).unwrap();
}

/// The gallery's migration figure: dirty rate and time per write over
/// phases, pages per round.
fn gallery_migrate(dir: &std::path::Path) {
    let t: Vec<f64> = (0..60).map(|i| f64::from(i) * 0.05).collect();
    let rate = LineChart {
        title: "migrate: guest dirty rate".into(),
        x_label: "time (s)".into(),
        y_label: "guest dirty rate (MiB/s, wall time)".into(),
        series: vec![Series {
            name: "pre-copy".into(),
            points: t
                .iter()
                .map(|&x| (x, if x < 0.4 { 900.0 } else { 310.0 + 40.0 * x }))
                .collect(),
        }],
        phases: vec![
            Phase {
                name: "dirty logging".into(),
                start: 0.4,
                end: 2.71,
            },
            Phase {
                name: "paused until resumed".into(),
                start: 2.71,
                end: 2.76,
            },
            Phase {
                name: "post-copy: 120 remote faults, last page at +35 ms".into(),
                start: 2.76,
                end: 2.95,
            },
        ],
        log_y: false,
    };
    let per_write = LineChart {
        title: "guest execution time per write".into(),
        y_label: "ns per write (log scale; faults included)".into(),
        series: vec![Series {
            name: "pre-copy".into(),
            points: t
                .iter()
                .map(|&x| {
                    (
                        x,
                        if x < 0.4 {
                            45.0
                        } else {
                            180.0 + 3000.0 * (x * 7.0).sin().abs()
                        },
                    )
                })
                .collect(),
        }],
        log_y: true,
        ..rate.clone()
    };
    let rounds = BarChart {
        title: "pages sent per round".into(),
        y_label: "pages".into(),
        categories: ["0", "1", "2", "3", "4 (paused)"]
            .map(String::from)
            .to_vec(),
        groups: vec![(
            "pre-copy".into(),
            vec![262144.0, 30211.0, 5120.0, 731.0, 42.0],
        )],
    };
    let fig = stacked_png(&[
        Chart::Line(rate),
        Chart::Line(per_write),
        Chart::Bar(rounds),
    ])
    .unwrap();
    std::fs::write(dir.join("migrate.png"), fig).unwrap();
}
