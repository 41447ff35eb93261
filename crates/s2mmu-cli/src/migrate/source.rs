//! The source: runs the guest, logs its dirty pages and sends its memory in
//! pre-copy rounds until what is left fits the downtime budget, then pauses
//! it, sends the rest and the vCPU state, and waits for the destination to
//! resume it. Afterwards it checks the destination's memory against its own
//! (frozen) memory.

use super::bandwidth::TokenBucket;
use super::error::MigrateError;
use super::hash::{digest_of, is_zero, page_hash};
use super::net::BoxConn;
use super::postcopy::{Postcopy, PostcopyOutcome};

mod postcopy_switch;
use super::timeline::{intervals, Sample, Timeline};
use super::wire::{
    channel_of, record_name, tag, Batch, Dec, Enc, GuestState, Header, Record, WireReader,
    WireWriter, MAX_CHANNELS, MAX_MEM, MAX_SLOTS, MAX_VCPUS, PAGE_RECORD_BYTES, PAGE_SIZE,
    SESSION_LEN,
};
use crate::progress::Progress;
use s2mmu::dirty::DirtyGfn;
use s2mmu::mmu::{DirtyMode, MmuPolicy};
use s2mmu_vm::{Backing, GuestMemory, Pattern, Vm, VmConfig, Workload, WorkloadConfig};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How dirty pages are collected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Harvest {
    /// `KVM_GET_DIRTY_LOG` per round, `KVM_CLEAR_DIRTY_LOG` per chunk just
    /// before the chunk's pages are sent (QEMU's clear_bmap).
    Bitmap,
    /// Per-vCPU dirty rings, reaped whenever one fills and at each round.
    Ring,
}

/// What the source does when the guest dirties memory faster than the
/// link drains it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Converge {
    /// QEMU's auto-converge: throttle the vCPUs (20 %, then +10 % per
    /// round, up to 99 %) after two rounds that dirtied more than half of
    /// what they sent.
    Auto,
    /// QEMU's dirty-limit: cap each vCPU's dirty rate (its pace) to a
    /// quarter of the link, halving it on every further such round.
    DirtyLimit,
    /// Nothing: a guest that outruns the link fails at the round limit.
    None,
}

/// The source's guest and migration settings.
#[derive(Clone, Debug)]
pub struct SourceConfig {
    /// Bytes of guest memory.
    pub mem_size: u64,
    /// vCPUs running the workload.
    pub vcpus: usize,
    /// How guest memory is backed.
    pub backing: Backing,
    /// Memslots.
    pub slots: u32,
    /// The MMU's policy (dirty-log fields are set from `harvest`).
    pub policy: MmuPolicy,
    /// How dirty pages are collected.
    pub harvest: Harvest,
    /// Entries of each vCPU's dirty ring.
    pub ring_entries: u32,
    /// Bytes cleared per `clear_dirty_log` call (bitmap harvest).
    pub clear_chunk: u64,
    /// Bytes per second the whole guest dirties (0: as fast as it can).
    pub dirty_rate: u64,
    /// The guest's access pattern.
    pub pattern: Pattern,
    /// Downtime budget.
    pub max_downtime: Duration,
    /// Pre-copy rounds after the first before giving up.
    pub max_rounds: u32,
    /// Link limit in bytes per second (0: none).
    pub bandwidth: u64,
    /// Convergence help.
    pub converge: Converge,
    /// Byte-compare all of memory after the resume.
    pub verify_full: bool,
    /// How long the guest runs before logging starts (its speed then is
    /// the reference for the slowdown).
    pub warmup: Duration,
    /// Interval of the throughput timeline.
    pub sample_every: Duration,
    /// Where the progress lines go (the link, a line per round, the
    /// resume): stderr lines, a bar on a terminal, or nowhere
    /// ([`Progress::off`]); one step per round.
    pub progress: Arc<Progress>,
    /// Name of this run in progress lines.
    pub label: String,
    /// Connections the pages are spread over.
    pub channels: u16,
    /// When to switch to post-copy.
    pub postcopy: Postcopy,
    /// The lost-write check and snapshots beside the migration.
    pub extras: super::extras::SourceExtras,
}

impl Default for SourceConfig {
    fn default() -> Self {
        SourceConfig {
            mem_size: 1 << 30,
            vcpus: 2,
            backing: Backing::AnonymousThp,
            slots: 1,
            policy: MmuPolicy::default(),
            harvest: Harvest::Bitmap,
            ring_entries: 4096,
            clear_chunk: 64 << 20,
            dirty_rate: 64 << 20,
            pattern: Pattern::Sequential,
            max_downtime: Duration::from_millis(300),
            max_rounds: 30,
            bandwidth: 0,
            converge: Converge::Auto,
            verify_full: false,
            warmup: Duration::from_millis(500),
            sample_every: Duration::from_millis(50),
            progress: Arc::new(Progress::lines_only()),
            label: String::new(),
            channels: 1,
            postcopy: Postcopy::Off,
            extras: super::extras::SourceExtras::default(),
        }
    }
}

/// One pre-copy round (round 0 sends all memory; the last is the
/// stop-and-copy with the vCPUs paused).
#[derive(Clone, Debug, Default)]
pub struct RoundStat {
    /// Round number.
    pub round: u32,
    /// Pages sent in it (zero pages included).
    pub pages: u64,
    /// Of those, zero pages (sent as a flag, without their bytes).
    pub zero_pages: u64,
    /// Stream bytes sent in it.
    pub bytes: u64,
    /// Seconds since the timeline started, at its start and end.
    pub start_s: f64,
    pub end_s: f64,
    /// Pages found dirty when it ended (what the next round sends).
    pub dirty_after: u64,
    /// Guest dirty rate during it, bytes per second.
    pub dirty_rate: f64,
    /// Bandwidth of its sending, stream bytes per second.
    pub bandwidth: f64,
    /// Guest memory it moved, bytes per second (zero pages count in full).
    pub page_rate: f64,
    /// Throttle in percent while it ran.
    pub throttle_pct: u32,
    /// Each vCPU's pace (pages per second, 0: unpaced) while it ran.
    pub pace: u64,
    /// Whether the vCPUs were paused (the stop-and-copy).
    pub final_round: bool,
}

/// The guest's speed in one phase.
#[derive(Clone, Copy, Debug, Default)]
pub struct Phase {
    /// Guest writes per second of wall time.
    pub write_rate: f64,
    /// Nanoseconds of guest execution per write (faults included): the
    /// median over the phase's timeline intervals.
    pub ns_per_write: f64,
}

/// What the source did.
#[derive(Clone, Debug, Default)]
pub struct SourceOutcome {
    /// Every round.
    pub rounds: Vec<RoundStat>,
    /// From logging on to the destination's resume.
    pub total: Duration,
    /// From the pause to the destination's resume (as the source saw it).
    pub downtime: Duration,
    /// Page records sent (the verification pass not included).
    pub page_records: u64,
    /// Of those, zero pages.
    pub zero_pages: u64,
    /// The link: stream bytes per second of the probe (the same bytes as
    /// round 0 over the same connections, no guest, no checksum).
    pub link: f64,
    /// Bytes the probe sent.
    pub link_bytes: u64,
    /// Channels used.
    pub channels: u16,
    /// Stream bytes sent (the verification pass not included).
    pub bytes: u64,
    /// Timeline samples.
    pub samples: Vec<Sample>,
    /// Timeline seconds at logging on, pause and resume.
    pub log_start_s: f64,
    pub pause_s: f64,
    pub resumed_s: f64,
    /// The guest before logging and while logging.
    pub before: Phase,
    pub during: Phase,
    /// Per-slot digests both sides agreed on.
    pub slot_digests: Vec<(u16, u64)>,
    /// What the lost-write check and the snapshots found.
    pub extras: super::extras::ExtrasOutcome,
    /// Whether all memory was byte-compared too.
    pub verified_full: bool,
    /// Highest throttle used, percent.
    pub max_throttle_pct: u32,
    /// Per-vCPU pace at the end (dirty-limit lowers it).
    pub final_pace: u64,
    /// Post-copy, when the migration switched to it.
    pub postcopy: Option<PostcopyOutcome>,
}

impl SourceOutcome {
    /// How much slower the guest executed per write while logging, in
    /// percent of its speed before.
    pub fn slowdown_pct(&self) -> f64 {
        if self.before.ns_per_write > 0.0 {
            (self.during.ns_per_write / self.before.ns_per_write - 1.0) * 100.0
        } else {
            0.0
        }
    }
}

/// The policy the source's VM runs with: the caller's, with the dirty-log
/// mode of `cfg` (manual protect; nothing initially set, so the first
/// round sends all memory and logs what changes meanwhile).
pub fn source_policy(cfg: &SourceConfig) -> MmuPolicy {
    MmuPolicy {
        manual_protect: true,
        initially_set: false,
        dirty: if cfg.harvest == Harvest::Ring {
            DirtyMode::Ring {
                entries: cfg.ring_entries,
            }
        } else {
            DirtyMode::Bitmap
        },
        ..cfg.policy
    }
}

/// Opens the connection for a channel (0: the main one), secured as
/// configured.
pub type Connect<'a> = dyn FnMut(u16) -> Result<BoxConn, MigrateError> + 'a;

/// Runs the source side: `connect` opens each channel's connection once
/// the guest is warm.
///
/// # Errors
/// [`MigrateError::Setup`], [`MigrateError::Io`], [`MigrateError::Timeout`],
/// [`MigrateError::Auth`], [`MigrateError::NotConverged`] (the destination
/// was told to abort and the source guest kept running),
/// [`MigrateError::Rejected`], [`MigrateError::MemoryMismatch`].
pub fn migrate_source(
    cfg: &SourceConfig,
    connect: &mut Connect<'_>,
) -> Result<SourceOutcome, MigrateError> {
    let page = PAGE_SIZE as u64;
    if cfg.vcpus == 0 || cfg.vcpus > MAX_VCPUS as usize || cfg.mem_size < cfg.vcpus as u64 * page {
        return Err(MigrateError::Setup(format!(
            "{} bytes of guest memory cannot hold a page for each of {} vCPUs (1 to {MAX_VCPUS})",
            cfg.mem_size, cfg.vcpus
        )));
    }
    if cfg.postcopy != Postcopy::Off && cfg.verify_full {
        return Err(MigrateError::Setup(
            "post-copy and verify-full: the byte comparison needs the memory the guest resumed from; post-copy checks the destination against this memory plus its guest's writes".into(),
        ));
    }
    if cfg.postcopy != Postcopy::Off && (cfg.extras.check || cfg.extras.snapshot_every.is_some()) {
        return Err(MigrateError::Setup(
            "post-copy with --check or --snapshot-every: both check and snapshot the source's memory round by round to the stop, and after a post-copy switch the memory is split between the hosts (not supported together)".into(),
        ));
    }
    if cfg.channels == 0 || cfg.channels > MAX_CHANNELS {
        return Err(MigrateError::Setup(format!(
            "{} channels: use 1 to {MAX_CHANNELS}",
            cfg.channels
        )));
    }
    if cfg.mem_size > MAX_MEM || cfg.slots == 0 || cfg.slots > MAX_SLOTS {
        return Err(MigrateError::Setup(format!(
            "a guest of {} bytes in {} slots: at most {MAX_MEM} bytes, 1 to {MAX_SLOTS} slots",
            cfg.mem_size, cfg.slots
        )));
    }
    cfg.extras.validate(cfg.harvest)?;
    let vm = Arc::new(
        Vm::new(VmConfig {
            mem_size: cfg.mem_size,
            backing: cfg.backing,
            slots: cfg.slots,
            gpa_base: 1 << 32,
            policy: source_policy(cfg),
            ..VmConfig::default()
        })
        .map_err(|e| MigrateError::Setup(format!("source guest: {e}")))?,
    );
    let wl_cfg = WorkloadConfig {
        bytes_per_vcpu: cfg.mem_size / cfg.vcpus as u64 / page * page,
        write_percent: 100,
        pattern: cfg.pattern,
        page_size: page,
    };
    let wl = Workload::start(vm.clone(), cfg.vcpus, wl_cfg).map_err(MigrateError::Setup)?;
    // The guest has been running: every page touched once.
    wl.run_pass(|| {}).map_err(MigrateError::Setup)?;
    // 0 is unpaced: a rate below a page per second per vCPU is one.
    let pace = match cfg.dirty_rate {
        0 => 0,
        r => (r / page / cfg.vcpus as u64).max(1),
    };
    let ctl = wl.control().clone();
    ctl.pace_pages_per_sec.store(pace, Ordering::Relaxed);
    let timeline = Timeline::start(ctl.clone(), cfg.sample_every);
    wl.run_free();
    let warm = counters(&ctl);
    std::thread::sleep(cfg.warmup);
    let warm_end = counters(&ctl);
    let warm_end_s = timeline.at(warm_end.0);

    // Connect, be accepted, join the further channels, measure the link.
    let header = Header {
        mem_size: cfg.mem_size,
        slots: cfg.slots,
        gpa_base: vm.config().gpa_base,
        vcpus: cfg.vcpus as u32,
        channels: cfg.channels,
        backing: cfg.backing.name().to_string(),
        verify_full: cfg.verify_full,
        postcopy: cfg.postcopy != Postcopy::Off,
    };
    let main = connect(0)?;
    let mut main = WireWriter::new(main, &header)?;
    main.flush()?;
    let session = match read_reply(&mut main)? {
        Record::Control {
            tag: tag::ACCEPT,
            body,
            at_byte,
        } => {
            let mut d = Dec::new(&body, "ACCEPT", at_byte);
            let mut s = [0u8; SESSION_LEN];
            s.copy_from_slice(d.bytes(SESSION_LEN)?);
            d.finish()?;
            s
        }
        other => return Err(unexpected_reply(other, "ACCEPT")),
    };
    let mut chans = vec![Chan::new(main)];
    for c in 1..cfg.channels {
        let conn = connect(c)?;
        chans.push(Chan::new(WireWriter::join(conn, &session, c)?));
    }
    // Post-copy's request and answer connections, after the data channels.
    let mut pc_conns = Vec::new();
    if cfg.postcopy != Postcopy::Off {
        for c in [cfg.channels, cfg.channels + 1] {
            let conn = connect(c)?;
            pc_conns.push(WireWriter::join(conn, &session, c)?);
        }
    }
    let mut switch = false;
    let mut s = Sender {
        vm: &vm,
        chans,
        bucket: Mutex::new(TokenBucket::new(cfg.bandwidth)),
        pending: vm
            .slots()
            .iter()
            .map(|s| vec![0u64; (s.size / page).div_ceil(64) as usize])
            .collect(),
        ring: cfg.harvest == Harvest::Ring,
        vcpus: cfg.vcpus,
        chunk_pages: (cfg.clear_chunk / page / 64 * 64).max(64),
        gfns: Vec::new(),
    };
    let (link_bytes, link_time) = s.probe(cfg.mem_size)?;
    let link = link_bytes as f64 / link_time.as_secs_f64().max(1e-9);
    if cfg.progress.is_on() {
        cfg.progress.line(&format!(
            "{}link: {:.1} MiB in {:.1} ms at {:.1} MiB/s over {} channel(s) (no guest, no checksum)",
            cfg.label,
            link_bytes as f64 / MIB,
            link_time.as_secs_f64() * 1e3,
            link / MIB,
            cfg.channels
        ));
    }

    // Pre-copy.
    let log_start = Instant::now();
    let log_start_s = timeline.at(log_start);
    let at_log = counters(&ctl);
    vm.enable_dirty_logging()
        .map_err(|e| MigrateError::Setup(format!("enabling dirty logging: {e}")))?;
    let mut extras = cfg.extras.begin(&vm)?;
    let mut rounds: Vec<RoundStat> = Vec::new();
    let mut send_time = Duration::ZERO;
    let mut send_bytes = 0u64;
    let mut last_harvest = log_start;
    let mut last_writes = writes(&ctl);
    let mut high_rounds = 0u32;
    let mut throttle_pct = 0u32;
    let mut unthrottled_ns_per_page = 0f64;
    let mut max_throttle = 0u32;
    let mut round = 0u32;
    let result = loop {
        let t0 = Instant::now();
        let (p0, b0, z0) = s.counts();
        let mut e = Enc::default();
        e.u32(round).u64(if round == 0 {
            cfg.mem_size / page
        } else {
            s.dirty_count()
        });
        if let Err(e) = s.chans[0].wire.control(tag::ROUND, &e.0) {
            break Err(e);
        }
        let sent = if round == 0 {
            s.send_all()
        } else {
            s.send_dirty()
        };
        if let Err(e) = sent {
            break Err(e);
        }
        let t1 = Instant::now();
        let (p1, b1, z1) = s.counts();
        let (pages, bytes) = (p1 - p0, b1 - b0);
        send_time += t1 - t0;
        send_bytes += bytes;
        // Harvest what the guest dirtied meanwhile.
        let dirty = match s.harvest() {
            Ok(n) => n,
            Err(e) => break Err(e),
        };
        if let Err(e) = extras.round(&vm, &s.pending) {
            break Err(e);
        }
        let now = Instant::now();
        let dt = (now - last_harvest).as_secs_f64().max(1e-9);
        last_harvest = now;
        let w = writes(&ctl);
        let guest_pages_per_s = w.saturating_sub(last_writes) as f64 / dt;
        last_writes = w;
        let dirty_rate = dirty as f64 * page as f64 / dt;
        let bandwidth = send_bytes as f64 / send_time.as_secs_f64().max(1e-9);
        let remaining = dirty * PAGE_RECORD_BYTES;
        let est = Duration::from_secs_f64(remaining as f64 / bandwidth.max(1.0));
        let stat = RoundStat {
            round,
            pages,
            zero_pages: z1 - z0,
            bytes,
            start_s: timeline.at(t0),
            end_s: timeline.at(t1),
            dirty_after: dirty,
            dirty_rate,
            bandwidth: bytes as f64 / (t1 - t0).as_secs_f64().max(1e-9),
            page_rate: pages as f64 * page as f64 / (t1 - t0).as_secs_f64().max(1e-9),
            throttle_pct,
            pace: ctl.pace_pages_per_sec.load(Ordering::Relaxed),
            final_round: false,
        };
        if cfg.progress.is_on() {
            cfg.progress.line(&format!(
                "{}round {round:>2}: sent {pages:>7} pages ({:>7.1} MiB, {} zero) in {:>7.1} ms at {:>7.1} MiB/s ({:>3.0}% of link; memory {:>7.1} MiB/s); guest dirtied {dirty:>6} pages ({:>6.1} MiB/s; {:>9.0} guest writes/s); est. downtime {:>6.1} ms{}",
                cfg.label,
                bytes as f64 / MIB,
                stat.zero_pages,
                (t1 - t0).as_secs_f64() * 1e3,
                stat.bandwidth / MIB,
                100.0 * stat.bandwidth / link.max(1.0),
                stat.page_rate / MIB,
                dirty_rate / MIB,
                guest_pages_per_s,
                est.as_secs_f64() * 1e3,
                match (throttle_pct, cfg.converge) {
                    (0, Converge::DirtyLimit) if stat.pace != pace => format!("; dirty limit {:.1} MiB/s", (stat.pace * page * cfg.vcpus as u64) as f64 / MIB),
                    (0, _) => String::new(),
                    (p, _) => format!("; throttle {p}%"),
                }
            ));
            cfg.progress.step();
        }
        rounds.push(stat);
        if cfg.postcopy == Postcopy::On
            || (cfg.postcopy == Postcopy::Auto && round >= cfg.max_rounds)
        {
            switch = true;
            break Ok(());
        }
        // Half the budget: the rest is the margin for a link or a host
        // slower during the stop-and-copy than on average (another round
        // is cheap when this one is this small).
        if est <= cfg.max_downtime / 2 {
            break Ok(());
        }
        if round >= cfg.max_rounds {
            break Err(MigrateError::NotConverged {
                rounds: round + 1,
                dirty_rate_mib_s: dirty_rate / MIB,
                guest_writes_per_s: guest_pages_per_s,
                bandwidth_mib_s: bandwidth / MIB,
                remaining_mib: remaining as f64 / MIB,
                max_downtime_ms: cfg.max_downtime.as_secs_f64() * 1e3,
            });
        }
        // Convergence help, QEMU's trigger: the round dirtied more than
        // half of what it sent.
        if round > 0 && dirty * page * 2 > bytes {
            high_rounds += 1;
            if cfg.postcopy == Postcopy::Auto && high_rounds >= 2 {
                // Not converging: post-copy instead of a throttle.
                switch = true;
                break Ok(());
            }
            match cfg.converge {
                Converge::Auto if high_rounds >= 2 => {
                    if throttle_pct == 0 {
                        unthrottled_ns_per_page =
                            1e9 * cfg.vcpus as f64 / guest_pages_per_s.max(1.0);
                        throttle_pct = 20;
                    } else {
                        throttle_pct = (throttle_pct + 10).min(99);
                    }
                    max_throttle = max_throttle.max(throttle_pct);
                    // Sleeping p of the time: a delay of p / (1 - p) of
                    // the time a page took unthrottled.
                    let p = f64::from(throttle_pct) / 100.0;
                    let ns = unthrottled_ns_per_page * p / (1.0 - p);
                    ctl.throttle_ns.store(ns as u64, Ordering::Relaxed);
                }
                Converge::DirtyLimit => {
                    let cur = ctl.pace_pages_per_sec.load(Ordering::Relaxed);
                    let quarter = (bandwidth / 4.0 / page as f64 / cfg.vcpus as f64) as u64;
                    let limit = if cur == 0 || cur > quarter {
                        quarter
                    } else {
                        cur / 2
                    };
                    ctl.pace_pages_per_sec
                        .store(limit.max(1), Ordering::Relaxed);
                }
                _ => {}
            }
        }
        round += 1;
    };
    let final_pace = ctl.pace_pages_per_sec.load(Ordering::Relaxed);
    if let Err(e) = result {
        // The guest stays on the source: tell the destination, which must
        // not resume it.
        let _ = s.chans[0]
            .wire
            .control(tag::ABORT, e.to_string().as_bytes());
        let _ = s.chans[0].wire.flush();
        ctl.throttle_ns.store(0, Ordering::Relaxed);
        let _ = vm.disable_dirty_logging();
        return Err(rejected_or(e, &mut s.chans[0].wire));
    }
    if switch {
        return postcopy_switch::run(postcopy_switch::Switching {
            vm: &vm,
            wl: &wl,
            wl_cfg,
            ctl: &ctl,
            s: &mut s,
            pc_conns,
            final_pace,
            round,
            rounds,
            timeline,
            log_start,
            log_start_s,
            warm,
            warm_end,
            warm_end_s,
            at_log,
            link,
            link_bytes,
            cfg,
            connect,
            session,
            max_throttle,
        });
    }

    // Stop and copy.
    let pause_at = Instant::now();
    let at_pause = counters(&ctl);
    wl.pause();
    let stop_copy = (|| {
        let t0 = Instant::now();
        let (p0, b0, z0) = s.counts();
        s.final_harvest()?;
        extras.last_round(&vm, &s.pending)?;
        let mut e = Enc::default();
        e.u32(round + 1).u64(s.dirty_count());
        s.chans[0].wire.control(tag::ROUND, &e.0)?;
        s.send_dirty()?;
        let state = GuestState {
            bytes_per_vcpu: wl_cfg.bytes_per_vcpu,
            write_percent: wl_cfg.write_percent,
            pattern: u8::from(wl_cfg.pattern == Pattern::Random),
            pace_pages_per_sec: final_pace,
            vcpus: wl.vcpu_states(),
        };
        for c in s.chans.iter_mut().skip(1) {
            c.wire.end()?;
        }
        s.chans[0].wire.control(tag::STATE, &state.encode())?;
        s.chans[0].wire.end()?;
        let t1 = Instant::now();
        let (p1, b1, z1) = s.counts();
        rounds.push(RoundStat {
            round: round + 1,
            pages: p1 - p0,
            zero_pages: z1 - z0,
            bytes: b1 - b0,
            start_s: timeline.at(t0),
            end_s: timeline.at(t1),
            bandwidth: (b1 - b0) as f64 / (t1 - t0).as_secs_f64().max(1e-9),
            page_rate: (p1 - p0) as f64 * page as f64 / (t1 - t0).as_secs_f64().max(1e-9),
            throttle_pct,
            pace: final_pace,
            final_round: true,
            ..RoundStat::default()
        });
        if cfg.progress.is_on() {
            let r = rounds.last().expect("pushed");
            cfg.progress.line(&format!(
                "{}round {:>2}: vCPUs paused; sent the last {} pages ({:.1} MiB) and the vCPU state in {:.1} ms",
                cfg.label,
                r.round,
                r.pages,
                r.bytes as f64 / MIB,
                (t1 - t0).as_secs_f64() * 1e3
            ));
        }
        Ok::<(), MigrateError>(())
    })();
    if let Err(e) = stop_copy {
        wl.resume();
        return Err(rejected_or(e, &mut s.chans[0].wire));
    }
    let digests = match read_reply(&mut s.chans[0].wire) {
        Ok(Record::Control {
            tag: tag::RESUMED,
            body,
            at_byte,
        }) => parse_digests(&body, at_byte),
        Ok(other) => Err(unexpected_reply(other, "RESUMED")),
        Err(e) => Err(e),
    };
    let resumed_at = Instant::now();
    let dest_digests = match digests {
        Ok(d) => d,
        Err(e) => {
            // Not resumed there: the guest goes on here.
            wl.resume();
            return Err(e);
        }
    };
    let downtime = resumed_at - pause_at;
    if cfg.progress.is_on() {
        cfg.progress.line(&format!(
            "{}resumed on the destination after {:.1} ms of downtime",
            cfg.label,
            downtime.as_secs_f64() * 1e3
        ));
    }
    let samples = timeline.finish();
    let pause_s = log_start_s + (pause_at - log_start).as_secs_f64();
    let before = phase(warm, warm_end, &samples, 0.0, warm_end_s);
    let during = phase(at_log, at_pause, &samples, log_start_s, pause_s);

    // Verification against the frozen source memory: the byte-for-byte
    // pass first (the destination waits for it under its I/O deadline),
    // then the digests.
    if cfg.verify_full {
        s.chans[0].wire.control(tag::VERIFY, &[])?;
        *s.bucket.lock().unwrap_or_else(|p| p.into_inner()) = TokenBucket::new(0);
        s.send_all_main()?;
        s.chans[0].wire.end()?;
        match read_reply(&mut s.chans[0].wire)? {
            Record::Control {
                tag: tag::VERIFIED,
                body,
                at_byte,
            } => {
                let mut d = Dec::new(&body, "VERIFIED", at_byte);
                let (bad, first) = (d.u64()?, d.u64()?);
                d.finish()?;
                if bad > 0 {
                    let slot = vm.locate(first).map(|(s, _)| s.id).unwrap_or(0);
                    return Err(MigrateError::MemoryMismatch {
                        slot,
                        detail: format!(
                            "{bad} pages differ byte for byte, the first at gpa {first:#x}"
                        ),
                    });
                }
            }
            other => return Err(unexpected_reply(other, "VERIFIED")),
        }
    }
    let slot_digests = source_digests(&vm);
    for (id, d) in &slot_digests {
        match dest_digests.iter().find(|(i, _)| i == id) {
            Some((_, got)) if got == d => {}
            Some((_, got)) => {
                return Err(MigrateError::MemoryMismatch {
                    slot: *id,
                    detail: format!("source digest {d:#018x}, destination {got:#018x}"),
                })
            }
            None => {
                return Err(MigrateError::MemoryMismatch {
                    slot: *id,
                    detail: "the destination reported no digest for it".into(),
                })
            }
        }
    }
    let page_records: u64 = rounds.iter().map(|r| r.pages).sum();
    let zero_pages: u64 = rounds.iter().map(|r| r.zero_pages).sum();
    let bytes: u64 = rounds.iter().map(|r| r.bytes).sum();
    let extras = extras.finish(&vm);
    drop(wl);
    Ok(SourceOutcome {
        rounds,
        total: resumed_at - log_start,
        downtime,
        page_records,
        zero_pages,
        bytes,
        link,
        link_bytes,
        channels: cfg.channels,
        log_start_s,
        pause_s,
        resumed_s: log_start_s + (resumed_at - log_start).as_secs_f64(),
        samples,
        before,
        during,
        slot_digests,
        extras,
        verified_full: cfg.verify_full,
        max_throttle_pct: max_throttle,
        final_pace,
        postcopy: None,
    })
}

/// Reads the destination's next reply on the main connection.
/// PROGRESS (the destination is still preparing) is skipped: each one
/// proves it alive within the I/O timeout.
pub(crate) fn read_reply(w: &mut WireWriter<BoxConn>) -> Result<Record, MigrateError> {
    let mut rd = WireReader::replies(w.get_mut());
    loop {
        match rd.next_record()? {
            Record::Control {
                tag: tag::PROGRESS, ..
            } => {}
            other => return Ok(other),
        }
    }
}

/// A reply that is not the one expected: REJECTED is the destination's
/// reason, anything else malformed.
pub(crate) fn unexpected_reply(r: Record, expected: &str) -> MigrateError {
    match r {
        Record::Control {
            tag: tag::REJECTED,
            body,
            ..
        } => MigrateError::Rejected {
            reason: String::from_utf8_lossy(&body).into_owned(),
        },
        other => MigrateError::Malformed {
            record: "reply",
            at_byte: 0,
            why: format!("expected {expected}, got {}", record_name(&other)),
        },
    }
}

const MIB: f64 = (1u64 << 20) as f64;

fn writes(c: &s2mmu_vm::Control) -> u64 {
    c.live
        .iter()
        .map(|l| l.writes.load(Ordering::Relaxed))
        .sum()
}

/// The vCPUs' counters at an instant: time, guest writes, guest
/// execution nanoseconds.
fn counters(c: &s2mmu_vm::Control) -> (Instant, u64, u64) {
    (
        Instant::now(),
        writes(c),
        c.live
            .iter()
            .map(|l| l.guest_ns.load(Ordering::Relaxed))
            .sum(),
    )
}

/// The guest between two counter snapshots. The time per write is the
/// median over the timeline's intervals in the phase when it has at least
/// three (robust to a host that deschedules a vCPU now and then), else
/// the phase's mean.
fn phase(
    a: (Instant, u64, u64),
    b: (Instant, u64, u64),
    samples: &[Sample],
    from_s: f64,
    to_s: f64,
) -> Phase {
    let w = b.1.saturating_sub(a.1);
    let secs = (b.0 - a.0).as_secs_f64();
    if w == 0 || secs <= 0.0 {
        return Phase::default();
    }
    let per: Vec<f64> = intervals(samples)
        .iter()
        .filter(|i| i.start_s >= from_s && i.end_s <= to_s)
        .filter_map(|i| i.speed.map(|v| 1e9 / v))
        .collect();
    let ns_per_write = match crate::stats::median(&per) {
        Some(m) if per.len() >= 3 => m,
        _ => b.2.saturating_sub(a.2) as f64 / w as f64,
    };
    Phase {
        write_rate: w as f64 / secs,
        ns_per_write,
    }
}

/// When sending failed because the destination gave up, its reason is the
/// better error.
fn rejected_or(e: MigrateError, main: &mut WireWriter<BoxConn>) -> MigrateError {
    if !matches!(e, MigrateError::Io { .. }) {
        return e;
    }
    match read_reply(main) {
        Ok(Record::Control {
            tag: tag::REJECTED,
            body,
            ..
        }) => MigrateError::Rejected {
            reason: String::from_utf8_lossy(&body).into_owned(),
        },
        _ => e,
    }
}

fn parse_digests(body: &[u8], at_byte: u64) -> Result<Vec<(u16, u64)>, MigrateError> {
    let mut d = Dec::new(body, "RESUMED", at_byte);
    let n = d.u32()?;
    let mut v = Vec::new();
    for _ in 0..n {
        v.push((d.u16()?, d.u64()?));
    }
    d.finish()?;
    Ok(v)
}

/// Per-slot digests of the source's memory as it is now: XXH3 of every
/// page (seeded with its address), then of those hashes in page order, as
/// the destination computes them.
pub fn source_digests(vm: &Vm) -> Vec<(u16, u64)> {
    let mut buf = vec![0u8; PAGE_SIZE];
    vm.slots()
        .iter()
        .map(|s| {
            let n = s.size / PAGE_SIZE as u64;
            let hashes: Vec<u64> = (0..n)
                .map(|i| {
                    let off = s.mem_offset + i * PAGE_SIZE as u64;
                    vm.memory().read_into(off, &mut buf);
                    page_hash(&buf, s.gpa + i * PAGE_SIZE as u64)
                })
                .collect();
            (s.id, digest_of(&hashes))
        })
        .collect()
}

/// One channel of the stream with the batch being filled for it.
struct Chan {
    wire: WireWriter<BoxConn>,
    batch: Batch,
}

impl Chan {
    fn new(wire: WireWriter<BoxConn>) -> Self {
        Chan {
            wire,
            batch: Batch::new(),
        }
    }

    /// Sends the batch (paced by the bandwidth limit).
    fn flush_batch(&mut self, bucket: &Mutex<TokenBucket>) -> Result<(), MigrateError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        bucket
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(self.batch.wire_bytes());
        self.wire.batch(&mut self.batch)
    }

    /// Sends the pages of `job` that channel `c` of `n` owns.
    fn send_job(
        &mut self,
        vm: &Vm,
        bucket: &Mutex<TokenBucket>,
        c: u16,
        n: u16,
        job: &Job,
    ) -> Result<(), MigrateError> {
        let s = vm.slots()[job.slot];
        let first_index = s.mem_offset / PAGE_SIZE as u64;
        let memory = vm.memory();
        for (wi, &word) in job.words.iter().enumerate() {
            let mut m = word;
            while m != 0 {
                let b = u64::from(m.trailing_zeros());
                m &= m - 1;
                let i = job.first + wi as u64 * 64 + b;
                if n > 1 && channel_of(first_index + i, n) != c {
                    continue;
                }
                let off = s.mem_offset + i * PAGE_SIZE as u64;
                self.batch
                    .push_known(s.gpa + i * PAGE_SIZE as u64, |p| copy_page(memory, off, p));
                if self.batch.is_full() {
                    self.flush_batch(bucket)?;
                }
            }
        }
        Ok(())
    }
}

/// Copies the guest page at `off` into `dst` word by word (atomically per
/// word: the guest may be writing it), and says whether it was all zeros.
pub(crate) fn copy_page(memory: &GuestMemory, off: u64, dst: &mut [u8]) -> bool {
    if off + PAGE_SIZE as u64 > memory.size() || dst.len() != PAGE_SIZE {
        memory.read_into(off, dst);
        return is_zero(dst);
    }
    // SAFETY: the page lies inside the live mapping (checked above) and is
    // 8-byte aligned (guest memory is page-aligned); like GuestMemory's own
    // accessors, every access to it is atomic.
    let words = unsafe {
        std::slice::from_raw_parts(
            (memory.host_addr() + off) as *const AtomicU64,
            PAGE_SIZE / 8,
        )
    };
    let mut acc = 0u64;
    for (w, d) in words.iter().zip(dst.chunks_exact_mut(8)) {
        let v = w.load(Ordering::Relaxed);
        acc |= v;
        d.copy_from_slice(&v.to_le_bytes());
    }
    acc == 0
}

/// Pages of one slot to send: bit b of `words[w]` is page
/// `first + 64 w + b` of the slot.
struct Job {
    slot: usize,
    first: u64,
    words: Vec<u64>,
}

/// A bitmap with the first `n` bits set.
fn all_pages(n: u64) -> Vec<u64> {
    let mut words = vec![u64::MAX; n.div_ceil(64) as usize];
    if !n.is_multiple_of(64) {
        if let Some(w) = words.last_mut() {
            *w = (1u64 << (n % 64)) - 1;
        }
    }
    words
}

/// The sending half: pages out of guest memory onto the channels, with
/// the pending dirty set per slot.
struct Sender<'a> {
    vm: &'a Arc<Vm>,
    chans: Vec<Chan>,
    bucket: Mutex<TokenBucket>,
    /// Pages to send, one bitmap per slot (bit i = page i of the slot).
    pending: Vec<Vec<u64>>,
    ring: bool,
    vcpus: usize,
    /// Pages per `clear_dirty_log` call (a multiple of 64).
    chunk_pages: u64,
    gfns: Vec<DirtyGfn>,
}

impl Sender<'_> {
    /// Pages, bytes and zero pages sent so far on all channels.
    fn counts(&self) -> (u64, u64, u64) {
        self.chans.iter().fold((0, 0, 0), |(p, b, z), c| {
            (p + c.wire.pages, b + c.wire.pos, z + c.wire.zero_pages)
        })
    }

    /// The link figure: `total` bytes of filler over all channels at once
    /// (paced like pages), until the destination says it has them all.
    fn probe(&mut self, total: u64) -> Result<(u64, Duration), MigrateError> {
        let n = self.chans.len() as u64;
        let filler: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + 1) as u8).collect();
        let bucket = &self.bucket;
        let t0 = Instant::now();
        let per = total / n;
        let results: Vec<Result<(), MigrateError>> = std::thread::scope(|sc| {
            let handles: Vec<_> = self
                .chans
                .iter_mut()
                .enumerate()
                .map(|(i, c)| {
                    let len = if i == 0 { total - per * (n - 1) } else { per };
                    let filler = &filler;
                    let f = move || {
                        c.wire.probe(len, filler, &mut |b| {
                            bucket.lock().unwrap_or_else(|p| p.into_inner()).take(b)
                        })
                    };
                    if i == 0 || n == 1 {
                        Err(f)
                    } else {
                        Ok(sc.spawn(f))
                    }
                })
                .collect();
            handles
                .into_iter()
                .map(|h| match h {
                    Ok(h) => h.join().unwrap_or_else(|_| {
                        Err(MigrateError::Setup("a probe thread panicked".into()))
                    }),
                    Err(mut f) => f(),
                })
                .collect()
        });
        for r in results {
            r?;
        }
        match read_reply(&mut self.chans[0].wire)? {
            Record::Control {
                tag: tag::PROBED,
                body,
                at_byte,
            } => {
                let mut d = Dec::new(&body, "PROBED", at_byte);
                let got = d.u64()?;
                d.finish()?;
                if got != total {
                    return Err(d.malformed(format!(
                        "the destination received {got} probe bytes of {total}"
                    )));
                }
            }
            other => return Err(unexpected_reply(other, "PROBED")),
        }
        Ok((total, t0.elapsed()))
    }

    /// Sends `jobs` over the channels (each page on the channel owning its
    /// stripe), then flushes every channel. `next` makes the next job
    /// (and may clear its dirty bits first); with rings, they are reaped
    /// between jobs.
    fn run(
        &mut self,
        mut next: impl FnMut(&mut Self) -> Result<Option<Job>, MigrateError>,
    ) -> Result<(), MigrateError> {
        let n = self.chans.len() as u16;
        if n == 1 {
            while let Some(job) = next(self)? {
                self.chans[0].send_job(self.vm, &self.bucket, 0, 1, &job)?;
                if self.ring {
                    self.reap_if_full()?;
                }
            }
            self.chans[0].flush_batch(&self.bucket)?;
            return self.chans[0].wire.flush();
        }
        let mut chans = std::mem::take(&mut self.chans);
        let vm = self.vm.clone();
        let bucket = std::mem::replace(&mut self.bucket, Mutex::new(TokenBucket::new(0)));
        let result = std::thread::scope(|sc| {
            let mut txs = Vec::new();
            let mut handles = Vec::new();
            for (c, chan) in chans.iter_mut().enumerate() {
                let (tx, rx) = std::sync::mpsc::sync_channel::<Arc<Job>>(2);
                txs.push(tx);
                let (vm, bucket) = (&vm, &bucket);
                handles.push(sc.spawn(move || {
                    for job in rx {
                        chan.send_job(vm, bucket, c as u16, n, &job)?;
                    }
                    chan.flush_batch(bucket)?;
                    chan.wire.flush()
                }));
            }
            let mut fed = Ok(());
            'jobs: loop {
                let job = match next(self) {
                    Ok(Some(j)) => Arc::new(j),
                    Ok(None) => break,
                    Err(e) => {
                        fed = Err(e);
                        break;
                    }
                };
                for tx in &txs {
                    let mut j = job.clone();
                    loop {
                        match tx.try_send(j) {
                            Ok(()) => break,
                            Err(std::sync::mpsc::TrySendError::Full(back)) => {
                                j = back;
                                if self.ring {
                                    if let Err(e) = self.reap_if_full() {
                                        fed = Err(e);
                                        break 'jobs;
                                    }
                                }
                                std::thread::sleep(Duration::from_micros(50));
                            }
                            // The worker failed: its error is reported below.
                            Err(std::sync::mpsc::TrySendError::Disconnected(_)) => break 'jobs,
                        }
                    }
                }
            }
            drop(txs);
            while self.ring && handles.iter().any(|h| !h.is_finished()) {
                if let Err(e) = self.reap_if_full() {
                    fed = fed.and(Err(e));
                    break;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            let mut r = fed;
            for h in handles {
                let w = h.join().unwrap_or_else(|_| {
                    Err(MigrateError::Setup("a sending thread panicked".into()))
                });
                r = r.and(w);
            }
            r
        });
        self.chans = chans;
        self.bucket = bucket;
        result
    }

    /// Round 0: every page.
    fn send_all(&mut self) -> Result<(), MigrateError> {
        let step = if self.ring { 256 } else { self.chunk_pages };
        let mut at = (0usize, 0u64);
        self.run(|s| {
            let slots = s.vm.slots();
            while at.0 < slots.len() {
                let npages = slots[at.0].size / PAGE_SIZE as u64;
                if at.1 < npages {
                    let n = step.min(npages - at.1);
                    let job = Job {
                        slot: at.0,
                        first: at.1,
                        words: all_pages(n),
                    };
                    at.1 += n;
                    return Ok(Some(job));
                }
                at = (at.0 + 1, 0);
            }
            Ok(None)
        })
    }

    /// The verification pass: every page on the main channel.
    fn send_all_main(&mut self) -> Result<(), MigrateError> {
        let vm = self.vm.clone();
        for (slot, info) in vm.slots().iter().enumerate() {
            let npages = info.size / PAGE_SIZE as u64;
            let mut first = 0;
            while first < npages {
                let n = (64 * 64u64).min(npages - first);
                let job = Job {
                    slot,
                    first,
                    words: all_pages(n),
                };
                self.chans[0].send_job(&vm, &self.bucket, 0, 1, &job)?;
                first += n;
            }
        }
        self.chans[0].flush_batch(&self.bucket)?;
        self.chans[0].wire.flush()
    }

    fn dirty_count(&self) -> u64 {
        self.pending
            .iter()
            .flatten()
            .map(|w| u64::from(w.count_ones()))
            .sum()
    }

    /// Sends the pending pages. With bitmaps each chunk's dirty bits are
    /// cleared (and its pages write-protected) just before its pages are
    /// handed to the channels, so a write after the clear is logged again.
    fn send_dirty(&mut self) -> Result<(), MigrateError> {
        let mmu = self.vm.mmu().clone();
        let step = if self.ring { 256 } else { self.chunk_pages };
        let mut at = (0usize, 0u64);
        self.run(|s| {
            while at.0 < s.pending.len() {
                let info = s.vm.slots()[at.0];
                let npages = info.size / PAGE_SIZE as u64;
                while at.1 < npages {
                    let (slot, first) = at;
                    let n = step.min(npages - first);
                    at.1 += n;
                    let (w0, w1) = ((first / 64) as usize, (first + n).div_ceil(64) as usize);
                    if s.pending[slot][w0..w1].iter().all(|&w| w == 0) {
                        continue;
                    }
                    if !s.ring {
                        mmu.clear_dirty_log(info.id, first, n, &s.pending[slot][w0..w1])
                            .map_err(|e| {
                                MigrateError::Setup(format!("clearing the dirty log: {e}"))
                            })?;
                    }
                    let words: Vec<u64> = s.pending[slot][w0..w1]
                        .iter_mut()
                        .map(std::mem::take)
                        .collect();
                    return Ok(Some(Job { slot, first, words }));
                }
                at = (at.0 + 1, 0);
            }
            Ok(None)
        })
    }

    /// End of a round: what the guest dirtied since the pages were last
    /// protected. Returns the number of pending pages.
    fn harvest(&mut self) -> Result<u64, MigrateError> {
        if self.ring {
            self.reap()?;
        } else {
            let mmu = self.vm.mmu().clone();
            for (slot, bm) in self.vm.slots().iter().zip(self.pending.iter_mut()) {
                mmu.get_dirty_log(slot.id, bm)
                    .map_err(|e| MigrateError::Setup(format!("getting the dirty log: {e}")))?;
            }
        }
        Ok(self.dirty_count())
    }

    /// With the vCPUs paused: everything still dirty (nothing is
    /// re-protected; the guest will not run here again).
    fn final_harvest(&mut self) -> Result<(), MigrateError> {
        if self.ring {
            let mmu = self.vm.mmu().clone();
            self.gfns.clear();
            mmu.harvest_rings(&mut self.gfns)
                .map_err(|e| MigrateError::Setup(format!("harvesting the dirty rings: {e}")))?;
            self.mark_gfns();
            Ok(())
        } else {
            self.harvest().map(|_| ())
        }
    }

    fn reap_if_full(&mut self) -> Result<(), MigrateError> {
        let mmu = self.vm.mmu();
        if (0..self.vcpus).any(|v| mmu.ring_soft_full(v)) {
            self.reap()?;
        }
        Ok(())
    }

    /// Harvests every ring into the pending set, then resets them (which
    /// re-protects the pages: they are read only after this).
    fn reap(&mut self) -> Result<(), MigrateError> {
        let mmu = self.vm.mmu().clone();
        self.gfns.clear();
        mmu.harvest_rings(&mut self.gfns)
            .and_then(|_| mmu.reset_rings())
            .map_err(|e| MigrateError::Setup(format!("reaping the dirty rings: {e}")))?;
        self.mark_gfns();
        Ok(())
    }

    fn mark_gfns(&mut self) {
        for g in &self.gfns {
            let Some(slot) = self
                .vm
                .slots()
                .iter()
                .position(|s| u32::from(s.id) == g.slot)
            else {
                continue;
            };
            if let Some(w) = self.pending[slot].get_mut((g.offset / 64) as usize) {
                *w |= 1 << (g.offset % 64);
            }
        }
    }
}
