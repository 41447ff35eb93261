//! The benchmark's vocabulary: a cell of the matrix, what a run is given
//! ([`Spec`]) and what each side's run measured ([`Measured`]).

use super::console;
use super::link::LinkSpec;
use std::path::PathBuf;

/// The migration starts at least this long after the guest program's
/// first line: QEMU's side is started then, and `s2mmu migrate --guest
/// linux` waits so long and then for its machine B, so that its own report
/// says when it started.
pub const WARMUP_S: f64 = 2.0;
/// The window before the migration the guest's own rate is taken over: a
/// whole second, as [`MIN_DURING_S`], because the idle guest writes its
/// pages in one burst a second, and a window of whole seconds (on the
/// guest's clock) holds as many bursts wherever it starts.
pub const BEFORE_S: f64 = 1.0;
/// The shortest window the rate during the migration is taken over for
/// the idle cell, whose guest writes in bursts of 64 pages (a shorter
/// window measures its bursts, not its rate). The writing cells take the
/// migration's own window: padding it with time after the end would
/// favour the side whose migration is shorter.
pub const MIN_DURING_S: f64 = 1.0;

/// A cell of the matrix: what the guest does, and how it is moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Cell {
    /// Near idle: 64 pages a second over 1 MiB.
    Idle,
    /// Writing 64 MiB/s over 64 MiB, pre-copy.
    Write64,
    /// Writing as fast as it can over 64 MiB, pre-copy.
    WriteMax,
    /// Writing 64 MiB/s, post-copy after the first pass on both sides.
    Postcopy,
}

impl Cell {
    /// Every cell, the matrix's default.
    pub const ALL: [Cell; 4] = [Cell::Idle, Cell::Write64, Cell::WriteMax, Cell::Postcopy];

    /// Its name in the report and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Cell::Idle => "idle",
            Cell::Write64 => "write-64m",
            Cell::WriteMax => "write-max",
            Cell::Postcopy => "postcopy",
        }
    }

    /// The cell named `s`.
    pub fn parse(s: &str) -> Option<Cell> {
        Cell::ALL.into_iter().find(|c| c.name() == s)
    }

    /// The dirtier's arguments for a run of `secs` seconds.
    pub fn program_args(self, secs: u64) -> String {
        let what = match self {
            Cell::Idle => "pages=256,rate=64",
            Cell::Write64 | Cell::Postcopy => "mem=64,rate=16384",
            Cell::WriteMax => "mem=64,rate=0",
        };
        format!("{what},file=0,secs={secs},tick=2")
    }

    /// Whether both sides switch to post-copy.
    pub fn postcopy(self) -> bool {
        self == Cell::Postcopy
    }
}

/// What the benchmark runs.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Cells, each over every link.
    pub cells: Vec<Cell>,
    /// Links.
    pub links: Vec<LinkSpec>,
    /// Runs of each side per cell and link.
    pub runs: u32,
    /// Guest RAM, MiB.
    pub mem_mib: u64,
    /// Guest vCPUs.
    pub vcpus: u32,
    /// How long the guest program runs (it must outlast the migration).
    pub guest_secs: u64,
    /// Our side's `--dirty`: `hw` (hardware dirty state) or `wp` (write
    /// protection).
    pub ours_dirty: String,
    /// Our side's `--compress`: `auto` (`migrate`'s default), `lz4` or
    /// `off`.
    pub ours_compress: String,
    /// The `s2mmu` binary our side runs.
    pub s2mmu: PathBuf,
    /// The kernel `Image` and initramfs both sides boot.
    pub kernel: PathBuf,
    /// See `kernel`.
    pub initrd: PathBuf,
    /// `scripts/` (netns-link.sh, netns_delay_relay.py).
    pub scripts: PathBuf,
    /// QEMU's pre-copy across namespaces over TLS with a pre-shared key
    /// (as ours); plain TCP when false. Its post-copy there is always TLS.
    pub qemu_precopy_tls: bool,
    /// Where each QEMU's stderr and exit status are kept, a folder per
    /// link, cell and run.
    pub logs: PathBuf,
}

/// One side's run.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Measured {
    /// Pause on the source to the guest running on the destination, ms
    /// (ours: to the destination's first guest instruction, on the
    /// host's one clock).
    pub downtime_ms: f64,
    /// Ours only: the pause to the destination's RESUMED read back at the
    /// source (the reply's way back included), ms.
    pub downtime_resumed_ms: Option<f64>,
    /// The migration's start (connecting included) to the source's last
    /// byte of it sent (the vCPU state, or post-copy's last page), ms:
    /// QEMU's `total-time`, and ours over the same span. The destination's
    /// load and start after that byte are in neither.
    pub total_ms: f64,
    /// The migration's start to the guest running on the destination, ms
    /// (QEMU's: the `migrate` command to the destination's RESUME event;
    /// ours: the setup, pre-copy and the downtime to the destination's
    /// first guest instruction).
    pub to_running_ms: Option<f64>,
    /// Ours only: the part of [`Measured::total_ms`] before round 0
    /// (connecting, TLS, HEADER, ACCEPT, JOINs, the link probe), ms.
    pub setup_ms: Option<f64>,
    /// Bytes the side's migration stream carried.
    pub wire_bytes: u64,
    /// Ours only: pages sent compressed, and the bytes that saved.
    pub compressed_pages: Option<u64>,
    pub saved_bytes: Option<u64>,
    /// The largest gap between the guest's console lines during the
    /// migration (and the second after it), ms.
    pub gap_ms: Option<f64>,
    /// Pages the guest's own check found lost (`None`: it did not say).
    pub pages_lost: Option<u64>,
    /// The guest's pages per second before the migration.
    pub rate_before: Option<f64>,
    /// The guest's pages per second during it.
    pub rate_during: Option<f64>,
    /// Why the run failed, if it did (its figures are then zero).
    pub error: Option<String>,
    /// Where the run's process logs (QEMU's stderr and exit status) are.
    pub logs: Option<String>,
}

impl Measured {
    /// A failed run.
    pub fn failed(why: String) -> Measured {
        Measured {
            error: Some(why),
            ..Measured::default()
        }
    }

    /// The console figures of a run of `cell` whose migration started at
    /// `t0` and took `total_ms`, from its stamped lines; `paused`: the
    /// source's pause and the destination's resume (host seconds), if
    /// known. The work rates are counted on the guest's clock
    /// ([`console::GuestClock`]), fitted to the lines before `t0`.
    pub fn read_console(
        &mut self,
        cell: Cell,
        lines: &[console::Stamped],
        t0: f64,
        paused: Option<(f64, f64)>,
    ) {
        let ticks = console::ticks(lines);
        let end = t0 + self.total_ms / 1e3;
        self.gap_ms = console::largest_gap(&ticks, t0, end + 1.0).map(|g| g * 1e3);
        self.pages_lost = console::pages_lost(lines);
        let Some(clock) = console::GuestClock::fit(&ticks, t0 - BEFORE_S, t0, paused) else {
            return;
        };
        self.rate_before = clock.rate(t0 - BEFORE_S, t0);
        let window = if cell == Cell::Idle {
            end.max(t0 + MIN_DURING_S)
        } else {
            end
        };
        self.rate_during = clock.rate(t0, window);
    }
}

/// Every run of one cell over one link.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CellRuns {
    /// The link's name.
    pub link: &'static str,
    /// How its RTT was made ("netem", "relay", "none").
    pub latency: &'static str,
    /// How each side's stream travelled ("TLS-PSK" or "plain TCP").
    pub transport: String,
    /// The cell.
    pub cell: Cell,
    /// Our runs.
    pub ours: Vec<Measured>,
    /// QEMU's runs.
    pub qemu: Vec<Measured>,
}
