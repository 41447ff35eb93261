//! The destination: authenticates the source, checks what the stream asks
//! for against its own limits before it allocates anything, receives the
//! pages straight into its guest memory over one or more channels,
//! verifies every page and the whole, and resumes the guest only from a
//! complete, valid stream.

use super::error::MigrateError;
use super::hash::{digest_of, page_hash, ZERO_PAGE};
use super::net::{self, BoxConn, Conn, Duplex, NetConfig};
use super::postcopy;
use super::wire::{
    channel_of, record_name, tag, tag_name, Dec, Enc, GuestState, Header, Opening, Record,
    WireReader, WireWriter, MAX_BATCH, MAX_CHANNELS, MAX_MEM, MAX_SLOTS, MAX_VCPUS, PAGE_SIZE,
    SESSION_LEN,
};
use ring::rand::{SecureRandom, SystemRandom};
use s2mmu::memslot::TreeMemslots;
use s2mmu::mmu::{DirtyMode, MmuPolicy};
use s2mmu_vm::{Backing, Pattern, Vm, VmConfig, Workload, WorkloadConfig};
use std::io::{IoSliceMut, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the destination accepts: a stream that asks for more is rejected
/// before anything is allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of guest memory.
    pub max_mem: u64,
    /// vCPUs.
    pub max_vcpus: u32,
    /// Memslots.
    pub max_slots: u32,
    /// Channels (connections) of one migration.
    pub max_channels: u16,
}

impl Limits {
    /// Only this build's own bounds.
    pub fn of_build() -> Self {
        Limits {
            max_mem: MAX_MEM,
            max_vcpus: MAX_VCPUS,
            max_slots: MAX_SLOTS,
            max_channels: MAX_CHANNELS,
        }
    }

    /// Checks a header against these limits.
    ///
    /// # Errors
    /// [`MigrateError::OverLimit`].
    pub fn check(&self, h: &Header) -> Result<(), MigrateError> {
        let over = |what, asked: u64, allowed: u64| {
            if asked > allowed {
                Err(MigrateError::OverLimit {
                    what,
                    asked,
                    allowed,
                })
            } else {
                Ok(())
            }
        };
        over("bytes of guest memory", h.mem_size, self.max_mem)?;
        over("vCPUs", u64::from(h.vcpus), u64::from(self.max_vcpus))?;
        over("memslots", u64::from(h.slots), u64::from(self.max_slots))?;
        over(
            "channels",
            u64::from(h.channels),
            u64::from(self.max_channels),
        )
    }
}

/// How the destination runs.
#[derive(Clone, Debug)]
pub struct DestConfig {
    /// The destination MMU's policies.
    pub policy: MmuPolicy,
    /// How long to run the resumed guest before stopping (it proves the
    /// guest runs; the source has stopped it by then).
    pub run_after: Duration,
    /// What it accepts.
    pub limits: Limits,
    /// How long it waits for the source's further channels.
    pub io_timeout: Duration,
    /// Log connections on stderr.
    pub progress: bool,
    /// Back all of guest memory with RAM before the stream starts.
    pub prefault: bool,
}

impl DestConfig {
    /// A destination with `policy` that accepts what this build can take.
    pub fn new(policy: MmuPolicy, run_after: Duration) -> Self {
        DestConfig {
            policy,
            run_after,
            limits: Limits::of_build(),
            io_timeout: Duration::from_secs(5),
            progress: false,
            prefault: true,
        }
    }
}

/// What the destination did.
#[derive(Clone, Debug, Default)]
pub struct DestOutcome {
    /// Page records received up to END on all channels (pages sent more
    /// than once count each time; the verification pass not included).
    pub page_records: u64,
    /// Of those, zero pages.
    pub zero_pages: u64,
    /// Stream bytes received up to END on all channels.
    pub bytes: u64,
    /// Channels the stream came over.
    pub channels: u16,
    /// Bytes of the link probe.
    pub probe_bytes: u64,
    /// How long backing guest memory with RAM took (before the stream).
    pub prefault: Duration,
    /// When the guest resumed.
    pub resumed_at: Option<Instant>,
    /// Per-slot digests of the memory the guest resumed from.
    pub slot_digests: Vec<(u16, u64)>,
    /// With verify-full: pages that differ byte for byte from the source's.
    pub verify_mismatches: Option<u64>,
    /// Guest writes per second after the resume.
    pub resumed_write_rate: f64,
    /// Passes each vCPU had reached when the destination stopped it.
    pub resumed_passes: Vec<u64>,
    /// Post-copy's figures (None: pre-copy only).
    pub postcopy: Option<super::postcopy::PostcopyFigures>,
}

/// Accepts one source on `listener`, authenticates it as `net` says,
/// joins its further channels and receives the migration.
///
/// # Errors
/// [`MigrateError::Auth`] when the peer failed authentication (nothing of
/// the stream was read, no guest memory exists yet); otherwise as
/// [`receive_from`].
pub fn serve(
    listener: &TcpListener,
    cfg: &DestConfig,
    net: &NetConfig,
) -> Result<DestOutcome, MigrateError> {
    let (s, peer) = net::accept_until(listener, None)?;
    if cfg.progress {
        eprintln!("source connected from {peer}");
    }
    let main = net::server(s, net)?;
    receive_core(main, cfg, &mut |session, wanted, wait| {
        join_channels(listener, net, wait, session, wanted)
    })
}

/// Receives one migration from `input`, replying on `reply`: one channel,
/// no authentication (a recorded stream, a fuzzer's, a test's).
///
/// # Errors
/// Any stream error ([`MigrateError::Truncated`],
/// [`MigrateError::PageChecksum`], ...), [`MigrateError::OverLimit`],
/// [`MigrateError::BadState`], [`MigrateError::Incomplete`],
/// [`MigrateError::Aborted`]. On an error the guest is not resumed and the
/// source is told why when the connection still works.
pub fn receive_from<R: Read + Send, W: Write + Send>(
    input: R,
    reply: W,
    cfg: &DestConfig,
) -> Result<DestOutcome, MigrateError> {
    receive_core(
        Duplex {
            input,
            output: reply,
        },
        cfg,
        &mut |_, wanted, _| {
            Err(MigrateError::OverLimit {
                what: "connections",
                asked: wanted.len() as u64 + 1,
                allowed: 1,
            })
        },
    )
}

/// Receives one migration on an accepted, authenticated TCP connection
/// (one channel only).
///
/// # Errors
/// As [`receive_from`].
pub fn receive(stream: TcpStream, cfg: &DestConfig) -> Result<DestOutcome, MigrateError> {
    net::configure(&stream, cfg.io_timeout)?;
    receive_from(
        stream
            .try_clone()
            .map_err(|e| MigrateError::io("the connection", &e))?,
        stream,
        cfg,
    )
}

/// Accepts connections joining a session: the channel numbers wanted, in
/// that order, waiting at most the given time.
pub(crate) type Join<'a> = dyn FnMut(&[u8; SESSION_LEN], &[u16], Duration) -> Result<Vec<WireReader<BoxConn>>, MigrateError>
    + 'a;

/// Accepts the source's connections that join `session` with the channel
/// numbers `wanted` (its further channels; post-copy's recovery): each
/// must authenticate and join with a wanted number not seen yet. Others
/// are dropped; the wait ends after `wait`. Returns them in `wanted`'s
/// order.
fn join_channels(
    listener: &TcpListener,
    net: &NetConfig,
    wait: Duration,
    session: &[u8; SESSION_LEN],
    wanted: &[u16],
) -> Result<Vec<WireReader<BoxConn>>, MigrateError> {
    let mut got: Vec<Option<WireReader<BoxConn>>> = wanted.iter().map(|_| None).collect();
    let deadline = Instant::now() + wait;
    while got.iter().any(Option::is_none) {
        let (s, peer) = net::accept_until(listener, Some(deadline))?;
        let conn = match net::server(s, net) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("refused a connection from {peer} while joining channels: {e}");
                continue;
            }
        };
        match WireReader::open(conn) {
            Ok((
                rd,
                Opening::Join {
                    session: s,
                    channel,
                },
            )) if &s == session
                && wanted
                    .iter()
                    .position(|&c| c == channel)
                    .is_some_and(|k| got[k].is_none()) =>
            {
                if let Some(k) = wanted.iter().position(|&c| c == channel) {
                    got[k] = Some(rd);
                }
            }
            Ok(_) => eprintln!("refused a connection from {peer}: not a channel of this migration"),
            Err(e) => eprintln!("refused a connection from {peer}: {e}"),
        }
    }
    Ok(got.into_iter().flatten().collect())
}

fn receive_core<C: Conn>(
    mut main: C,
    cfg: &DestConfig,
    join: &mut Join<'_>,
) -> Result<DestOutcome, MigrateError> {
    let result = receive_inner(&mut main, cfg, join);
    if let Err(e) = &result {
        if !matches!(e, MigrateError::Aborted { .. }) {
            let mut r = WireWriter::replies(&mut main);
            let _ = r.control(tag::REJECTED, e.to_string().as_bytes());
            let _ = r.flush();
        }
    }
    result
}

/// The destination's guest memory, written directly (no vCPU runs before
/// the resume, and every page belongs to exactly one channel's thread).
struct RawMem {
    base: *mut u8,
    size: u64,
}

// SAFETY: a plain pointer into a mapping the VM keeps alive for as long as
// the receiving threads run (they are scoped inside `receive_inner`, which
// holds the VM); which thread may touch which page is the stripe rule,
// checked before every write.
unsafe impl Send for RawMem {}
// SAFETY: as above.
unsafe impl Sync for RawMem {}

impl RawMem {
    /// The page at `off`.
    ///
    /// # Safety
    /// `off` is a page-aligned offset inside guest memory, no vCPU runs,
    /// and only the calling thread accesses this page while the slice
    /// lives (the page belongs to its channel).
    #[allow(clippy::mut_from_ref)]
    unsafe fn page(&self, off: u64) -> &mut [u8] {
        debug_assert!(off + PAGE_SIZE as u64 <= self.size);
        // SAFETY: in bounds of the live mapping (the caller's contract),
        // and exclusively this thread's.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(off as usize), PAGE_SIZE) }
    }
}

/// What the receiving threads share.
struct Shared<'a> {
    vm: &'a Vm,
    raw: RawMem,
    channels: u16,
    /// One bit per page: received at least once.
    received: Vec<AtomicU64>,
    /// Each page's hash.
    hashes: Vec<AtomicU64>,
    /// With verify-full: the memory the guest resumes from.
    snapshot: Option<Vec<AtomicU64>>,
}

impl Shared<'_> {
    /// Takes the data of the PAGES record just read on `channel` into
    /// guest memory (one vectored read for all its pages), checking each
    /// page.
    fn take_pages<R: Read>(
        &self,
        rd: &mut WireReader<R>,
        channel: u16,
        at_byte: u64,
    ) -> Result<(), MigrateError> {
        // Every entry is checked before any byte lands: in guest memory,
        // on its own channel, and not twice in the record (each page
        // becomes its own slice).
        let mut offs = [0u64; MAX_BATCH];
        let n = rd.entries().len();
        for (k, e) in rd.entries().iter().enumerate() {
            let off = page_offset(self.vm, e.gpa, at_byte)?;
            let owner = channel_of(off / PAGE_SIZE as u64, self.channels);
            if owner != channel {
                return Err(MigrateError::Malformed {
                    record: "PAGES",
                    at_byte,
                    why: format!(
                        "the page at gpa {:#x} came on channel {channel}; it belongs to channel {owner}",
                        e.gpa
                    ),
                });
            }
            offs[k] = off;
        }
        let mut sorted = offs;
        sorted[..n].sort_unstable();
        if let Some(w) = sorted[..n].windows(2).find(|w| w[0] == w[1]) {
            return Err(MigrateError::Malformed {
                record: "PAGES",
                at_byte,
                why: format!("the page at offset {:#x} twice in one record", w[0]),
            });
        }
        let mut bufs: Vec<IoSliceMut<'_>> = Vec::with_capacity(n);
        for (k, e) in rd.entries().iter().enumerate() {
            if !e.zero {
                // SAFETY: `offs[k]` is a page of guest memory (page_offset),
                // the guest does not run before the resume, the page
                // belongs to `channel`, which only this thread reads, and
                // no other slice of this record covers it (no duplicates).
                bufs.push(IoSliceMut::new(unsafe { self.raw.page(offs[k]) }));
            }
        }
        rd.read_pages(&mut bufs)?;
        drop(bufs);
        for (k, &off) in offs[..n].iter().enumerate() {
            let e = rd.entries()[k];
            let i = off / PAGE_SIZE as u64;
            let bit = 1u64 << (i % 64);
            let seen = self.received[(i / 64) as usize].load(Ordering::Relaxed) & bit != 0;
            // SAFETY: as above; the slices given to the read are gone.
            let page = unsafe { self.raw.page(off) };
            let hash = if e.zero {
                if seen {
                    page.fill(0);
                }
                page_hash(&ZERO_PAGE, e.gpa)
            } else {
                if page_hash(page, e.gpa) != e.hash {
                    return Err(MigrateError::PageChecksum {
                        gpa: e.gpa,
                        at_byte,
                    });
                }
                e.hash
            };
            if let Some(snap) = &self.snapshot {
                let w0 = (off / 8) as usize;
                for (j, w) in page.chunks_exact(8).enumerate() {
                    let v = u64::from_le_bytes(w.try_into().expect("8 bytes"));
                    snap[w0 + j].store(v, Ordering::Relaxed);
                }
            }
            self.received[(i / 64) as usize].fetch_or(bit, Ordering::Relaxed);
            self.hashes[i as usize].store(hash, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// Reads a PROBE and drops its bytes; returns its length.
fn take_probe<R: Read>(rd: &mut WireReader<R>, h: &Header) -> Result<u64, MigrateError> {
    match rd.next_record()? {
        Record::Probe { len, at_byte } => {
            if len > h.mem_size {
                return Err(MigrateError::Malformed {
                    record: "PROBE",
                    at_byte,
                    why: format!(
                        "{len} bytes, more than the guest's {} bytes of memory",
                        h.mem_size
                    ),
                });
            }
            rd.discard(len)?;
            Ok(len)
        }
        other => Err(MigrateError::Malformed {
            record: "PROBE",
            at_byte: rd.pos,
            why: format!("expected the link probe, got {}", record_name(&other)),
        }),
    }
}

/// A further channel: its probe, then pages until its END.
fn channel_loop(
    rd: &mut WireReader<BoxConn>,
    sh: &Shared<'_>,
    h: &Header,
    channel: u16,
    probed: &std::sync::mpsc::Sender<Result<u64, MigrateError>>,
) -> Result<(), MigrateError> {
    let p = take_probe(rd, h);
    let failed = p.is_err();
    let _ = probed.send(p.clone());
    if failed {
        return p.map(|_| ());
    }
    loop {
        let at_byte = rd.pos;
        match rd.next_record()? {
            Record::Pages { .. } => sh.take_pages(rd, channel, at_byte)?,
            Record::Control {
                tag: tag::END,
                body,
                at_byte,
            } => return check_end(&body, at_byte, rd.pages),
            other => {
                return Err(MigrateError::Malformed {
                    record: "channel",
                    at_byte,
                    why: format!(
                        "channel {channel} carries pages and END only, got {}",
                        record_name(&other)
                    ),
                })
            }
        }
    }
}

/// Checks the vCPU state against the header before any vCPU starts.
fn check_state(s: &GuestState, h: &Header) -> Result<(), MigrateError> {
    let bad = |why: String| Err(MigrateError::BadState { why });
    let n = s.vcpus.len() as u64;
    if n != u64::from(h.vcpus) {
        return bad(format!(
            "{n} vCPUs in STATE, the header announced {}",
            h.vcpus
        ));
    }
    if s.write_percent > 100 || s.pattern > 1 {
        return bad(format!(
            "write percent {} (at most 100), pattern {} (0 or 1)",
            s.write_percent, s.pattern
        ));
    }
    let page = PAGE_SIZE as u64;
    if s.bytes_per_vcpu < page || !s.bytes_per_vcpu.is_multiple_of(page) {
        return bad(format!(
            "vCPU regions of {} bytes (whole pages)",
            s.bytes_per_vcpu
        ));
    }
    match s.bytes_per_vcpu.checked_mul(n) {
        Some(need) if need <= h.mem_size => {}
        _ => {
            return bad(format!(
                "{n} vCPU regions of {} bytes do not fit {} bytes of guest memory",
                s.bytes_per_vcpu, h.mem_size
            ))
        }
    }
    let pages = s.bytes_per_vcpu / page;
    if let Some((i, v)) = s
        .vcpus
        .iter()
        .enumerate()
        .find(|(_, v)| v.pass == 0 || v.next_page > pages)
    {
        return bad(format!(
            "vCPU {i} at pass {}, page {} of a {pages}-page region",
            v.pass, v.next_page
        ));
    }
    Ok(())
}

fn receive_inner<C: Conn>(
    main: &mut C,
    cfg: &DestConfig,
    join: &mut Join<'_>,
) -> Result<DestOutcome, MigrateError> {
    let (mut rd, header) = WireReader::new(main)?;
    // Nothing is allocated before the stream is known to fit.
    cfg.limits.check(&header)?;
    Backing::parse(&header.backing).map_err(MigrateError::Setup)?;
    let page_count = header.mem_size / PAGE_SIZE as u64;
    let vm = Arc::new(build_vm(&header, cfg.policy)?);
    let prefault = if cfg.prefault {
        populate(&vm, &mut rd)?
    } else {
        Duration::ZERO
    };
    let (session, mut extras, pc_conns) = accept_and_join(&mut rd, &header, cfg, join)?;
    let sh = Shared {
        vm: &vm,
        raw: RawMem {
            base: vm.memory().host_addr() as *mut u8,
            size: vm.memory().size(),
        },
        channels: header.channels,
        received: (0..page_count.div_ceil(64))
            .map(|_| AtomicU64::new(0))
            .collect(),
        hashes: (0..page_count).map(|_| AtomicU64::new(0)).collect(),
        snapshot: snapshot_for(&header)?,
    };
    let got = receive_channels(&mut rd, &mut extras, &sh, &header)?;
    let extra_counts = extras.iter().fold((0u64, 0u64, 0u64), |(a, b, z), x| {
        (a + x.pages, b + x.pos, z + x.zero_pages)
    });
    // Never resume from incomplete memory (post-copy: every page but the
    // missing ones, which come after the resume).
    check_complete(&sh, got.postcopy_missing.as_deref(), &vm)?;
    let state = got.state.ok_or(MigrateError::Malformed {
        record: "END",
        at_byte: rd.pos,
        why: "the stream carried no vCPU STATE".into(),
    })?;
    check_state(&state, &header)?;
    if let Some(missing) = got.postcopy_missing {
        let mut pc = pc_conns.into_iter();
        let (Some(req), Some(answers)) = (pc.next(), pc.next()) else {
            return Err(MigrateError::Setup(
                "post-copy's connections did not join".into(),
            ));
        };
        let main_socket = rd.get_mut().tcp().and_then(|s| s.try_clone().ok());
        return postcopy::dest::resume(postcopy::dest::Resume {
            vm: &vm,
            main: &mut rd,
            main_socket,
            req,
            answers,
            state: &state,
            missing,
            cfg,
            extra_counts,
            channels: header.channels,
            probe_bytes: got.probe_bytes,
            prefault,
            recover: &mut |wanted, wait| join(&session, wanted, wait),
        });
    }
    let mut outcome = resume_after_end(&mut rd, &vm, &sh, &state, cfg)?;
    outcome.page_records += extra_counts.0;
    outcome.bytes += extra_counts.1;
    outcome.zero_pages += extra_counts.2;
    outcome.channels = header.channels;
    outcome.probe_bytes = got.probe_bytes;
    outcome.prefault = prefault;
    Ok(outcome)
}

/// Accepts the stream (ACCEPT with a fresh session id) and waits for the
/// further channels to join it; returns the session, the data channels
/// beyond the main one, and post-copy's request and answer connections.
#[allow(clippy::type_complexity)]
fn accept_and_join<C: Conn>(
    rd: &mut WireReader<&mut C>,
    header: &Header,
    cfg: &DestConfig,
    join: &mut Join<'_>,
) -> Result<
    (
        [u8; SESSION_LEN],
        Vec<WireReader<BoxConn>>,
        Vec<WireReader<BoxConn>>,
    ),
    MigrateError,
> {
    let mut session = [0u8; SESSION_LEN];
    SystemRandom::new()
        .fill(&mut session)
        .map_err(|_| MigrateError::Setup("no random numbers for a session id".into()))?;
    {
        let mut w = WireWriter::replies(rd.get_mut());
        w.control(tag::ACCEPT, &session)?;
        w.flush()?;
    }
    if header.postcopy && header.verify_full {
        return Err(MigrateError::Malformed {
            record: "HEADER",
            at_byte: 10,
            why: "post-copy with verify-full (the byte comparison needs the memory the guest resumed from)".into(),
        });
    }
    let mut extras = if header.channels > 1 || header.postcopy {
        // Post-copy's request and answer connections join after the data
        // channels.
        let n = header.channels + if header.postcopy { 2 } else { 0 };
        join(&session, &(1..n).collect::<Vec<u16>>(), cfg.io_timeout)?
    } else {
        Vec::new()
    };
    // Post-copy's two connections are not data channels.
    let pc_conns = if header.postcopy {
        extras.split_off(extras.len().saturating_sub(2))
    } else {
        Vec::new()
    };
    Ok((session, extras, pc_conns))
}

/// With verify-full: room for a copy of guest memory, allocated only if
/// the host has it.
fn snapshot_for(header: &Header) -> Result<Option<Vec<AtomicU64>>, MigrateError> {
    if !header.verify_full {
        return Ok(None);
    }
    let n = (header.mem_size / 8) as usize;
    let mut v: Vec<AtomicU64> = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        MigrateError::Setup(format!(
            "no memory for a {}-byte copy of the guest (--verify-full)",
            header.mem_size
        ))
    })?;
    v.resize_with(n, || AtomicU64::new(0));
    Ok(Some(v))
}

/// What the main channel delivered up to its END (or POSTCOPY).
struct Received {
    /// Bytes of all channels' link probes.
    probe_bytes: u64,
    /// The vCPUs' STATE, if the stream carried one.
    state: Option<GuestState>,
    /// Post-copy: the pages still missing (a bitmap).
    postcopy_missing: Option<Vec<u64>>,
}

/// Receives every channel at once, the further ones on their own threads,
/// until each one's END; the first error ends the others' connections.
fn receive_channels<C: Conn>(
    rd: &mut WireReader<&mut C>,
    extras: &mut [WireReader<BoxConn>],
    sh: &Shared<'_>,
    header: &Header,
) -> Result<Received, MigrateError> {
    let sockets: Vec<TcpStream> = extras
        .iter_mut()
        .filter_map(|r| r.get_mut().tcp().and_then(|s| s.try_clone().ok()))
        .collect();
    std::thread::scope(|sc| {
        let (ptx, prx) = std::sync::mpsc::channel();
        let handles: Vec<_> = extras
            .iter_mut()
            .enumerate()
            .map(|(k, r)| {
                let ptx = ptx.clone();
                sc.spawn(move || {
                    let res = channel_loop(r, sh, header, k as u16 + 1, &ptx);
                    if res.is_err() {
                        // The source's sender on this channel fails at
                        // once instead of at its write deadline.
                        if let Some(s) = r.get_mut().tcp() {
                            net::shutdown(s);
                        }
                    }
                    res
                })
            })
            .collect();
        drop(ptx);
        let main_result = main_channel(rd, sh, header, &prx);
        if main_result.is_err() {
            // End the other channels' threads now rather than at their
            // timeouts.
            for s in &sockets {
                net::shutdown(s);
            }
        }
        let mut r = main_result;
        for h in handles {
            let c = h
                .join()
                .unwrap_or_else(|_| Err(MigrateError::Setup("a receiving thread panicked".into())));
            // The first error wins, except that a channel's own error
            // (a bad page, say) explains the ABORT the source then sent,
            // and the main channel's explains the cut channels.
            match (&r, c) {
                (Ok(_), Err(e)) => r = Err(e),
                (Err(MigrateError::Aborted { .. }), Err(e))
                    if !matches!(e, MigrateError::Io { .. } | MigrateError::Truncated { .. }) =>
                {
                    r = Err(e)
                }
                _ => {}
            }
        }
        r
    })
}

/// The main channel: its probe (answered with PROBED once every channel's
/// is in), then pages and control records until END or POSTCOPY.
fn main_channel<C: Conn>(
    rd: &mut WireReader<&mut C>,
    sh: &Shared<'_>,
    header: &Header,
    probes: &std::sync::mpsc::Receiver<Result<u64, MigrateError>>,
) -> Result<Received, MigrateError> {
    let page_count = header.mem_size / PAGE_SIZE as u64;
    let mut probe = take_probe(rd, header)?;
    for _ in 1..header.channels {
        probe += probes
            .recv()
            .map_err(|_| MigrateError::Setup("a channel's thread ended early".into()))??;
    }
    let mut w = WireWriter::replies(rd.get_mut());
    let mut e = Enc::default();
    e.u64(probe);
    w.control(tag::PROBED, &e.0)?;
    w.flush()?;
    let mut state = None;
    let mut postcopy_missing = None;
    loop {
        let at_byte = rd.pos;
        match rd.next_record()? {
            Record::Pages { .. } => sh.take_pages(rd, 0, at_byte)?,
            Record::Control {
                tag: t,
                body,
                at_byte,
            } => match t {
                tag::ROUND => {}
                tag::STATE => state = Some(GuestState::decode(&body, at_byte)?),
                tag::POSTCOPY if header.postcopy && state.is_some() => {
                    postcopy_missing = Some(postcopy::decode_missing(&body, at_byte, page_count)?);
                    break;
                }
                tag::END => {
                    check_end(&body, at_byte, rd.pages)?;
                    break;
                }
                tag::ABORT => {
                    return Err(MigrateError::Aborted {
                        reason: String::from_utf8_lossy(&body).into_owned(),
                    })
                }
                other => {
                    return Err(MigrateError::Malformed {
                        record: tag_name(other),
                        at_byte,
                        why: "not expected before the stream's END".into(),
                    })
                }
            },
            Record::Probe { at_byte, .. } => {
                return Err(MigrateError::Malformed {
                    record: "PROBE",
                    at_byte,
                    why: "a second link probe".into(),
                })
            }
        }
    }
    Ok(Received {
        probe_bytes: probe,
        state,
        postcopy_missing,
    })
}

/// Resumes the guest here after a complete pre-copy stream: per-slot
/// digests to the source (RESUMED), the byte comparison with verify-full,
/// then the guest runs for `run_after`. The counts are the main channel's
/// only (the caller adds the others').
fn resume_after_end<C: Conn>(
    rd: &mut WireReader<&mut C>,
    vm: &Arc<Vm>,
    sh: &Shared<'_>,
    state: &GuestState,
    cfg: &DestConfig,
) -> Result<DestOutcome, MigrateError> {
    let slot_digests = slot_digests(vm, sh);
    let wl = start_workload(vm, state)?;
    let resumed_at = Instant::now();
    let mut e = Enc::default();
    e.u32(slot_digests.len() as u32);
    for (id, d) in &slot_digests {
        e.u16(*id).u64(*d);
    }
    {
        let mut w = WireWriter::replies(rd.get_mut());
        w.control(tag::RESUMED, &e.0)?;
        w.flush()?;
    }
    let (page_records, bytes, zero_pages) = (rd.pages, rd.pos, rd.zero_pages);
    let mut verify_mismatches = None;
    if let Some(snapshot) = &sh.snapshot {
        let (bad, first) = compare_with_snapshot(rd, vm, snapshot)?;
        let mut e = Enc::default();
        e.u64(bad).u64(first);
        let mut w = WireWriter::replies(rd.get_mut());
        w.control(tag::VERIFIED, &e.0)?;
        w.flush()?;
        verify_mismatches = Some(bad);
    }
    let writes0: u64 = state.vcpus.iter().map(|v| v.writes).sum();
    if let Some(rest) = cfg.run_after.checked_sub(resumed_at.elapsed()) {
        std::thread::sleep(rest);
    }
    let writes1: u64 = wl
        .control()
        .live
        .iter()
        .map(|l| l.writes.load(Ordering::Relaxed))
        .sum();
    let secs = resumed_at.elapsed().as_secs_f64();
    wl.pause();
    let resumed_passes = wl.vcpu_states().iter().map(|s| s.pass).collect();
    drop(wl);
    Ok(DestOutcome {
        page_records,
        zero_pages,
        bytes,
        channels: 1,
        probe_bytes: 0,
        prefault: Duration::ZERO,
        resumed_at: Some(resumed_at),
        slot_digests,
        verify_mismatches,
        resumed_write_rate: writes1.saturating_sub(writes0) as f64 / secs.max(1e-9),
        resumed_passes,
        postcopy: None,
    })
}

/// Each slot's digest of the memory the guest resumes from.
fn slot_digests(vm: &Vm, sh: &Shared<'_>) -> Vec<(u16, u64)> {
    let hashes: Vec<u64> = sh
        .hashes
        .iter()
        .map(|h| h.load(Ordering::Relaxed))
        .collect();
    vm.slots()
        .iter()
        .map(|s| {
            let first = (s.mem_offset / PAGE_SIZE as u64) as usize;
            let n = (s.size / PAGE_SIZE as u64) as usize;
            (s.id, digest_of(&hashes[first..first + n]))
        })
        .collect()
}

/// Resume: the vCPUs continue from the transferred state, paced as on the
/// source.
fn start_workload(
    vm: &Arc<Vm>,
    state: &GuestState,
) -> Result<Workload<TreeMemslots>, MigrateError> {
    let wl_cfg = WorkloadConfig {
        bytes_per_vcpu: state.bytes_per_vcpu,
        write_percent: state.write_percent,
        pattern: if state.pattern == 1 {
            Pattern::Random
        } else {
            Pattern::Sequential
        },
        page_size: PAGE_SIZE as u64,
    };
    let wl = Workload::start_at(vm.clone(), wl_cfg, &state.vcpus)
        .map_err(|why| MigrateError::BadState { why })?;
    wl.control()
        .pace_pages_per_sec
        .store(state.pace_pages_per_sec, Ordering::Relaxed);
    wl.run_free();
    Ok(wl)
}

/// Refuses to resume from incomplete memory: every page must have
/// arrived, or (post-copy) be among the missing ones that come after the
/// resume.
fn check_complete(
    sh: &Shared<'_>,
    postcopy_missing: Option<&[u64]>,
    vm: &Vm,
) -> Result<(), MigrateError> {
    let page_count = sh.hashes.len() as u64;
    let received: Vec<u64> = sh
        .received
        .iter()
        .enumerate()
        .map(|(w, x)| {
            x.load(Ordering::Relaxed)
                | postcopy_missing.map_or(0, |m| m.get(w).copied().unwrap_or(0))
        })
        .collect();
    let missing: u64 = received
        .iter()
        .enumerate()
        .map(|(w, &m)| {
            let valid = (page_count - w as u64 * 64).min(64);
            let mask = if valid == 64 {
                u64::MAX
            } else {
                (1u64 << valid) - 1
            };
            u64::from((!m & mask).count_ones())
        })
        .sum();
    if missing > 0 {
        let first = (0..page_count)
            .find(|&i| received[(i / 64) as usize] & (1 << (i % 64)) == 0)
            .unwrap_or(0);
        return Err(MigrateError::Incomplete {
            missing_pages: missing,
            first_missing_gpa: gpa_of(vm, first * PAGE_SIZE as u64),
        });
    }
    Ok(())
}

/// Backs all of guest memory with RAM before the stream starts, as QEMU's
/// `-mem-prealloc` and Cloud Hypervisor's `prefault` do: the kernel's
/// page zeroing (and, in a VM, the host's first touch) then does not run
/// inside round 0. 64 MiB at a time with `MADV_POPULATE_WRITE` (touching
/// each page where the kernel lacks it), telling the source every half
/// second that the destination is alive.
fn populate<R: Read + Write>(vm: &Vm, rd: &mut WireReader<R>) -> Result<Duration, MigrateError> {
    let t0 = Instant::now();
    let mem = vm.memory();
    let (base, size) = (mem.host_addr() as usize, mem.size());
    let chunk = 64u64 << 20;
    let mut told = t0;
    let mut off = 0u64;
    while off < size {
        let len = chunk.min(size - off);
        // SAFETY: the range lies inside the VM's own live mapping; the
        // advice only faults its pages in (their contents stay zero).
        let r = unsafe {
            libc::madvise(
                (base + off as usize) as *mut libc::c_void,
                len as usize,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if r != 0 {
            // Older kernels: touch each page (fresh memory is zero, so is
            // what is written).
            let mut p = off;
            while p < off + len {
                mem.write_u64(p, 0);
                p += PAGE_SIZE as u64;
            }
        }
        off += len;
        if told.elapsed() >= Duration::from_millis(500) {
            told = Instant::now();
            let mut w = WireWriter::replies(rd.get_mut());
            w.control(tag::PROGRESS, &[])?;
            w.flush()?;
        }
    }
    Ok(t0.elapsed())
}

fn page_offset(vm: &Vm, gpa: u64, at_byte: u64) -> Result<u64, MigrateError> {
    match vm.locate(gpa) {
        Some((_, off))
            if gpa.is_multiple_of(PAGE_SIZE as u64)
                && off + PAGE_SIZE as u64 <= vm.memory().size() =>
        {
            Ok(off)
        }
        _ => Err(MigrateError::PageOutOfRange { gpa, at_byte }),
    }
}

/// END's counts must be what arrived: a stream that lost records is not
/// complete even when every page happened to arrive.
pub(crate) fn check_end(body: &[u8], at_byte: u64, pages_seen: u64) -> Result<(), MigrateError> {
    let mut d = Dec::new(body, "END", at_byte);
    let (pages, bytes) = (d.u64()?, d.u64()?);
    d.finish()?;
    if pages != pages_seen || bytes != at_byte {
        return Err(d.malformed(format!(
            "the source sent {pages} pages in {bytes} bytes, {pages_seen} pages in {at_byte} bytes arrived"
        )));
    }
    Ok(())
}

/// The verification pass: VERIFY, all of the source's memory as PAGES
/// records on the main channel, END; each page is compared byte for byte
/// with the memory the guest resumed from. Returns the number of differing
/// pages and the first one's address.
fn compare_with_snapshot<R: Read>(
    rd: &mut WireReader<R>,
    vm: &Vm,
    snapshot: &[AtomicU64],
) -> Result<(u64, u64), MigrateError> {
    match rd.next_record()? {
        Record::Control {
            tag: tag::VERIFY, ..
        } => {}
        Record::Control {
            tag: tag::ABORT,
            body,
            ..
        } => {
            return Err(MigrateError::Aborted {
                reason: String::from_utf8_lossy(&body).into_owned(),
            })
        }
        other => {
            return Err(MigrateError::Malformed {
                record: "VERIFY",
                at_byte: rd.pos,
                why: format!(
                    "expected the verification pass, got {}",
                    record_name(&other)
                ),
            })
        }
    }
    let page_count = snapshot.len() as u64 * 8 / PAGE_SIZE as u64;
    let mut seen = vec![false; page_count as usize];
    let (mut bad, mut first) = (0u64, 0u64);
    let mut buf = vec![0u8; PAGE_SIZE];
    loop {
        let at_byte = rd.pos;
        match rd.next_record()? {
            Record::Pages { .. } => {
                for k in 0..rd.entries().len() {
                    let e = rd.entries()[k];
                    let off = page_offset(vm, e.gpa, at_byte)?;
                    if e.zero {
                        buf.fill(0);
                    } else {
                        rd.read_page(&mut buf)?;
                        if page_hash(&buf, e.gpa) != e.hash {
                            return Err(MigrateError::PageChecksum {
                                gpa: e.gpa,
                                at_byte,
                            });
                        }
                    }
                    seen[(off / PAGE_SIZE as u64) as usize] = true;
                    let w0 = (off / 8) as usize;
                    let differs = buf.chunks_exact(8).enumerate().any(|(j, w)| {
                        snapshot[w0 + j].load(Ordering::Relaxed)
                            != u64::from_le_bytes(w.try_into().expect("8 bytes"))
                    });
                    if differs {
                        if bad == 0 {
                            first = e.gpa;
                        }
                        bad += 1;
                    }
                }
            }
            Record::Control {
                tag: tag::END,
                body,
                at_byte,
            } => {
                check_end(&body, at_byte, rd.pages)?;
                break;
            }
            other => {
                return Err(MigrateError::Malformed {
                    record: "verification pass",
                    at_byte,
                    why: format!("{} is not expected in it", record_name(&other)),
                })
            }
        }
    }
    if let Some(i) = seen.iter().position(|s| !s) {
        return Err(MigrateError::Incomplete {
            missing_pages: seen.iter().filter(|s| !**s).count() as u64,
            first_missing_gpa: gpa_of(vm, i as u64 * PAGE_SIZE as u64),
        });
    }
    Ok((bad, first))
}

fn gpa_of(vm: &Vm, offset: u64) -> u64 {
    vm.slots()
        .iter()
        .find(|s| offset >= s.mem_offset && offset - s.mem_offset < s.size)
        .map(|s| s.gpa + offset - s.mem_offset)
        .unwrap_or(offset)
}

/// The destination's VM: the source's geometry with the destination's
/// own MMU policy.
///
/// # Errors
/// [`MigrateError::Setup`].
pub fn build_vm(h: &Header, policy: MmuPolicy) -> Result<Vm, MigrateError> {
    let backing = Backing::parse(&h.backing).map_err(MigrateError::Setup)?;
    Vm::new(VmConfig {
        mem_size: h.mem_size,
        backing,
        slots: h.slots,
        gpa_base: h.gpa_base,
        // The destination does not log dirty pages.
        policy: MmuPolicy {
            dirty: DirtyMode::Bitmap,
            ..policy
        },
        ..VmConfig::default()
    })
    .map_err(|e| MigrateError::Setup(format!("destination guest: {e}")))
}
