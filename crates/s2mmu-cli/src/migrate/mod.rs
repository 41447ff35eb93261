//! `s2mmu migrate`: a pre-copy live migration of a running guest over TCP.
//!
//! By default the source and the destination run in one process (two
//! threads over loopback TCP, mutual TLS with an ephemeral identity);
//! `--listen ADDR` runs only a destination and `--to ADDR` only a source,
//! for two processes ([`net`]: TLS from files or a pre-shared key, a
//! deadline on every read and write). The stream is our own versioned
//! format ([`wire`]) with a checksum on every page and record, spread over
//! `--channels` connections; the destination checks it against its own
//! limits, resumes the guest only from a complete, valid stream ([`dest`]),
//! and the source then checks the destination's memory against its own
//! ([`source`]).

pub mod bandwidth;
pub mod checks;
pub mod dest;
pub mod error;
pub mod extras;
pub mod hash;
pub mod net;
pub mod plot;
pub mod postcopy;
pub mod source;
pub mod timeline;
pub mod wire;

use crate::limits;
use crate::progress::Progress;
use crate::report::{human_bytes, parse_size, Report};
use dest::{serve, DestConfig, DestOutcome, Limits};
use error::MigrateError;
use net::{NetConfig, Security};
use postcopy::Postcopy;
use s2mmu::mmu::{FaultPath, MmuPolicy};
use s2mmu_vm::{Backing, Pattern};
use serde_json::json;
use source::{migrate_source, Converge, Harvest, SourceConfig, SourceOutcome};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Access pattern option.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatternArg {
    /// Every page of a vCPU's region in turn (memstress).
    Sequential,
    /// Pages at random in the region.
    Random,
}

/// Harvest option.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum HarvestArg {
    /// Dirty bitmap: GET per round, CLEAR per chunk before sending it.
    Bitmap,
    /// Per-vCPU dirty rings.
    Ring,
}

/// Split option.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitArg {
    /// Split huge mappings when logging starts.
    Eager,
    /// Split them on the first write fault.
    OnFault,
}

/// Convergence option.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvergeArg {
    /// Throttle the vCPUs (QEMU auto-converge).
    Auto,
    /// Cap each vCPU's dirty rate (QEMU dirty-limit).
    DirtyLimit,
    /// No help: fail at the round limit.
    None,
}

/// Post-copy option.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostcopyArg {
    /// Switch right after round 0.
    On,
    /// Switch when pre-copy is not converging (instead of throttling).
    Auto,
}

/// Options of `s2mmu migrate`.
#[derive(clap::Args, Clone, Debug)]
pub struct Params {
    /// Guest memory (K/M/G suffixes; 4K to 64G).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub mem: u64,
    /// vCPUs running the workload (1 to 256).
    #[arg(short = 'v', long, default_value_t = 2)]
    pub vcpus: usize,
    /// Backing of guest memory (selftests' names).
    #[arg(short = 's', long, default_value = "anonymous_thp")]
    pub backing: String,
    /// Memslots (1 to 512).
    #[arg(short = 'x', long, default_value_t = 1)]
    pub slots: u32,
    /// Bytes per second the guest dirties, all vCPUs together (0: as fast as it can; at most 1T).
    #[arg(long, default_value = "64M", value_parser = limits::size_in(0..=MAX_RATE))]
    pub dirty_rate: u64,
    /// The guest's access pattern.
    #[arg(long, value_enum, default_value = "sequential")]
    pub pattern: PatternArg,
    /// How dirty pages are collected.
    #[arg(long, value_enum, default_value = "bitmap")]
    pub harvest: HarvestArg,
    /// Entries of each vCPU's dirty ring (with --harvest ring): a power of two, 64 to 65536.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(64..=65536))]
    pub ring_entries: u32,
    /// Bytes cleared per CLEAR_DIRTY_LOG call (with --harvest bitmap): 256K to 64G, rounded down to a multiple of 64 pages.
    #[arg(long, default_value = "64M", value_parser = limits::size_in(MIN_CLEAR_CHUNK..=wire::MAX_MEM))]
    pub clear_chunk: u64,
    /// MMU policy: write-lock faults and split on fault (MmuPolicy::baseline) instead of the read-lock fast path and eager split.
    #[arg(long)]
    pub baseline: bool,
    /// When huge mappings are split (default: the policy's).
    #[arg(long, value_enum)]
    pub split: Option<SplitArg>,
    /// Downtime budget (e.g. 300ms, 1s; at most a day); pre-copy stops once the rest is estimated to take half of it.
    #[arg(long, default_value = "300ms", value_parser = parse_duration)]
    pub max_downtime: Duration,
    /// Pre-copy rounds after the first before giving up (0 to 1000).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(0..=i64::from(MAX_ROUNDS)))]
    pub max_rounds: u32,
    /// Link limit in bytes per second (K/M/G suffixes; 0: none; at most 1T).
    #[arg(long, default_value = "0", value_parser = limits::size_in(0..=MAX_RATE))]
    pub bandwidth: u64,
    /// Convergence help when the guest dirties faster than the link drains.
    #[arg(long, value_enum, default_value = "auto")]
    pub converge: ConvergeArg,
    /// Also compare all of memory byte for byte after the resume.
    #[arg(long, conflicts_with = "postcopy")]
    pub verify_full: bool,
    /// Post-copy: resume on the destination after round 0 (`--postcopy`) or once pre-copy does not converge (`--postcopy auto`); pages not there yet are fetched when the guest faults on them.
    #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "on", value_name = "WHEN")]
    pub postcopy: Option<PostcopyArg>,
    /// How long the guest runs before logging starts (at most a day).
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    pub warmup: Duration,
    /// How long the destination runs the resumed guest (at most a day).
    #[arg(long, default_value = "300ms", value_parser = parse_duration)]
    pub run_after: Duration,
    /// SVG plot file ("" for none).
    #[arg(long, default_value = "s2mmu-migrate.svg")]
    pub plot: String,
    /// Run only a destination, listening on ADDR (host:port).
    #[arg(long, value_name = "ADDR", conflicts_with = "to")]
    pub listen: Option<String>,
    /// Run only a source, migrating to the destination at ADDR.
    #[arg(long, value_name = "ADDR")]
    pub to: Option<String>,
    /// Connections the pages are spread over (QEMU's multifd): N, or a list (1,2,4) to run once per count and print a table. Default: half the CPUs, 1 to 8. On --listen: the most it accepts (default 64).
    #[arg(long, value_name = "N[,N...]", value_parser = parse_channels)]
    pub channels: Option<ChannelCounts>,
    /// Deadline of every socket read and write (and the TCP keepalive idle time; 100ms to a day): a peer silent this long ends the migration.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub io_timeout: Duration,
    /// TLS: this side's certificate chain (PEM); with --tls-key and --tls-ca, mutual TLS 1.3.
    #[arg(long, value_name = "FILE", requires_all = ["tls_key", "tls_ca"], conflicts_with = "psk")]
    pub tls_cert: Option<PathBuf>,
    /// TLS: this side's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// TLS: the CA that signed the peer's certificate (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// TLS: the name the destination's certificate must carry (default: the host of --to; "localhost" in one process).
    #[arg(long, value_name = "NAME")]
    pub tls_name: Option<String>,
    /// Pre-shared key file (at least 16 bytes): TLS with ephemeral certificates, then HMAC-SHA256 challenge-response bound to the TLS session.
    #[arg(long, value_name = "FILE")]
    pub psk: Option<PathBuf>,
    /// Destination: do not back guest memory with RAM before the stream starts (the kernel then zeroes each page inside round 0).
    #[arg(long)]
    pub no_prefault: bool,
    /// In one process: plain TCP instead of TLS with an ephemeral identity (to measure what TLS costs).
    #[arg(long, conflicts_with_all = ["tls_cert", "psk", "listen", "to"])]
    pub no_tls: bool,
    /// With --listen: authenticated sources to serve before giving up after failed ones (a peer that fails authentication is refused and not counted); the destination exits after the first migration that succeeds.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub attempts: u32,
    /// Migrate twice, with MmuPolicy::default() and MmuPolicy::baseline(), and compare the guest slowdowns.
    #[arg(long, conflicts_with_all = ["listen", "to", "baseline"])]
    pub compare_policies: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// The lost-write check of every round: pages hashed after each harvest; a changed page no log reported fails the migration before the resume.
    #[arg(long)]
    pub check: bool,
    /// Test only: dirty marks to drop once logging is on (--check must catch them).
    #[arg(long, default_value_t = 0, hide = true)]
    pub inject_lost_marks: u64,
    /// Incremental snapshots of the running guest every this long, from a dirty view of their own (with --snapshot-dir).
    #[arg(long, value_parser = parse_duration, requires = "snapshot_dir")]
    pub snapshot_every: Option<Duration>,
    /// Where --snapshot-every writes (created; must hold no snapshot).
    #[arg(long, value_name = "DIR", requires = "snapshot_every")]
    pub snapshot_dir: Option<PathBuf>,
    /// No progress on stderr (the start line, the link, a line or a bar per round).
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

/// The most `--bandwidth` and `--dirty-rate` take: 1 TiB/s.
pub const MAX_RATE: u64 = 1 << 40;
/// The least `--clear-chunk` takes: 64 pages (one word of the bitmap).
pub const MIN_CLEAR_CHUNK: u64 = 64 * wire::PAGE_SIZE as u64;
/// The most `--max-rounds` takes.
pub const MAX_ROUNDS: u32 = 1000;

/// The channel counts of `--channels`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelCounts(pub Vec<u16>);

/// Parses `4` or `1,2,4` (1 to 64 each, at most 16 counts).
pub fn parse_channels(s: &str) -> Result<ChannelCounts, String> {
    let v: Vec<u16> = s
        .split(',')
        .map(|p| match p.trim().parse::<u16>() {
            Ok(n) if (1..=wire::MAX_CHANNELS).contains(&n) => Ok(n),
            _ => Err(format!(
                "invalid channel count '{p}': use 1 to {}",
                wire::MAX_CHANNELS
            )),
        })
        .collect::<Result<_, _>>()?;
    if v.is_empty() || v.len() > 16 {
        return Err(format!("'{s}': give 1 to 16 channel counts"));
    }
    Ok(ChannelCounts(v))
}

/// The default channel count: half the CPUs (the guest's vCPUs and the
/// other side need the rest), 1 to 8.
pub fn default_channels() -> u16 {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cpus / 2).clamp(1, 8) as u16
}

/// Parses `300ms`, `1.5s`, `250us` or a plain number of milliseconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        (t.as_str(), 1e-3)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid duration '{s}': expected e.g. 300ms, 1.5s or 250us"))?;
    if !v.is_finite() || v < 0.0 || v * scale > 86_400.0 {
        return Err(format!(
            "duration '{s}' is out of range: 0 to 86400s (a day)"
        ));
    }
    Ok(Duration::from_secs_f64(v * scale))
}

impl Params {
    /// The MMU policy these options ask for.
    pub fn policy(&self, baseline: bool) -> MmuPolicy {
        let mut p = if baseline {
            MmuPolicy::baseline()
        } else {
            MmuPolicy::default()
        };
        match self.split {
            Some(SplitArg::Eager) => p.eager_split_chunk = Some(1 << 30),
            Some(SplitArg::OnFault) => p.eager_split_chunk = None,
            None => {}
        }
        p
    }

    /// The source's configuration.
    ///
    /// # Errors
    /// A message naming the bad option.
    pub fn source_config(&self, baseline: bool) -> Result<SourceConfig, String> {
        let backing = Backing::parse(&self.backing)?;
        if self.vcpus == 0 || self.vcpus > 256 {
            return Err(format!("-v {}: use 1 to 256 vCPUs", self.vcpus));
        }
        if self.mem == 0 || self.mem > wire::MAX_MEM {
            return Err(format!(
                "--mem {}: use 1 page to {}",
                self.mem,
                human_bytes(wire::MAX_MEM)
            ));
        }
        if self.slots == 0 || self.slots > 512 {
            return Err(format!("-x {}: use 1 to 512 memslots", self.slots));
        }
        if self.io_timeout < Duration::from_millis(100) {
            return Err(format!(
                "--io-timeout {:?}: use at least 100ms",
                self.io_timeout
            ));
        }
        if !(64..=65536).contains(&self.ring_entries) || !self.ring_entries.is_power_of_two() {
            return Err(format!(
                "--ring-entries {}: use a power of two, 64 to 65536",
                self.ring_entries
            ));
        }
        Ok(SourceConfig {
            mem_size: self.mem,
            vcpus: self.vcpus,
            backing,
            slots: self.slots,
            policy: self.policy(baseline),
            harvest: match self.harvest {
                HarvestArg::Bitmap => Harvest::Bitmap,
                HarvestArg::Ring => Harvest::Ring,
            },
            ring_entries: self.ring_entries,
            clear_chunk: self.clear_chunk,
            dirty_rate: self.dirty_rate,
            pattern: match self.pattern {
                PatternArg::Sequential => Pattern::Sequential,
                PatternArg::Random => Pattern::Random,
            },
            max_downtime: self.max_downtime,
            max_rounds: self.max_rounds,
            bandwidth: self.bandwidth,
            converge: match self.converge {
                ConvergeArg::Auto => Converge::Auto,
                ConvergeArg::DirtyLimit => Converge::DirtyLimit,
                ConvergeArg::None => Converge::None,
            },
            verify_full: self.verify_full,
            warmup: self.warmup,
            sample_every: Duration::from_millis(50),
            progress: Arc::new(if self.quiet {
                Progress::off()
            } else {
                Progress::lines_only()
            }),
            label: String::new(),
            channels: self.channel_list()[0],
            postcopy: match self.postcopy {
                None => Postcopy::Off,
                Some(PostcopyArg::On) => Postcopy::On,
                Some(PostcopyArg::Auto) => Postcopy::Auto,
            },
            extras: extras::SourceExtras {
                check: self.check,
                inject_lost_marks: self.inject_lost_marks,
                snapshot_every: self.snapshot_every,
                snapshot_dir: self.snapshot_dir.clone(),
            },
        })
    }

    /// The channel counts to run.
    pub fn channel_list(&self) -> Vec<u16> {
        self.channels
            .clone()
            .map_or_else(|| vec![default_channels()], |c| c.0)
    }

    /// The destination's configuration: what it accepts is what these
    /// options say (--mem, -v, -x, and --channels when given).
    pub fn dest_config(&self, baseline: bool) -> DestConfig {
        DestConfig {
            policy: self.policy(baseline),
            run_after: self.run_after,
            limits: Limits {
                max_mem: self.mem,
                max_vcpus: self.vcpus as u32,
                max_slots: self.slots,
                max_channels: self
                    .channels
                    .as_ref()
                    .and_then(|c| c.0.iter().max().copied())
                    .unwrap_or(wire::MAX_CHANNELS),
            },
            io_timeout: self.io_timeout,
            progress: self.listen.is_some() && !self.quiet,
            prefault: !self.no_prefault,
        }
    }

    /// How connections are secured.
    ///
    /// # Errors
    /// A message naming the bad file or option.
    pub fn net_config(&self) -> Result<NetConfig, String> {
        let two_process = self.listen.is_some() || self.to.is_some();
        let security =
            if let (Some(c), Some(k), Some(a)) = (&self.tls_cert, &self.tls_key, &self.tls_ca) {
                let name = match (&self.tls_name, &self.to) {
                    (Some(n), _) => n.clone(),
                    (None, Some(to)) => host_of(to),
                    (None, None) => "localhost".into(),
                };
                net::tls_from_files(c, k, a, &name).map_err(|e| e.to_string())?
            } else if let Some(p) = &self.psk {
                net::psk_from_file(p).map_err(|e| e.to_string())?
            } else if two_process || self.no_tls {
                Security::Plain
            } else {
                net::ephemeral_tls().map_err(|e| e.to_string())?
            };
        if two_process && matches!(security, Security::Plain) {
            eprintln!(
                "WARNING: no --tls-cert/--tls-key/--tls-ca and no --psk: PLAIN TCP, NO AUTHENTICATION, NO ENCRYPTION.\n\
                 WARNING: anyone who can reach {} can {}; use this on a trusted network only.",
                self.listen.as_deref().or(self.to.as_deref()).unwrap_or("the peer"),
                if self.listen.is_some() {
                    "write this destination's guest memory and resume it"
                } else {
                    "receive this guest's memory"
                }
            );
        }
        Ok(NetConfig {
            io_timeout: self.io_timeout,
            security,
        })
    }
}

/// The host part of `host:port` (`[v6]:port` too).
fn host_of(addr: &str) -> String {
    let h = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    h.trim_start_matches('[').trim_end_matches(']').to_string()
}

/// Runs a whole migration in this process: a destination thread serving
/// a loopback port and the source connecting to it, both secured as `net`
/// says.
///
/// # Errors
/// The source's error when it failed (the destination's then follows from
/// it), otherwise the destination's.
pub fn migrate_in_process(
    cfg: &SourceConfig,
    dest: &DestConfig,
    net: &NetConfig,
) -> Result<(SourceOutcome, DestOutcome), MigrateError> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| MigrateError::io("listening on a loopback port", &e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| MigrateError::io("listening on a loopback port", &e))?;
    let (dcfg, dnet) = (dest.clone(), net.clone());
    let dest_thread = std::thread::Builder::new()
        .name("migrate-dest".into())
        .spawn(move || serve(&listener, &dcfg, &dnet))
        .map_err(|e| MigrateError::io("starting the destination thread", &e))?;
    let a = addr.to_string();
    let src = migrate_source(cfg, &mut |_| {
        let s = net::connect_tcp(&a, net)?;
        net::client(s, net)
    });
    if src.is_err() {
        // A destination still waiting for the source's first connection
        // (the source failed before connecting): unblock it.
        let _ = std::net::TcpStream::connect(addr);
    }
    let dst = dest_thread.join().unwrap_or_else(|_| {
        Err(MigrateError::Setup(
            "the destination thread panicked".into(),
        ))
    });
    match (src, dst) {
        (Ok(s), Ok(d)) => Ok((s, d)),
        (Err(e), _) | (Ok(_), Err(e)) => Err(e),
    }
}

/// `s2mmu migrate`.
///
/// # Errors
/// Why the migration failed (the process then exits nonzero).
pub fn main(p: Params) -> Result<(), String> {
    if let Some(addr) = &p.listen {
        return listen(&p, addr);
    }
    let policies: Vec<(bool, &str)> = if p.compare_policies {
        vec![(false, "fast_path"), (true, "baseline")]
    } else {
        vec![(
            p.baseline,
            if p.baseline { "baseline" } else { "fast_path" },
        )]
    };
    let channel_list = p.channel_list();
    if channel_list.len() > 1 && p.to.is_some() {
        return Err(
            "--to runs one migration (the destination exits after it): give one --channels count"
                .into(),
        );
    }
    if channel_list.len() > 1 && p.compare_policies {
        return Err("--compare-policies takes one --channels count".into());
    }
    let net = p.net_config()?;
    let mut runs: Vec<(String, SourceOutcome, Option<DestOutcome>, MmuPolicy)> = Vec::new();
    for (baseline, name) in &policies {
        for &channels in &channel_list {
            let mut cfg = p.source_config(*baseline)?;
            cfg.channels = channels;
            if p.compare_policies {
                cfg.label = format!("[{}] ", policy_label(&cfg.policy));
            } else if channel_list.len() > 1 {
                cfg.label = format!("[{channels} channel(s)] ");
            }
            let policy = cfg.policy;
            // Progress goes to stderr in every mode (--json's stdout is
            // unchanged), so no migration is silent until its end: a start
            // line, then the link and a line or a bar step per round.
            let bar = Progress::new(
                &format!("{}migrate", cfg.label),
                u64::from(cfg.max_rounds).saturating_add(2),
                !p.quiet,
            );
            if bar.is_on() {
                bar.line(&start_line(&cfg, p.to.as_deref(), &net));
            }
            cfg.progress = Arc::new(bar);
            let (s, d) = match &p.to {
                Some(addr) => (
                    migrate_source(&cfg, &mut |_| {
                        let s = net::connect_tcp(addr, &net)?;
                        net::client(s, &net)
                    })
                    .map_err(|e| e.to_string())?,
                    None,
                ),
                None => {
                    let mut dcfg = p.dest_config(*baseline);
                    dcfg.progress = false;
                    let (s, d) =
                        migrate_in_process(&cfg, &dcfg, &net).map_err(|e| e.to_string())?;
                    (s, Some(d))
                }
            };
            let name = if channel_list.len() > 1 {
                format!("{name}_channels_{channels}")
            } else {
                name.to_string()
            };
            runs.push((name, s, d, policy));
        }
    }
    if !p.plot.is_empty() {
        let plot_runs: Vec<plot::PlotRun<'_>> = runs
            .iter()
            .map(|(_, s, _, pol)| plot::PlotRun {
                label: policy_label(pol),
                outcome: s,
            })
            .collect();
        let title = format!(
            "s2mmu migrate: {} guest, {} vCPUs dirtying {}, {} harvest",
            human_bytes(p.mem),
            p.vcpus,
            rate_text(p.dirty_rate),
            harvest_name(p.harvest)
        );
        let svg = plot::svg(&title, &plot_runs)?;
        std::fs::write(&p.plot, svg).map_err(|e| format!("writing the plot {}: {e}", p.plot))?;
    }
    let report = report(&p, &runs);
    crate::report::emit(&report, p.json);
    report.failure().map_or(Ok(()), |why| Err(why.to_string()))
}

/// What a run migrates, where to and how: its first progress line.
fn start_line(cfg: &SourceConfig, to: Option<&str>, net: &NetConfig) -> String {
    format!(
        "{}migrating a {} guest ({}, {} vCPUs dirtying {}) {} over {} channel(s), {}",
        cfg.label,
        human_bytes(cfg.mem_size),
        cfg.backing.name(),
        cfg.vcpus,
        rate_text(cfg.dirty_rate),
        match to {
            Some(a) => format!("to {a}"),
            None => "over loopback TCP in this process".into(),
        },
        cfg.channels,
        net.security.describe()
    )
}

fn rate_text(r: u64) -> String {
    if r == 0 {
        "as fast as they can".into()
    } else {
        format!("{:.1} MiB/s", r as f64 / MIB)
    }
}

fn harvest_name(h: HarvestArg) -> &'static str {
    match h {
        HarvestArg::Bitmap => "bitmap",
        HarvestArg::Ring => "dirty ring",
    }
}

/// A policy in words.
pub fn policy_label(p: &MmuPolicy) -> &'static str {
    match (p.fault_path, p.eager_split_chunk.is_some()) {
        (FaultPath::ReadLockFastPath, true) => "read-lock fast path + eager split",
        (FaultPath::ReadLockFastPath, false) => "read-lock fast path, split on fault",
        (FaultPath::WriteLock, true) => "write-lock faults, eager split",
        (FaultPath::WriteLock, false) => "write-lock faults, split on fault (baseline)",
    }
}

fn listen(p: &Params, addr: &str) -> Result<(), String> {
    p.source_config(p.baseline)?;
    let net = p.net_config()?;
    let cfg = p.dest_config(p.baseline);
    let listener = TcpListener::bind(addr).map_err(|e| format!("listening on {addr}: {e}"))?;
    eprintln!(
        "destination listening on {} ({}); accepts at most {} of memory, {} vCPUs, {} slot(s), {} channel(s)",
        listener
            .local_addr()
            .map_or(addr.to_string(), |a| a.to_string()),
        net.security.describe(),
        human_bytes(cfg.limits.max_mem),
        cfg.limits.max_vcpus,
        cfg.limits.max_slots,
        cfg.limits.max_channels
    );
    let mut failures = 0;
    let d = loop {
        match serve(&listener, &cfg, &net) {
            Ok(d) => break d,
            Err(e @ MigrateError::Auth { .. }) => {
                eprintln!("refused a peer: {e}; nothing of it was read, still listening");
            }
            Err(e) => {
                failures += 1;
                if failures >= p.attempts {
                    return Err(format!(
                        "the migration failed ({failures} of --attempts {}): {e}",
                        p.attempts
                    ));
                }
                eprintln!(
                    "the migration failed ({failures} of --attempts {}): {e}; the guest was not resumed, serving the next source",
                    p.attempts
                );
            }
        }
    };
    let mut r = Report::new("migrate", params_json(p));
    r.result(
        "destination",
        policy_label(&p.policy(p.baseline)),
        dest_json(&d),
    );
    r.set_text(format!(
        "destination: received {} page records ({} zero pages, {:.1} MiB) over {} channel(s); guest resumed from {} memory and ran {} ms at {:.1} MiB/s\n{}{}",
        d.page_records,
        d.zero_pages,
        d.bytes as f64 / MIB,
        d.channels,
        match &d.postcopy {
            Some(f) => format!(
                "incomplete (post-copy: {} pages missing, {} remote faults, wait median {:.3} ms, p99 {:.3} ms, reference {:.3} ms, last page after {:.1} ms)",
                f.missing_pages,
                f.remote_faults,
                f.fault_median_ns as f64 / 1e6,
                f.fault_p99_ns as f64 / 1e6,
                f.reference_ns as f64 / 1e6,
                f.time_to_last_page_ns as f64 / 1e6
            ),
            None => "complete".into(),
        },
        p.run_after.as_millis(),
        d.resumed_write_rate * 4096.0 / MIB,
        digests_text(&d.slot_digests),
        match d.verify_mismatches {
            Some(0) => "byte comparison: every page equal\n".to_string(),
            Some(n) => format!("byte comparison: {n} pages DIFFER\n"),
            None => String::new(),
        }
    ));
    crate::report::emit(&r, p.json);
    match d.verify_mismatches {
        Some(n) if n > 0 => Err(format!(
            "VERIFICATION FAILED: {n} pages differ from the source's"
        )),
        _ => Ok(()),
    }
}

const MIB: f64 = (1u64 << 20) as f64;

fn digests_text(d: &[(u16, u64)]) -> String {
    d.iter()
        .map(|(id, h)| format!("  slot {id} digest {h:#018x}\n"))
        .collect()
}

fn params_json(p: &Params) -> serde_json::Value {
    json!({
        "mem_bytes": p.mem,
        "vcpus": p.vcpus,
        "backing": p.backing,
        "slots": p.slots,
        "dirty_rate_bytes_per_s": p.dirty_rate,
        "pattern": format!("{:?}", p.pattern).to_lowercase(),
        "harvest": format!("{:?}", p.harvest).to_lowercase(),
        "ring_entries": p.ring_entries,
        "clear_chunk_bytes": p.clear_chunk,
        "baseline": p.baseline,
        "split": p.split.map(|s| format!("{s:?}").to_lowercase()),
        "max_downtime_ns": p.max_downtime.as_nanos() as u64,
        "max_rounds": p.max_rounds,
        "bandwidth_bytes_per_s": p.bandwidth,
        "converge": format!("{:?}", p.converge).to_lowercase(),
        "verify_full": p.verify_full,
        "warmup_ns": p.warmup.as_nanos() as u64,
        "run_after_ns": p.run_after.as_nanos() as u64,
        "plot": p.plot,
        "listen": p.listen,
        "to": p.to,
        "compare_policies": p.compare_policies,
        "channels": p.channel_list(),
        "io_timeout_ns": p.io_timeout.as_nanos() as u64,
        "tls": p.tls_cert.is_some(),
        "psk": p.psk.is_some(),
        "no_tls": p.no_tls,
        "no_prefault": p.no_prefault,
        "postcopy": p.postcopy.map(|w| format!("{w:?}").to_lowercase()),
    })
}

fn dest_json(d: &DestOutcome) -> serde_json::Value {
    json!({
        "pages": d.page_records,
        "zero_pages": d.zero_pages,
        "bytes": d.bytes,
        "channels": d.channels,
        "probe_bytes": d.probe_bytes,
        "prefault_ns": d.prefault.as_nanos() as u64,
        "resumed": d.resumed_at.is_some(),
        "resumed_write_rate_pages_per_s": d.resumed_write_rate,
        "slot_digests": d.slot_digests.iter().map(|(i, h)| json!({"slot": i, "digest": format!("{h:#018x}")})).collect::<Vec<_>>(),
        "byte_compare_mismatched_pages": d.verify_mismatches,
        "postcopy": d.postcopy.as_ref().map(postcopy::report::figures_json),
    })
}

fn source_json(s: &SourceOutcome) -> serde_json::Value {
    json!({
        "converged": s.postcopy.is_none(),
        "switched_to_postcopy": s.postcopy.is_some(),
        "rounds": s.rounds.len(),
        "total_ns": s.total.as_nanos() as u64,
        "downtime_ns": s.downtime.as_nanos() as u64,
        "pages": s.page_records,
        "zero_pages": s.zero_pages,
        "bytes": s.bytes,
        "channels": s.channels,
        "link_bytes": s.link_bytes,
        "link_bytes_per_s": s.link,
        "round0_bytes_per_s": s.rounds.first().map(|r| r.bandwidth),
        "round0_pct_of_link": s.rounds.first().map(|r| 100.0 * r.bandwidth / s.link.max(1.0)),
        "pct_of_link_per_round": s.rounds.iter().map(|r| 100.0 * r.bandwidth / s.link.max(1.0)).collect::<Vec<_>>(),
        "pages_per_round": s.rounds.iter().map(|r| r.pages).collect::<Vec<_>>(),
        "dirty_rate_bytes_per_s_per_round": s.rounds.iter().filter(|r| !r.final_round).map(|r| r.dirty_rate).collect::<Vec<_>>(),
        "bandwidth_bytes_per_s_per_round": s.rounds.iter().map(|r| r.bandwidth).collect::<Vec<_>>(),
        "guest_write_rate_before_pages_per_s": s.before.write_rate,
        "guest_write_rate_logging_pages_per_s": s.during.write_rate,
        "guest_ns_per_write_before": s.before.ns_per_write,
        "guest_ns_per_write_logging": s.during.ns_per_write,
        "guest_slowdown_pct": s.slowdown_pct(),
        "max_throttle_pct": s.max_throttle_pct,
        "final_pace_pages_per_s_per_vcpu": s.final_pace,
        "memory_equal": true,
        "verified_full": s.verified_full,
        "slot_digests": s.slot_digests.iter().map(|(i, h)| json!({"slot": i, "digest": format!("{h:#018x}")})).collect::<Vec<_>>(),
        "postcopy": s.postcopy.as_ref().map(|pc| postcopy::report::json(pc, s)),
    })
}

fn report(p: &Params, runs: &[(String, SourceOutcome, Option<DestOutcome>, MmuPolicy)]) -> Report {
    let mut r = Report::new("migrate", params_json(p));
    let mut text = String::new();
    for (name, s, d, pol) in runs {
        let mut row = source_json(s);
        if let (Some(d), serde_json::Value::Object(m)) = (d, &mut row) {
            m.insert("destination".into(), dest_json(d));
        }
        r.result("migrate", name, row);
        text.push_str(&summary(p, s, d.as_ref(), pol));
        s.extras.add_to(&mut r, &mut text);
    }
    if p.compare_policies && runs.len() == 2 {
        let (a, b) = (&runs[0].1, &runs[1].1);
        r.compare(
            "migrate",
            "guest_ns_per_write_logging",
            b.during.ns_per_write,
            a.during.ns_per_write,
        );
        r.compare(
            "migrate",
            "downtime_ns",
            b.downtime.as_nanos() as f64,
            a.downtime.as_nanos() as f64,
        );
        r.compare(
            "migrate",
            "total_ns",
            b.total.as_nanos() as f64,
            a.total.as_nanos() as f64,
        );
        text.push_str(&format!(
            "\nGuest slowdown while logging, side by side\n  {:<46} {:>12} {:>12} {:>10} {:>10} {:>7}\n",
            "policy", "ns/write pre", "ns/write log", "slowdown", "downtime", "rounds"
        ));
        for (_, s, _, pol) in runs {
            text.push_str(&format!(
                "  {:<46} {:>12.0} {:>12.0} {:>9.0}% {:>8.1}ms {:>7}\n",
                policy_label(pol),
                s.before.ns_per_write,
                s.during.ns_per_write,
                s.slowdown_pct(),
                s.downtime.as_secs_f64() * 1e3,
                s.rounds.len()
            ));
        }
        let (fa, fb) = (a.during.ns_per_write, b.during.ns_per_write);
        text.push_str(&format!(
            "  fast path + eager split: {} guest time per write while logging than the baseline ({:.2}x)\n",
            if fa < fb { "less" } else { "NOT less" },
            fb / fa.max(1e-9)
        ));
    }
    if p.channel_list().len() > 1 && runs.len() > 1 {
        text.push_str(&format!(
            "\nRound 0 by channel count (measured on this machine, {} CPUs, this run)\n  {:>8} {:>12} {:>14} {:>10} {:>10} {:>8}\n",
            std::thread::available_parallelism().map_or(1, |n| n.get()),
            "channels", "link MiB/s", "round 0 MiB/s", "% of link", "downtime", "memory"
        ));
        for (_, s, _, _) in runs {
            let r0 = s.rounds.first().map_or(0.0, |r| r.bandwidth);
            text.push_str(&format!(
                "  {:>8} {:>12.0} {:>14.0} {:>9.0}% {:>8.1}ms {:>8}\n",
                s.channels,
                s.link / MIB,
                r0 / MIB,
                100.0 * r0 / s.link.max(1.0),
                s.downtime.as_secs_f64() * 1e3,
                "equal"
            ));
        }
    }
    if !p.plot.is_empty() {
        text.push_str(&format!("plot: {}\n", p.plot));
    }
    r.set_text(text);
    r
}

fn summary(p: &Params, s: &SourceOutcome, d: Option<&DestOutcome>, pol: &MmuPolicy) -> String {
    let precopy = s.rounds.iter().filter(|r| !r.final_round).count();
    let mut t = format!(
        "\nMigrated a {} guest ({}, {} slot(s)), {} vCPUs dirtying {} ({}), {} harvest, {}\n",
        human_bytes(p.mem),
        p.backing,
        p.slots,
        p.vcpus,
        rate_text(p.dirty_rate),
        format!("{:?}", p.pattern).to_lowercase(),
        harvest_name(p.harvest),
        policy_label(pol)
    );
    if let Some(pc) = &s.postcopy {
        t.push_str(&postcopy::report::text(pc, s, p.max_downtime));
    } else {
        t.push_str(&format!(
        "  converged after {precopy} pre-copy round(s) + stop-and-copy\n  total time           {:.3} s (logging on to resumed on the destination)\n  downtime             {:.1} ms (budget {} ms): {}\n",
        s.total.as_secs_f64(),
        s.downtime.as_secs_f64() * 1e3,
        p.max_downtime.as_millis(),
        if s.downtime <= p.max_downtime { "within budget" } else { "OVER BUDGET" }
    ));
    }
    let per_round: Vec<String> = s
        .rounds
        .iter()
        .map(|r| {
            if r.final_round {
                format!("{} (paused)", r.pages)
            } else {
                r.pages.to_string()
            }
        })
        .collect();
    t.push_str(&format!(
        "  pages sent per round {}\n  sent in total        {} pages ({} zero pages sent as a flag), {:.1} MiB\n",
        per_round.join(", "),
        s.page_records,
        s.zero_pages,
        s.bytes as f64 / MIB
    ));
    let rates: Vec<String> = s
        .rounds
        .iter()
        .map(|r| {
            format!(
                "{:.0} MiB/s ({:.0}%)",
                r.bandwidth / MIB,
                100.0 * r.bandwidth / s.link.max(1.0)
            )
        })
        .collect();
    t.push_str(&format!(
        "  link                 {:.1} MiB/s: {:.1} MiB over the same {} connection(s) with no guest and no checksum, just before the migration\n  throughput per round {} (% of link)\n",
        s.link / MIB,
        s.link_bytes as f64 / MIB,
        s.channels,
        rates.join(", ")
    ));
    if let Some(r0) = s.rounds.first() {
        t.push_str(&format!(
            "  round 0              {:.1} MiB/s = {:.0}% of the link\n",
            r0.bandwidth / MIB,
            100.0 * r0.bandwidth / s.link.max(1.0)
        ));
    }
    t.push_str(&format!(
        "  guest dirty rate     {:.1} MiB/s before logging, {:.1} MiB/s while logging\n  guest time per write {:.0} ns before logging, {:.0} ns while logging: slowdown {:+.0}%\n",
        s.before.write_rate * 4096.0 / MIB,
        s.during.write_rate * 4096.0 / MIB,
        s.before.ns_per_write,
        s.during.ns_per_write,
        s.slowdown_pct()
    ));
    if s.max_throttle_pct > 0 {
        t.push_str(&format!(
            "  auto-converge        throttled the vCPUs up to {}%\n",
            s.max_throttle_pct
        ));
    }
    if p.converge == ConvergeArg::DirtyLimit && s.final_pace * 4096 * p.vcpus as u64 != p.dirty_rate
    {
        t.push_str(&format!(
            "  dirty-limit          vCPUs capped at {:.1} MiB/s in all\n",
            (s.final_pace * 4096 * p.vcpus as u64) as f64 / MIB
        ));
    }
    t.push_str(&format!(
        "  verification         destination memory equals the source's{}: per-slot digests equal ({} slot(s)){}\n",
        if s.postcopy.is_some() {
            " at the stop plus every write the destination guest made since (replayed from its vCPU states)"
        } else {
            ""
        },
        s.slot_digests.len(),
        if s.verified_full {
            ", and every page equal byte for byte"
        } else {
            ""
        }
    ));
    if let Some(d) = d {
        t.push_str(&format!(
            "  destination          guest resumed from {} memory, ran {}{} ms at {:.1} MiB/s{}\n",
            if s.postcopy.is_some() {
                "incomplete (post-copy)"
            } else {
                "complete"
            },
            if s.postcopy.is_some() {
                "at least "
            } else {
                ""
            },
            p.run_after.as_millis(),
            d.resumed_write_rate * 4096.0 / MIB,
            if d.prefault > Duration::ZERO {
                format!(
                    "; its memory was backed with RAM in {:.0} ms before the stream started",
                    d.prefault.as_secs_f64() * 1e3
                )
            } else {
                String::new()
            }
        ));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("300ms").unwrap(), Duration::from_millis(300));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert_eq!(parse_duration("20").unwrap(), Duration::from_millis(20));
        assert!(parse_duration("fast")
            .unwrap_err()
            .contains("invalid duration"));
        assert!(parse_duration("-1s").is_err());
    }
}
