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

/// One of the dirtier's progress lines (`s2mmu-dirtier: t=S.SSSs ...
/// pages=N`): when the host read it, and the guest's own clock and page
/// count as the guest printed it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tick {
    /// Host wall-clock seconds at the line's arrival.
    pub at: f64,
    /// The guest's clock at the print, seconds since the program started.
    pub guest_s: f64,
    /// Pages the program had written at the print.
    pub pages: u64,
}

/// The dirtier's progress lines, in arrival order.
pub fn ticks(lines: &[Stamped]) -> Vec<Tick> {
    let mut v: Vec<Tick> = lines
        .iter()
        .filter_map(|l| {
            let rest = l.line.split("s2mmu-dirtier: t=").nth(1)?;
            let guest_s = rest.split('s').next()?.parse().ok()?;
            let n = rest.split(" pages=").nth(1)?.split_whitespace().next()?;
            Some(Tick {
                at: l.at,
                guest_s,
                pages: n.parse().ok()?,
            })
        })
        .collect();
    v.sort_by(|a, b| a.at.total_cmp(&b.at));
    v
}

/// The largest gap (seconds) between consecutive ticks where the later
/// tick falls in `[from, to]`, as the host read them.
pub fn largest_gap(ticks: &[Tick], from: f64, to: f64) -> Option<f64> {
    ticks
        .windows(2)
        .filter(|w| w[1].at >= from && w[1].at <= to)
        .map(|w| w[1].at - w[0].at)
        .max_by(f64::total_cmp)
}

/// How long after the resume the destination's lines fit its clock.
const FIT_AFTER_S: f64 = 1.0;

/// The guest's clock against the host's, fitted from its progress lines.
///
/// The work rate is taken on the guest's clock, not from when the host
/// read each line: a line reaches the host late by the console's delay,
/// which differs between the two emulations (each character a trapped
/// UART write on ours, a few ms more while a migration loads the host)
/// and would move a short window's count by a line's worth of pages. A
/// line is never read before it is printed, so the least lag of a span
/// of lines is the clocks' offset (plus the console's quickest delivery,
/// the same at both ends of a window). Both migrations stop the guest's
/// clock while it is paused (CNTVOFF on ours, the stopped virtual clock
/// on QEMU's): the pause to the resume is time without work, and the
/// destination's lines are fitted on their own.
#[derive(Clone, Debug, PartialEq)]
pub struct GuestClock {
    /// Host time minus guest time before the pause.
    before: f64,
    /// The pause and the resume on the host's clock, and host minus
    /// guest time after the resume.
    paused: Option<(f64, f64, f64)>,
    /// The lines it was fitted to, in the guest's time order.
    by_guest: Vec<Tick>,
}

impl GuestClock {
    /// Fits the clock to the lines read in `[from, to]` (before the
    /// pause), and to the destination's first second after `pause`'s
    /// resume (`(pause, resume)` on the host's clock). Without lines after
    /// the resume the guest's clock is taken to have stood still over the
    /// pause. `None` without lines in `[from, to]`.
    pub fn fit(
        ticks: &[Tick],
        from: f64,
        to: f64,
        pause: Option<(f64, f64)>,
    ) -> Option<GuestClock> {
        let least_lag = |a: f64, b: f64| {
            ticks
                .iter()
                .filter(|k| k.at >= a && k.at <= b)
                .map(|k| k.at - k.guest_s)
                .min_by(f64::total_cmp)
        };
        let before = least_lag(from, to)?;
        let paused = pause.map(|(p, r)| {
            let r = r.max(p);
            let after = least_lag(r, r + FIT_AFTER_S).unwrap_or(before + (r - p));
            (p, r, after)
        });
        let mut by_guest = ticks.to_vec();
        by_guest.sort_by(|a, b| a.guest_s.total_cmp(&b.guest_s));
        Some(GuestClock {
            before,
            paused,
            by_guest,
        })
    }

    /// The guest's clock at host time `t`: held at the pause until the
    /// resume, never going back.
    pub fn guest_at(&self, t: f64) -> f64 {
        match self.paused {
            Some((p, r, after)) if t >= r => (t - after).max(p - self.before),
            Some((p, _, _)) if t >= p => p - self.before,
            _ => t - self.before,
        }
    }

    /// The program's pages per second of host time over `[from, to]`
    /// (host seconds), counted on this clock.
    pub fn rate(&self, from: f64, to: f64) -> Option<f64> {
        if to <= from {
            return None;
        }
        let a = pages_at(&self.by_guest, self.guest_at(from))?;
        let b = pages_at(&self.by_guest, self.guest_at(to))?;
        Some((b - a).max(0.0) / (to - from))
    }
}

/// Pages the program had written at guest time `g`: interpolated between
/// the last tick printed at or before it and the next (the last tick's
/// count where none follows). `ticks` in the guest's time order.
fn pages_at(ticks: &[Tick], g: f64) -> Option<f64> {
    let i = ticks.iter().rposition(|k| k.guest_s <= g)?;
    let (g0, n0) = (ticks[i].guest_s, ticks[i].pages as f64);
    Some(match ticks.get(i + 1) {
        Some(k) if k.guest_s > g0 => n0 + (k.pages as f64 - n0) * (g - g0) / (k.guest_s - g0),
        _ => n0,
    })
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

    /// A progress line printed at guest time `g` with `pages`, read at `at`.
    fn tick(at: f64, g: f64, pages: u64) -> Stamped {
        l(
            at,
            &format!("s2mmu-dirtier: t={g:.3}s passes=0 pages={pages}"),
        )
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
        assert_eq!(t[2].guest_s, 0.104);
        let gap = largest_gap(&t, 1.0, 2.0).unwrap();
        assert!((gap - 0.1).abs() < 1e-9, "{gap}");
        assert_eq!(largest_gap(&t, 1.105, 1.2), Some(1.108 - 1.104));
        let clock = GuestClock::fit(&t, 1.0, 1.2, None).unwrap();
        let r = clock.rate(1.002, 1.108).unwrap();
        assert!((r - 530.0 / 0.106).abs() < 1e-6, "{r}");
        assert_eq!(clock.rate(0.5, 1.1), None);
        // Between ticks the count is interpolated: half way from 20 (at
        // 0.004) to 520 (at 0.104) is 270; past the last tick, its count.
        let r = clock.rate(1.054, 1.2).unwrap();
        assert!((r - (540.0 - 270.0) / 0.146).abs() < 1e-6, "{r}");
        assert_eq!(GuestClock::fit(&t, 2.0, 3.0, None), None);
        assert_eq!(pages_lost(&lines), Some(0));
        assert_eq!(first(&lines, "dirtier: start"), Some(1.0));
        let mut bad = lines.clone();
        bad.push(l(1.3, "s2mmu-dirtier: FAIL memory thread=0 page=3"));
        assert_eq!(pages_lost(&bad), Some(1));
        assert_eq!(pages_lost(&lines[..3]), None);
    }

    /// A guest writing 1,000 pages a second of its clock, a line every
    /// 10 ms, read 1 ms after it is printed; its clock is host time
    /// minus 100 s. `late` holds the lines printed in `[2.0, 2.1)` (host
    /// time) back until 2.1, as a console that stalls for 100 ms.
    fn steady(late: bool) -> Vec<Tick> {
        let lines: Vec<Stamped> = (0..300)
            .map(|i| {
                let printed = 1.0 + i as f64 * 0.01;
                let read = if late && (2.0..2.1).contains(&printed) {
                    2.1
                } else {
                    printed + 0.001
                };
                tick(read, printed - 100.0, i * 10)
            })
            .collect();
        ticks(&lines)
    }

    #[test]
    fn a_late_console_does_not_move_the_rate() {
        for late in [false, true] {
            let t = steady(late);
            let clock = GuestClock::fit(&t, 1.0, 1.9, None).unwrap();
            let r = clock.rate(2.0, 2.06).unwrap();
            assert!((r - 1000.0).abs() < 1e-6, "late {late}: {r}");
        }
        // The same window read from when the lines arrived: the late lines
        // put no work in it at all.
        let t = steady(true);
        let arrived: Vec<Tick> = t
            .iter()
            .map(|k| Tick {
                guest_s: k.at,
                ..*k
            })
            .collect();
        let by_arrival = GuestClock::fit(&arrived, 1.0, 1.9, None).unwrap();
        let r = by_arrival.rate(2.0, 2.06).unwrap();
        assert!(r < 500.0, "{r}");
    }

    #[test]
    fn a_pause_is_time_without_work_and_a_slow_guest_shows() {
        // Paused from 2.0 to 2.1 (host time); the destination's clock goes
        // on from the pause, its lines read 1 ms after their print as before.
        let mut lines = Vec::new();
        for i in 0..300 {
            let host = 1.0 + i as f64 * 0.01;
            let read = if host < 2.0 {
                host + 0.001
            } else {
                host + 0.1 + 0.001
            };
            lines.push(tick(read, host - 1.0, i * 10));
        }
        let t = ticks(&lines);
        let clock = GuestClock::fit(&t, 1.0, 1.9, Some((2.0, 2.1))).unwrap();
        // Held at the pause: the guest's 1.0, less the console's 1 ms.
        assert!((clock.guest_at(2.05) - 0.999).abs() < 1e-9);
        // 0.1 s of work before the pause and 0.1 s after it in 0.3 s.
        let r = clock.rate(1.9, 2.2).unwrap();
        assert!((r - 200.0 / 0.3).abs() < 1e-6, "{r}");
        // Without lines after the resume the clock stood still over the
        // pause, as both migrations keep it.
        let before: Vec<Tick> = t.iter().copied().filter(|k| k.at < 2.0).collect();
        let alone = GuestClock::fit(&before, 1.0, 1.9, Some((2.0, 2.1))).unwrap();
        assert!((alone.guest_at(2.2) - clock.guest_at(2.2)).abs() < 1e-9);
        // A guest that does half its work per second of its clock.
        let slow: Vec<Tick> = t
            .iter()
            .map(|k| Tick {
                pages: k.pages / 2,
                ..*k
            })
            .collect();
        let slow_clock = GuestClock::fit(&slow, 1.0, 1.9, Some((2.0, 2.1))).unwrap();
        assert_eq!(slow_clock.guest_at(2.2), clock.guest_at(2.2));
        let r = slow_clock.rate(1.9, 2.2).unwrap();
        assert!((r - 100.0 / 0.3).abs() < 1.0, "{r}");
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
