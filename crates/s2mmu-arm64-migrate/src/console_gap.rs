//! The guest's console across a migration as the host saw it: every line
//! a guest program printed (the kernel's messages left out), stamped when
//! its newline reached the UART ([`ConsoleBuffer::stamped_lines`]), source
//! then destination, and the largest gap between two lines in a row,
//! with where it falls: on the source, across the switch (the source's
//! last line to the destination's first) or on the destination. A gap
//! there is time the guest's service was not seen from outside; the
//! guest's own clock does not show the downtime (its virtual counter
//! continues from the pause).
//!
//! [`ConsoleBuffer::stamped_lines`]: s2mmu_arm64::linux::uart::ConsoleBuffer::stamped_lines

use s2mmu_arm64::linux::migrate::LinuxVm;
use std::time::Instant;

/// Which machine printed a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Printer {
    /// The source, before the switch.
    Source,
    /// The destination, after it.
    Destination,
}

/// Where the largest gap falls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GapPlace {
    /// Between two of the source's lines.
    Source,
    /// From the source's last line to the destination's first.
    Switch,
    /// Between two of the destination's lines.
    Destination,
}

impl GapPlace {
    /// The place in words.
    pub fn describe(self) -> &'static str {
        match self {
            GapPlace::Source => "on the source",
            GapPlace::Switch => "across the switch",
            GapPlace::Destination => "on the destination",
        }
    }
}

/// One line a guest program printed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GapLine {
    /// The machine that printed it.
    pub machine: Printer,
    /// Host seconds since the source's first program line.
    pub at_s: f64,
    /// Host milliseconds since the line before it (0 for the first).
    pub gap_ms: f64,
}

/// The guest programs' lines across a migration, in the order printed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConsoleGap {
    /// Every program line, the source's then the destination's.
    pub lines: Vec<GapLine>,
}

/// Whether `line` is a guest program's: not empty, not a kernel message
/// (`[ seconds] ...`).
fn program_line(line: &str) -> bool {
    let l = line.trim();
    let kernel = l.starts_with('[') && l[1..].trim_start().starts_with(char::is_numeric);
    !l.is_empty() && !kernel
}

/// The first whole line of the guest's programs in a console's `text`.
pub(crate) fn printed(text: &str) -> Option<String> {
    text[..text.rfind('\n').map_or(0, |i| i + 1)]
        .lines()
        .map(str::trim)
        .find(|l| program_line(l))
        .map(str::to_string)
}

impl ConsoleGap {
    /// [`ConsoleGap::of`] the consoles of machine `a` and `b`.
    pub(crate) fn of_machines(a: &LinuxVm, b: Option<&LinuxVm>) -> ConsoleGap {
        let b = b.map(|b| b.console().stamped_lines());
        ConsoleGap::of(&a.console().stamped_lines(), b.as_deref())
    }

    /// The program lines of the source's stamped console lines and the
    /// destination's (`None` when the destination ran in another process).
    pub fn of(source: &[(Instant, String)], dest: Option<&[(Instant, String)]>) -> ConsoleGap {
        let tagged = source
            .iter()
            .map(|l| (Printer::Source, l))
            .chain(
                dest.unwrap_or(&[])
                    .iter()
                    .map(|l| (Printer::Destination, l)),
            )
            .filter(|(_, (_, text))| program_line(text));
        let mut lines = Vec::new();
        let mut first: Option<Instant> = None;
        let mut prev: Option<Instant> = None;
        for (machine, &(at, _)) in tagged {
            let t0 = *first.get_or_insert(at);
            let gap = prev.map_or(0.0, |p| at.saturating_duration_since(p).as_secs_f64() * 1e3);
            prev = Some(at);
            lines.push(GapLine {
                machine,
                at_s: at.saturating_duration_since(t0).as_secs_f64(),
                gap_ms: gap,
            });
        }
        ConsoleGap { lines }
    }

    /// The line that ends the largest gap, and where the gap falls;
    /// `None` with fewer than two lines.
    pub fn largest(&self) -> Option<(GapLine, GapPlace)> {
        let (i, l) = self
            .lines
            .iter()
            .enumerate()
            .skip(1)
            .max_by(|a, b| a.1.gap_ms.total_cmp(&b.1.gap_ms))?;
        let place = match (self.lines[i - 1].machine, l.machine) {
            (Printer::Source, Printer::Source) => GapPlace::Source,
            (Printer::Source, Printer::Destination) => GapPlace::Switch,
            _ => GapPlace::Destination,
        };
        Some((*l, place))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_largest_gap_and_its_place() {
        let t = Instant::now();
        let at = |ms: u64, s: &str| (t + Duration::from_millis(ms), s.to_string());
        let a = [
            at(0, "[    1.0] kernel"),
            at(100, "s2mmu-dirtier: start"),
            at(102, "s2mmu-dirtier: t=0.002s"),
            at(150, "s2mmu-dirtier: t=0.004s"),
            at(151, ""),
        ];
        let b = [at(400, "ages=20"), at(402, "s2mmu-dirtier: t=0.006s")];
        let g = ConsoleGap::of(&a, Some(&b));
        assert_eq!(g.lines.len(), 5, "the kernel's and empty lines left out");
        assert_eq!(g.lines[0].at_s, 0.0);
        let (l, place) = g.largest().unwrap();
        assert_eq!(place, GapPlace::Switch);
        assert_eq!(l.machine, Printer::Destination);
        assert!((l.gap_ms - 250.0).abs() < 1e-6, "{}", l.gap_ms);
        assert!((l.at_s - 0.3).abs() < 1e-9);
        // The source alone: its own largest gap.
        let (l, place) = ConsoleGap::of(&a, None).largest().unwrap();
        assert_eq!(place, GapPlace::Source);
        assert!((l.gap_ms - 48.0).abs() < 1e-6);
        assert_eq!(ConsoleGap::of(&a[..2], None).largest(), None);
    }
}
