//! The migration measured against the wire: one run of one cell (TLS or
//! not, a channel count) moves the guest three ways, back to back: iperf3
//! over loopback with as many connections and bytes (where installed), the
//! memory floor (the guest's size, at most [`FLOOR_CAP`], moved from one
//! memory region into another over as many loopback connections by the
//! kernel's copies alone, and for TLS ring's AES-128-GCM records alone:
//! what round 0 could reach at best), then the migration, which first
//! is preceded by plain TCP between the same endpoints. A [`WireCell`]
//! holds a cell's runs and their medians. The references beside the
//! migration are this module's probes: [`iperf`], [`memory_floor`](mod@memory_floor)
//! and [`plain_probe`].

use s2mmu_migrate::sim::dest::SimDestConfig;
use s2mmu_migrate::sim::in_process::migrate_in_process;
use s2mmu_migrate::sim::source::SimRun;
use s2mmu_migrate::transport::{ephemeral_tls, NetConfig, Security};
use s2mmu_migrate::wire::PAGE_SIZE;
use std::time::Duration;

pub mod iperf;
pub mod memory_floor;
pub mod plain_probe;

use memory_floor::{memory_floor, FloorCipher};
use plain_probe::plain_link_in_process;

/// The most bytes the memory floor moves: it holds two regions of its
/// size, and 2 GiB is far beyond any cache, so a larger guest's floor
/// reads the same while a machine with room for the guest but not for two
/// more of it can still run the bench.
pub const FLOOR_CAP: u64 = 2 << 30;

/// One run's figures: iperf3 and plain TCP, the stack's link, round 0
/// (bytes per second), downtime (ms), and the CPU ns per page on each side.
#[derive(Clone, Copy, Debug)]
pub struct WireRun {
    /// iperf3's bytes a second (None where it did not run).
    pub iperf3: Option<f64>,
    /// Plain TCP between the migration's endpoints ([`plain_probe`]),
    /// bytes a second.
    pub plain: f64,
    /// The memory floor: bytes a second, and its CPU a page on each side.
    pub floor: f64,
    /// The memory floor's source CPU ns a page.
    pub floor_send_ns: f64,
    /// The memory floor's destination CPU ns a page.
    pub floor_recv_ns: f64,
    /// The stack's link, bytes a second.
    pub link: f64,
    /// Round 0's bandwidth, bytes a second.
    pub round0: f64,
    /// Guest memory round 0 moved, bytes a second (its pages in full,
    /// whatever compression made of them on the wire): the figure to set
    /// against the memory floor when pages went compressed.
    pub round0_memory: f64,
    /// Pages the migration sent compressed.
    pub compressed_pages: u64,
    /// The migration's downtime in ms.
    pub downtime_ms: f64,
    /// The source's stream CPU ns a page.
    pub send_cpu_ns: f64,
    /// The destination's stream CPU ns a page.
    pub recv_cpu_ns: f64,
    /// The channels the migration ran with (`auto`'s choice).
    pub chosen: u16,
}

impl WireRun {
    /// Cores both ends' stream threads kept busy in round 0: their CPU a
    /// page times round 0's pages a second (2 = this machine's all).
    #[must_use]
    pub fn cores(&self) -> f64 {
        (self.send_cpu_ns + self.recv_cpu_ns) * self.round0 / PAGE_SIZE as f64 / 1e9
    }
}

/// A cell: TLS or not, a channel count, its runs.
#[derive(Clone, Debug)]
pub struct WireCell {
    /// Whether the cell's runs use TLS.
    pub tls: bool,
    /// The channel count asked for (the caller's `auto` value included).
    pub channels: u16,
    /// The cell's runs, in order.
    pub runs: Vec<WireRun>,
}

/// The median (0 for no runs, which no cell has).
fn median_or_zero(v: Vec<f64>) -> f64 {
    crate::stats::median(&v).unwrap_or(0.0)
}

impl WireCell {
    /// The median of one figure over the runs.
    pub fn med(&self, f: impl Fn(&WireRun) -> f64) -> f64 {
        median_or_zero(self.runs.iter().map(f).collect())
    }
    /// The median of each run's iperf3 figure (None without iperf3).
    #[must_use]
    pub fn iperf3(&self) -> Option<f64> {
        let v: Option<Vec<f64>> = self.runs.iter().map(|r| r.iperf3).collect();
        v.map(median_or_zero)
    }
    /// Each run's round 0 as a percentage of its plain TCP.
    #[must_use]
    pub fn pct_plain(&self) -> Vec<f64> {
        let pct = |r: &WireRun| 100.0 * r.round0 / r.plain.max(1.0);
        self.runs.iter().map(pct).collect()
    }
    /// Each run's round 0 as a percentage of its memory floor.
    #[must_use]
    pub fn pct_floor(&self) -> Vec<f64> {
        self.runs
            .iter()
            .map(|r| 100.0 * r.round0 / r.floor.max(1.0))
            .collect()
    }
    /// Each run's memory floor as a percentage of its plain TCP.
    #[must_use]
    pub fn floor_pct_plain(&self) -> Vec<f64> {
        self.runs
            .iter()
            .map(|r| 100.0 * r.floor / r.plain.max(1.0))
            .collect()
    }
    /// Each run's round 0 as a percentage of its iperf3 (None without).
    #[must_use]
    pub fn pct_iperf3(&self) -> Option<Vec<f64>> {
        let pct = |r: &WireRun| r.iperf3.map(|i| 100.0 * r.round0 / i.max(1.0));
        self.runs.iter().map(pct).collect()
    }
}

/// What one run of one cell measures.
#[derive(Clone, Copy, Debug)]
pub struct WireCase<'a> {
    /// Names the run in errors.
    pub what: &'a str,
    /// The guest's bytes.
    pub mem: u64,
    /// Every socket's deadline.
    pub io_timeout: Duration,
    /// Whether the migration and the floor use TLS.
    pub tls: bool,
    /// The connections iperf3 and the floor open.
    pub conns: u16,
    /// Whether iperf3 runs.
    pub iperf3: bool,
}

/// One run of one cell: iperf3 (when asked), the memory floor, plain TCP
/// between the migration's endpoints, then the migration; `configs` builds the migration's
/// source and destination just before it runs.
///
/// # Errors
/// iperf3, the floor, TLS set-up, `configs` or the migration failed (named
/// with `case.what`, as `configs`'s own errors are not).
pub fn measure(
    case: &WireCase<'_>,
    configs: impl FnOnce() -> Result<(SimRun, SimDestConfig), String>,
) -> Result<WireRun, String> {
    let what = case.what;
    let iperf3 = if case.iperf3 {
        // Bytes at 1 MiB/s, at least a minute: an iperf3 that hangs is
        // stopped, not waited for.
        let limit = Duration::from_secs(60 + case.mem / (1 << 20));
        Some(iperf::loopback(case.conns, case.mem, limit).map_err(|e| format!("{what}: {e}"))?)
    } else {
        None
    };
    // The floor moves whole 16 KiB records over each connection.
    let unit = 16 * 1024 * u64::from(case.conns);
    let cipher = if case.tls {
        FloorCipher::Aes128Gcm
    } else {
        FloorCipher::None
    };
    let floor_bytes = case.mem.min(FLOOR_CAP);
    let floor = memory_floor(
        case.conns,
        (floor_bytes / unit).max(1) * unit,
        cipher,
        case.io_timeout,
    )
    .map_err(|e| format!("{what}: memory floor: {e}"))?;
    let net = NetConfig {
        io_timeout: case.io_timeout,
        security: if case.tls {
            ephemeral_tls().map_err(|e| e.to_string())?
        } else {
            Security::Plain
        },
    };
    let (cfg, dcfg) = configs()?;
    // Back to back with the migration: loopback, the same socket settings
    // and connection count, as many bytes as the stack's own link probe.
    let plain = plain_link_in_process(&cfg, &net).map_err(|e| format!("{what}: plain TCP: {e}"))?;
    let (s, d) = migrate_in_process(&cfg, &dcfg, &net).map_err(|e| format!("{what}: {e}"))?;
    let per_page = |ns: u64, pages: u64| ns as f64 / pages.max(1) as f64;
    Ok(WireRun {
        iperf3,
        plain: plain.bytes_per_s(),
        floor: floor.bytes_per_s(),
        floor_send_ns: floor.send_ns_per_page(),
        floor_recv_ns: floor.recv_ns_per_page(),
        link: s.link,
        round0: s.rounds.first().map_or(0.0, |r| r.bandwidth),
        round0_memory: s.rounds.first().map_or(0.0, |r| r.page_rate),
        compressed_pages: s.compressed.pages,
        downtime_ms: s.downtime.as_secs_f64() * 1e3,
        send_cpu_ns: per_page(s.send_stages.cpu_ns, s.send_stages.pages),
        recv_cpu_ns: per_page(d.recv_stages.cpu_ns, d.recv_stages.pages),
        chosen: s.channels,
    })
}
