//! `s2mmu migrate`'s flags: the option enums, the parameter struct with
//! its limits, their parsers, and the source, destination and network
//! settings built from them.

use crate::limits;
use crate::report::{human_bytes, parse_size};
use crate::vm_format::FormatArg;
use s2mmu::mmu::{DirtyMode, MmuPolicy};
use s2mmu_migrate::session::dest::{DestConfig, Limits};
use s2mmu_migrate::session::extras;
use s2mmu_migrate::session::postcopy::control::{Recovery, RecoveryMode};
use s2mmu_migrate::session::postcopy::Postcopy;
use s2mmu_migrate::session::source::{AutoChannels, Converge, SourceConfig};
use s2mmu_migrate::sim::dest::SimDestConfig;
use s2mmu_migrate::sim::source::{session_harvest, SimGuestConfig, SimRun};
use s2mmu_migrate::transport as net;
use s2mmu_migrate::transport::{NetConfig, Security};
use s2mmu_migrate::wire;
use s2mmu_migrate::wire::Compression;
use s2mmu_vm::{Backing, Pattern};
use std::path::PathBuf;
use std::time::Duration;

/// Access pattern option.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatternArg {
    /// Every page of a vCPU's region in turn (memstress).
    Sequential,
    /// Pages at random in the region.
    Random,
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
    /// Switch at the start, before any page is sent: every page is missing on the destination, each comes by request (its fault) or with the background stream.
    Start,
    /// Switch when pre-copy is not converging (instead of throttling).
    Auto,
}

/// `--recovery`: what post-copy does when a connection breaks.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecoveryArg {
    /// Reconnect at once (at most 3 times), then wait for an operator on --control if given.
    Auto,
    /// Keep both sides paused until an operator says `recover` or `cancel` on --control.
    Manual,
}

/// Options of `s2mmu migrate`.
#[derive(clap::Args, Clone, Debug)]
pub struct Params {
    /// Guest memory (K/M/G suffixes; 4K to 64G).
    #[arg(short = 'm', long, default_value = "1G", value_parser = parse_size)]
    pub mem: u64,
    /// vCPUs running the workload (1 to 256).
    #[arg(short = 'v', long, default_value_t = 2)]
    pub vcpus: usize,
    /// Backing of guest memory (selftests' names).
    #[arg(long, short_alias = 's', default_value = "anonymous_thp")]
    pub backing: String,
    /// Memslots (1 to 512).
    #[arg(long, short_alias = 'x', default_value_t = 1)]
    pub slots: u32,
    /// Bytes per second the guest dirties, all vCPUs together (0: as fast as it can; at most 1T).
    #[arg(long, default_value = "64M", value_parser = limits::size_in(0..=MAX_RATE))]
    pub dirty_rate: u64,
    /// The guest's access pattern.
    #[arg(long, value_enum, default_value = "sequential")]
    pub pattern: PatternArg,
    /// How dirty pages are tracked and collected, any of the engine's dirty modes: wp (or bitmap: write protection, GET per round, CLEAR per chunk before sending it), ring or ring:N (per-vCPU dirty rings of N entries, a power of two 256..=65536, default 4096), hw (hardware dirty state: arm64 DBM or EPT dirty flags), hw-blocks (hw with huge mappings logged whole), pml (hardware dirty state with x86 Page-Modification Logging, which the simulated arm64 vCPU also runs).
    #[arg(long = "dirty", alias = "harvest", default_value = "wp", value_parser = crate::dirty_mode::parse_dirty_mode)]
    pub harvest: DirtyMode,
    /// Bytes cleared per CLEAR_DIRTY_LOG call (with --dirty wp): 256K to 64G, rounded down to a multiple of 64 pages.
    #[arg(long, default_value = "64M", value_parser = limits::size_in(MIN_CLEAR_CHUNK..=wire::MAX_MEM))]
    pub clear_chunk: u64,
    /// MMU policy: default (the read-lock fast path and eager split) or baseline (write-lock faults and split on fault).
    #[arg(long, value_enum, default_value = "default")]
    pub policy: crate::flags::PolicyArg,
    /// Hidden alias of `--policy baseline`.
    #[arg(long, hide = true, conflicts_with = "policy")]
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
    /// Page compression (LZ4) on the stream: auto (when the link is the bottleneck and recent pages compressed well; off when the destination is on this host: in this process, a loopback address or a Unix socket), lz4 (every page that compresses), off.
    #[arg(long, default_value = "auto", value_name = "WHEN", value_parser = parse_compress)]
    pub compress: Compression,
    /// Convergence help when the guest dirties faster than the link drains.
    #[arg(long, value_enum, default_value = "auto")]
    pub converge: ConvergeArg,
    /// Also compare all of memory byte for byte after the resume.
    #[arg(long, conflicts_with = "postcopy")]
    pub verify_full: bool,
    /// Post-copy: resume on the destination after round 0 (`--postcopy`), at the start before any page is sent (`--postcopy start`) or once pre-copy does not converge (`--postcopy auto`); pages not there yet are fetched when the guest faults on them.
    #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "on", value_name = "WHEN")]
    pub postcopy: Option<PostcopyArg>,
    /// When a post-copy connection breaks: `auto` reconnects at once (at most 3 times), then waits for an operator if --control is given; `manual` (needs --control) keeps both sides paused, memory split, until `s2mmu migrate-ctl recover` or `cancel`.
    #[arg(long, value_enum, default_value = "auto")]
    pub recovery: RecoveryArg,
    /// How long a paused post-copy waits for the operator before giving up (1s to a day, 86400s).
    #[arg(long, default_value = "600s", value_parser = parse_duration)]
    pub recover_wait: Duration,
    /// Control socket (a Unix socket, mode 0600, created fresh; with --to or --listen) that `s2mmu migrate-ctl` talks to: status, recover (the source: optionally to a new ADDR), cancel.
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// How long the guest runs before logging starts (at most a day).
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    pub warmup: Duration,
    /// How long the destination runs the resumed guest (at most a day).
    #[arg(long, default_value = "300ms", value_parser = parse_duration)]
    pub run_after: Duration,
    /// Draw the run into this SVG file; a PNG of the same figure is written beside it
    /// (the same path with the extension png). No plot without it.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<String>,
    /// Run only a destination, listening on ADDR (host:port, or unix:PATH for a Unix socket on this host).
    #[arg(long, value_name = "ADDR", conflicts_with = "to")]
    pub listen: Option<String>,
    /// Run only a source, migrating to the destination at ADDR (host:port, or unix:PATH).
    #[arg(long, value_name = "ADDR")]
    pub to: Option<String>,
    /// Connections the pages are spread over (QEMU's multifd): N, auto (chosen by a short probe of round 0's own pipeline over 1, 2 and 4 on this host), or a list (1,2,4 or auto,1,2) to run once per count and print a table. Default: one per CPU, 1 to 8. On --listen: the most it accepts (default 64).
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
    /// TLS: the name the destination's certificate must carry (default: the host of --to; "localhost" in one process or with --to unix:PATH).
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
    /// With --listen: authenticated sources to serve before giving up after failed ones (a connection that fails before it authenticates, or with plain TCP before its opening is read, is refused and not counted); the destination exits after the first migration that succeeds.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub attempts: u32,
    /// Migrate twice, with MmuPolicy::default() and MmuPolicy::baseline(), and compare the guest slowdowns.
    #[arg(long, conflicts_with_all = ["listen", "to", "baseline", "policy"])]
    pub compare_policies: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Measure against the wire, N runs per cell (1 to 50): plain TCP then the migration, back to back, with and without TLS, for each --channels count (default 1,2,4); medians and ratios.
    #[arg(long, value_name = "N", conflicts_with_all = ["listen", "to", "compare_policies", "no_tls", "tls_cert", "psk"])]
    pub wire_bench: Option<u32>,
    /// Measure the link before the migration: plain TCP, then the stack's own link, each sending as many bytes as guest memory (on with --wire-bench and a --channels list; off by default, so a migration sends the guest's pages and nothing of that size besides).
    #[arg(long)]
    pub link_probe: bool,
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
    /// The stage-2 format of the guest's tables: arm64 (4 KiB granule) or x86 EPT (4-level); with --listen, a source on another format is refused.
    #[arg(long, value_enum, default_value = "arm64")]
    pub format: FormatArg,
    /// The guest: sim (the simulated VM and its workload), linux (Debian's arm64 Linux on QEMU's model, two machines in this process; --mem 128M..4G, --vcpus 1..4, --runs, --json, -q, --postcopy, --linux-run, --linux-ram apply), or auto: linux when no other option is given and QEMU, the EL2 image and the kernel are there (it says why not otherwise), else sim.
    #[arg(long, default_value = "auto", value_parser = ["auto", "sim", "linux"])]
    pub guest: String,
    /// With --guest linux: migrations to run and summarise (1 to 20).
    #[arg(long, default_value_t = 1)]
    pub runs: u32,
    /// With --guest linux: the guest program, counter (one small step a second, near idle), dirtier (writes 64 MiB as fast as it can for 30 s, re-checking every page it wrote) or fill (fills 90 % of the guest's available memory with data pages, none zero, then steps as counter does, re-checking them: round 0 sends data pages).
    #[arg(long, default_value = "counter", value_parser = ["counter", "dirtier", "fill"])]
    pub linux_run: String,
    /// With --guest linux: the host pages under both QEMU machines' RAM, auto (2 MiB pages of a private huge tmpfs where this process may mount one, as root may; else /dev/shm) or shm (/dev/shm: 4 KiB pages under the kernel's default shmem policy).
    #[arg(long, default_value = "auto", value_parser = ["auto", "shm"])]
    pub linux_ram: String,
    /// With --guest linux: where both machines' stage-2 engine runs, host (a host thread answers every stage-2 abort) or el2 (linked into the EL2 stub: RAM faults, the dirty log's write faults and post-copy's maps answered there); with --listen, this destination's own.
    #[arg(long, default_value = "el2")]
    pub engine: s2mmu_arm64::linux::vm::Engine,
    /// With --guest linux: the user's kernel, initramfs and command line, and where the consoles go.
    #[command(flatten)]
    pub linux_guest: super::linux_guest::LinuxGuestArgs,
}

/// The most `--bandwidth` and `--dirty-rate` take: 1 TiB/s.
pub const MAX_RATE: u64 = 1 << 40;
/// The least `--clear-chunk` takes: 64 pages (one word of the bitmap).
pub const MIN_CLEAR_CHUNK: u64 = 64 * wire::PAGE_SIZE as u64;
/// The most `--max-rounds` takes.
pub const MAX_ROUNDS: u32 = 1000;

/// `--compress`: auto, lz4 or off.
pub fn parse_compress(s: &str) -> Result<Compression, String> {
    s.parse()
}

/// The channel counts of `--channels` (`AUTO_CHANNELS`, 0, stands for
/// `auto`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelCounts(pub Vec<u16>);

/// `auto` in [`ChannelCounts`]: the count chosen by measurement
/// (`s2mmu_migrate::session::source::AutoChannels`).
pub const AUTO_CHANNELS: u16 = 0;

/// Parses `4`, `1,2,4` or `auto` (also in a list: `auto,1,2`) (1 to 64
/// each, at most 16 counts).
pub fn parse_channels(s: &str) -> Result<ChannelCounts, String> {
    let v: Vec<u16> = s
        .split(',')
        .map(|p| match p.trim().parse::<u16>() {
            Ok(n) if (1..=wire::MAX_CHANNELS).contains(&n) => Ok(n),
            _ if p.trim() == "auto" => Ok(AUTO_CHANNELS),
            _ => Err(format!(
                "invalid channel count '{p}': use 1 to {}, or auto",
                wire::MAX_CHANNELS
            )),
        })
        .collect::<Result<_, _>>()?;
    if v.is_empty() || v.len() > 16 {
        return Err(format!("'{s}': give 1 to 16 channel counts"));
    }
    Ok(ChannelCounts(v))
}

/// Sets `session`'s channels to `channels` (a count, or
/// [`AUTO_CHANNELS`]: chosen by measurement among 1, 2 and 4, its probe
/// over TLS when `tls`; the plain-TCP link figure then uses 4
/// connections, the most it may choose).
pub fn set_channels(session: &mut SourceConfig, channels: u16, tls: bool) {
    if channels == AUTO_CHANNELS {
        let auto = AutoChannels {
            tls,
            ..AutoChannels::default()
        };
        session.channels = auto.candidates.iter().copied().max().unwrap_or(1);
        session.auto_channels = Some(auto);
    } else {
        session.channels = channels;
        session.auto_channels = None;
    }
}

/// A channel count in words (`auto` for [`AUTO_CHANNELS`]).
pub fn channels_name(channels: u16) -> String {
    match channels {
        AUTO_CHANNELS => "auto".into(),
        n => n.to_string(),
    }
}

/// The default channel count: one per CPU, 1 to 8 (from the
/// per-page CPU each side costs). One channel is one sending and one
/// receiving thread that wait for each other in turn, so it keeps about
/// one core busy whatever the count of cores; the pipeline's speed grows
/// with the channels until their threads cover the cores, and no further
/// (on the 2-core development machine, quiet: round 0 without TLS 1676
/// MiB/s over 1 channel, 2594 over 2, 2524 over 4; with TLS 1544, 1639,
/// 1603). Half the CPUs, the rule before, chose 1 there, the slowest.
/// `--channels auto` measures instead (not the default: its probe adds
/// about half a second to every run and did not rank the counts steadily
/// on a loaded machine).
pub fn default_channels() -> u16 {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    cpus.clamp(1, 8) as u16
}

pub use crate::flags::parse_duration;

impl Params {
    /// `--plot FILE` (`--plot ""`, the older way to ask for none, is none).
    pub fn plot_file(&self) -> Option<&str> {
        self.plot.as_deref().filter(|f| !f.is_empty())
    }

    /// Whether `--policy baseline` (or its alias `--baseline`) was given.
    pub fn uses_baseline(&self) -> bool {
        self.baseline || self.policy == crate::flags::PolicyArg::Baseline
    }

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

    /// The source's guest and session settings (its progress off: the
    /// caller shows it).
    ///
    /// # Errors
    /// A message naming the bad option.
    pub fn source_config(&self, baseline: bool) -> Result<SimRun, String> {
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
            return Err(format!("--slots {}: use 1 to 512 memslots", self.slots));
        }
        if self.io_timeout < Duration::from_millis(100) {
            return Err(format!(
                "--io-timeout {:?}: use at least 100ms",
                self.io_timeout
            ));
        }
        if let Some(n) = self.harvest.ring_entries() {
            if !(256..=65536).contains(&n) || !n.is_power_of_two() {
                return Err(format!(
                    "--dirty ring:{n}: use a power of two, 256 to 65536 entries"
                ));
            }
        }
        let guest = SimGuestConfig {
            mem_size: self.mem,
            vcpus: self.vcpus,
            backing,
            slots: self.slots,
            policy: self.policy(baseline),
            dirty: self.harvest,
            dirty_rate: self.dirty_rate,
            pattern: match self.pattern {
                PatternArg::Sequential => Pattern::Sequential,
                PatternArg::Random => Pattern::Random,
            },
            format: self.format.into(),
            extras: extras::SourceExtras {
                check: self.check,
                inject_lost_marks: self.inject_lost_marks,
                snapshot_every: self.snapshot_every,
                snapshot_dir: self.snapshot_dir.clone(),
            },
        };
        let session = SourceConfig {
            harvest: session_harvest(self.harvest),
            clear_chunk: self.clear_chunk,
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
            progress: s2mmu_migrate::session::Progress::off(),
            label: String::new(),
            channels: 1,
            auto_channels: None,
            postcopy: self.postcopy_when(),
            recovery: self.recovery()?,
            link_probe: self.link_probe
                || self.wire_bench.is_some()
                || self.channel_list().len() > 1,
            image: None,
            compression: self.compression(),
        };
        let mut session = session;
        set_channels(&mut session, self.channel_list()[0], self.uses_tls());
        Ok(SimRun { guest, session })
    }

    /// The source's compression: `--compress`, where `auto` is off when
    /// the destination is on this host (this process, a loopback address
    /// or a Unix socket). Such a migration has no link to save bytes on:
    /// its source and destination share the host's CPUs, so compressing
    /// only moves work from the socket's copy to LZ4 on both sides, and
    /// takes CPU time from the guest.
    fn compression(&self) -> Compression {
        match (self.compress, self.to.as_deref()) {
            (Compression::Auto, None) => Compression::Off,
            (Compression::Auto, Some(to)) if super::local_peer::destination_is_local(to) => {
                Compression::Off
            }
            (c, _) => c,
        }
    }

    /// When the session switches to post-copy (`--postcopy`).
    fn postcopy_when(&self) -> Postcopy {
        match self.postcopy {
            None => Postcopy::Off,
            Some(PostcopyArg::On) => Postcopy::On,
            Some(PostcopyArg::Start) => Postcopy::Start,
            Some(PostcopyArg::Auto) => Postcopy::Auto,
        }
    }

    /// Whether the run's connections use TLS (certificates or a key), as
    /// [`Params::net_config`] decides, without reading files or making keys.
    pub fn uses_tls(&self) -> bool {
        self.tls_cert.is_some()
            || self.psk.is_some()
            || !(self.no_tls || self.listen.is_some() || self.to.is_some())
    }

    /// The post-copy recovery policy (without its control socket, which
    /// the caller starts once per process).
    ///
    /// # Errors
    /// A message naming the bad option.
    pub fn recovery(&self) -> Result<Recovery, String> {
        if self.recover_wait < Duration::from_secs(1) {
            return Err(format!(
                "--recover-wait {:?}: use 1s to a day (86400s)",
                self.recover_wait
            ));
        }
        if self.control.is_some() && self.to.is_none() && self.listen.is_none() {
            return Err("--control needs --to or --listen (one side per process)".into());
        }
        if self.recovery == RecoveryArg::Manual && self.control.is_none() {
            return Err(
                "--recovery manual needs --control PATH (the operator resumes through it)".into(),
            );
        }
        Ok(Recovery {
            mode: match self.recovery {
                RecoveryArg::Auto => RecoveryMode::Auto,
                RecoveryArg::Manual => RecoveryMode::Manual,
            },
            wait: self.recover_wait,
            control: None,
        })
    }

    /// The channel counts to run.
    pub fn channel_list(&self) -> Vec<u16> {
        self.channels
            .clone()
            .map_or_else(|| vec![default_channels()], |c| c.0)
    }

    /// The simulated destination's configuration: its guest's policy and
    /// format beside [`Params::dest_config`].
    pub fn sim_dest_config(&self, baseline: bool) -> SimDestConfig {
        SimDestConfig {
            policy: self.policy(baseline),
            format: self.format.into(),
            dest: self.dest_config(),
        }
    }

    /// The destination's configuration: what it accepts is what these
    /// options say (--mem, -v, -x, and --channels when given).
    pub fn dest_config(&self) -> DestConfig {
        DestConfig {
            run_after: self.run_after,
            limits: Limits {
                max_mem: self.mem,
                max_vcpus: self.vcpus as u32,
                max_slots: self.slots,
                max_channels: self
                    .channels
                    .as_ref()
                    .and_then(|c| {
                        let auto = c.0.contains(&AUTO_CHANNELS).then_some(4);
                        c.0.iter().copied().chain(auto).max()
                    })
                    .unwrap_or(wire::MAX_CHANNELS),
            },
            io_timeout: self.io_timeout,
            progress: self.listen.is_some() && !self.quiet,
            prefault: !self.no_prefault,
            recovery: self.recovery().unwrap_or_default(),
            accept_wait: None,
            stop: Default::default(),
            image: None,
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
pub(super) fn host_of(addr: &str) -> String {
    // A Unix socket is on this host.
    if addr.starts_with("unix:") {
        return "localhost".into();
    }
    let h = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    h.trim_start_matches('[').trim_end_matches(']').to_string()
}
