//! The plots' unit tests of private helpers (the rest are in `tests/plot.rs`).
use super::*;

#[test]
fn ticks_are_round_and_counts_whole() {
    for (v, want) in [
        (1000.0, "1k"),
        (1500.0, "1.5k"),
        (2e6, "2M"),
        (0.5, "0.5"),
        (10.0, "10"),
        (0.0, "0"),
    ] {
        assert_eq!(tick_label(v), want);
    }
    // A count's bars are labelled as whole numbers, its axis has no
    // fractional tick; a measurement keeps three significant digits.
    let counts = BarChart {
        title: "pages".into(),
        y_label: "pages".into(),
        categories: vec!["0".into(), "1".into()],
        groups: vec![("run".into(), vec![3.0, 1.0])],
    };
    let svg = counts.svg().unwrap();
    // The texts drawn (plotters writes each on its own line, tags apart).
    let texts: Vec<&str> = svg
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('<'))
        .collect();
    assert!(texts.contains(&"3") && texts.contains(&"1"), "{texts:?}");
    assert!(!texts.iter().any(|t| t.contains('.')), "{texts:?}");
    // One group: no legend naming it.
    assert!(!texts.contains(&"run"), "{texts:?}");
}
