//! A guest console as the host sees it: every line stamped on arrival with
//! the host's wall clock (one clock for every process on the host), and
//! what the benchmark reads from the dirtier's lines: its progress ticks,
//! the largest gap between them, its rate in a window, and its own check
//! of every page it wrote.

use std::io::{BufRead, BufReader, Read};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

/// Lines a console keeps at most (a 2 ms tick for half an hour).
pub const MAX_LINES: usize = 1 << 20;
/// Bytes of a line kept at most (a report of a run fits).
pub const MAX_LINE: usize = 64 * 1024;

/// One console line and when the host read it (seconds since the epoch).
#[derive(Clone, Debug, PartialEq)]
pub struct Stamped {
    /// Host wall-clock seconds at the line's arrival.
    pub at: f64,
    /// The line, without its end.
    pub line: String,
}

/// Lines shared between the reader thread and the benchmark.
pub type Lines = Arc<Mutex<Vec<Stamped>>>;

/// The host's wall clock, seconds since the epoch.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Reads `r` line by line on a thread, stamping each line into `lines`
/// (at most [`MAX_LINES`], each cut to [`MAX_LINE`] bytes).
pub fn stamp(r: impl Read + Send + 'static, lines: Lines) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("console-stamp".into())
        .spawn(move || {
            let mut r = BufReader::new(r);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match r.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                let at = now();
                buf.truncate(MAX_LINE);
                let line = String::from_utf8_lossy(&buf).trim_end().to_string();
                let mut g = lines.lock().unwrap_or_else(|p| p.into_inner());
                if g.len() < MAX_LINES {
                    g.push(Stamped { at, line });
                }
            }
        })
}

/// A copy of the lines read so far.
pub fn snapshot(lines: &Lines) -> Vec<Stamped> {
    lines.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The stamp of the first line containing `what`.
pub fn first(lines: &[Stamped], what: &str) -> Option<f64> {
    lines.iter().find(|l| l.line.contains(what)).map(|l| l.at)
}

/// The dirtier's progress lines (`s2mmu-dirtier: t=... pages=N`): their
/// stamps and page counts, in time order.
pub fn ticks(lines: &[Stamped]) -> Vec<(f64, u64)> {
    let mut v: Vec<(f64, u64)> = lines
        .iter()
        .filter_map(|l| {
            let rest = l.line.split("s2mmu-dirtier: t=").nth(1)?;
            let n = rest.split(" pages=").nth(1)?.split_whitespace().next()?;
            Some((l.at, n.parse().ok()?))
        })
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

/// The largest gap (seconds) between consecutive ticks where the later
/// tick falls in `[from, to]`.
pub fn largest_gap(ticks: &[(f64, u64)], from: f64, to: f64) -> Option<f64> {
    ticks
        .windows(2)
        .filter(|w| w[1].0 >= from && w[1].0 <= to)
        .map(|w| w[1].0 - w[0].0)
        .max_by(f64::total_cmp)
}

/// Pages the program had done at `t`: interpolated between the last tick
/// at or before it and the next one (the last tick's count where none
/// follows). Taking the last tick alone would undercount a window's end
/// and overcount its start by up to a tick interval, which differs
/// between the two emulations (a trapped UART line costs ours more).
fn pages_at(ticks: &[(f64, u64)], t: f64) -> Option<f64> {
    let i = ticks.iter().rposition(|p| p.0 <= t)?;
    let (t0, n0) = (ticks[i].0, ticks[i].1 as f64);
    Some(match ticks.get(i + 1) {
        Some(&(t1, n1)) if t1 > t0 => n0 + (n1 as f64 - n0) * (t - t0) / (t1 - t0),
        _ => n0,
    })
}

/// The program's pages per second over `[from, to]`, from its ticks.
pub fn rate(ticks: &[(f64, u64)], from: f64, to: f64) -> Option<f64> {
    if to <= from {
        return None;
    }
    let (a, b) = (pages_at(ticks, from)?, pages_at(ticks, to)?);
    Some((b - a).max(0.0) / (to - from))
}

/// What the dirtier's own check said: `Some(0)` for its `ok` line, the
/// number of `FAIL` lines (it stops at the first page it finds lost, so
/// at least that many pages were lost), `None` when it said neither.
pub fn pages_lost(lines: &[Stamped]) -> Option<u64> {
    let fails = lines
        .iter()
        .filter(|l| l.line.contains("s2mmu-dirtier: FAIL"))
        .count() as u64;
    if fails > 0 {
        Some(fails)
    } else if lines.iter().any(|l| l.line.contains("s2mmu-dirtier: ok")) {
        Some(0)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(at: f64, line: &str) -> Stamped {
        Stamped {
            at,
            line: line.into(),
        }
    }

    #[test]
    fn ticks_give_the_gap_the_rate_and_the_check() {
        let lines = vec![
            l(1.0, "s2mmu-dirtier: start threads=1"),
            l(1.002, "s2mmu-dirtier: t=0.002s passes=0 pages=10"),
            l(1.004, "s2mmu-dirtier: t=0.004s passes=0 pages=20"),
            l(1.104, "s2mmu-dirtier: t=0.104s passes=0 pages=520"),
            l(1.106, "garbled s2mmu-dirtier: t=0.1 pages=x"),
            l(1.108, "s2mmu-dirtier: t=0.108s passes=1 pages=540"),
            l(1.2, "s2mmu-dirtier: ok passes=1 pages=540 secs=1"),
        ];
        let t = ticks(&lines);
        assert_eq!(t.len(), 4);
        let gap = largest_gap(&t, 1.0, 2.0).unwrap();
        assert!((gap - 0.1).abs() < 1e-9, "{gap}");
        assert_eq!(largest_gap(&t, 1.105, 1.2), Some(1.108 - 1.104));
        let r = rate(&t, 1.002, 1.108).unwrap();
        assert!((r - 530.0 / 0.106).abs() < 1e-6, "{r}");
        assert_eq!(rate(&t, 0.5, 1.1), None);
        // Between ticks the count is interpolated: half way from 20 (at
        // 1.004) to 520 (at 1.104) is 270; past the last tick, its count.
        let r = rate(&t, 1.054, 1.2).unwrap();
        assert!((r - (540.0 - 270.0) / 0.146).abs() < 1e-6, "{r}");
        assert_eq!(pages_lost(&lines), Some(0));
        assert_eq!(first(&lines, "dirtier: start"), Some(1.0));
        let mut bad = lines.clone();
        bad.push(l(1.3, "s2mmu-dirtier: FAIL memory thread=0 page=3"));
        assert_eq!(pages_lost(&bad), Some(1));
        assert_eq!(pages_lost(&lines[..3]), None);
    }

    #[test]
    fn stamped_lines_arrive_whole_and_bounded() {
        let lines: Lines = Arc::default();
        let long = "x".repeat(MAX_LINE + 10);
        let text = format!("one\ntwo\r\n{long}\n");
        let h = stamp(std::io::Cursor::new(text.into_bytes()), lines.clone()).unwrap();
        h.join().unwrap();
        let got = snapshot(&lines);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].line, "one");
        assert_eq!(got[1].line, "two");
        assert_eq!(got[2].line.len(), MAX_LINE);
        assert!(got[0].at <= got[2].at);
    }
}
