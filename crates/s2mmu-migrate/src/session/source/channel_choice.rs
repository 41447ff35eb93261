//! `SourceConfig::auto_channels`: the channel count chosen by measuring, on this
//! host, the real sender pipeline over each candidate count.
//!
//! A probe of the transfer alone ranks the counts wrongly: round 0 also
//! reads guest memory, checks for zero pages and hashes on the same
//! cores, so a count that moves filler fastest need not move pages
//! fastest. Each count's probe here is round 0's own code (the sender's
//! threads reading the running guest's memory, batching, hashing, sealing)
//! into as many loopback connections secured as the run is (ephemeral TLS
//! when the run uses TLS or a key), whose receiving threads open the
//! records and check every page's hash as the destination does (into a
//! scratch buffer, not guest memory). Each probe is bounded in time and
//! bytes ([`AutoChannels`]); the fastest count wins, and a larger count
//! must beat a smaller one by [`AUTO_MARGIN_PCT`] to be chosen.
//!
//! What it measures is this host's CPU, not a remote link: between two
//! hosts the destination's cores are not the source's, so the choice is
//! the source's pipeline's best count.

use super::auto_channels::AutoChannels;
use super::config::{Harvest, SourceConfig};
use super::harvest::Harvester;
use super::sender::{Chan, Sender};
use crate::stream_error::MigrateError;
use crate::transport::{self, NetConfig, Security};
use crate::vm::SessionVm;
use crate::wire::{record_name, tag, Record, WireReader, WireWriter, MAX_BATCH, PAGE_SIZE};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A larger count is chosen over a smaller one only when its probe moved
/// this many percent more pages a second (fewer threads and connections
/// for the same speed leave the cores to the guest).
pub const AUTO_MARGIN_PCT: u32 = 5;

/// One count's probe.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChannelProbe {
    /// Channels (connections, sending threads, receiving threads).
    pub channels: u16,
    /// Pages sent and checked on the receiving side.
    pub pages: u64,
    /// From the first page read to the last one checked.
    pub elapsed: Duration,
}

impl ChannelProbe {
    /// Pages a second.
    pub fn pages_per_s(&self) -> f64 {
        self.pages as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// What the channel-count probe measured and chose.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChannelChoice {
    /// The count the migration ran with.
    pub chosen: u16,
    /// Every candidate's probe, in the order tried.
    pub probes: Vec<ChannelProbe>,
}

/// Probes every candidate count and chooses one.
///
/// # Errors
/// [`MigrateError::Setup`] for bad settings, or a probe's own error
/// (loopback connections, the handshake, a page's hash).
pub(super) fn choose<V: SessionVm>(
    vm: &Arc<V>,
    cfg: &SourceConfig,
    auto: &AutoChannels,
    vcpus: usize,
) -> Result<ChannelChoice, MigrateError> {
    auto.validate()?;
    let net = NetConfig {
        io_timeout: Duration::from_secs(5),
        security: match auto.tls {
            true => transport::ephemeral_tls()?,
            false => Security::Plain,
        },
    };
    let mem: u64 = vm.slots().iter().map(|s| s.size).sum();
    let max_pages = (auto.max_bytes.min(mem) / PAGE_SIZE as u64).max(1);
    let mut probes = Vec::with_capacity(auto.candidates.len());
    for &n in &auto.candidates {
        probes.push(probe_count(
            vm,
            cfg,
            &net,
            n,
            vcpus,
            max_pages,
            auto.per_count,
        )?);
    }
    let mut order: Vec<&ChannelProbe> = probes.iter().collect();
    order.sort_by_key(|p| p.channels);
    let mut best = order[0];
    for p in &order[1..] {
        if p.pages_per_s() > best.pages_per_s() * (1.0 + f64::from(AUTO_MARGIN_PCT) / 100.0) {
            best = p;
        }
    }
    Ok(ChannelChoice {
        chosen: best.channels,
        probes,
    })
}

/// Round 0's first pages over `n` loopback connections, each received and
/// checked on a thread of its own.
fn probe_count<V: SessionVm>(
    vm: &Arc<V>,
    cfg: &SourceConfig,
    net: &NetConfig,
    n: u16,
    vcpus: usize,
    max_pages: u64,
    per_count: Duration,
) -> Result<ChannelProbe, MigrateError> {
    let io = |what: &str| {
        let what = format!("auto_channels: {what}");
        move |e: std::io::Error| MigrateError::io(what, &e)
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io("a loopback port"))?;
    let addr = listener
        .local_addr()
        .map_err(io("a loopback port"))?
        .to_string();
    std::thread::scope(|sc| {
        let mut receivers = Vec::with_capacity(usize::from(n));
        let mut chans = Vec::with_capacity(usize::from(n));
        for _ in 0..n {
            // The connection waits in the backlog: accepted at once, then
            // both handshakes run at the same time, each within the I/O
            // timeout (a failed side ends the other's).
            let c = transport::connect_tcp(&addr, net)?;
            let (s, _) = listener.accept().map_err(io("accepting"))?;
            receivers.push(sc.spawn(move || receive(s, net)));
            let c = transport::client(c, net)?;
            chans.push(Chan::new(WireWriter::replies(c)));
        }
        // Logging is not on yet: there is nothing to reap while the probe
        // sends, whatever the migration's harvest.
        let harvester = Harvester::new(Harvest::Bitmap, cfg.clear_chunk, vcpus);
        let mut sender = Sender::new(vm, chans, cfg, harvester);
        let t = Instant::now();
        let mut sent = sender.send_first(max_pages, t + per_count);
        for c in &mut sender.chans {
            sent = sent.and_then(|()| c.wire.end());
        }
        let pages = sender.counts().0;
        // A failed sender drops its connections: every receiver then ends.
        drop(sender);
        let mut got = 0u64;
        for r in receivers {
            let r = r.join().unwrap_or_else(|_| {
                Err(MigrateError::Setup(
                    "a probe's receiving thread panicked".into(),
                ))
            });
            got += sent.as_ref().map_err(Clone::clone).and(r)?;
        }
        sent?;
        if got != pages {
            return Err(MigrateError::Setup(format!(
                "auto_channels: {got} pages received of {pages} sent over {n} channel(s)"
            )));
        }
        Ok(ChannelProbe {
            channels: n,
            pages,
            elapsed: t.elapsed(),
        })
    })
}

/// The destination's side of one probe connection: records opened and
/// every page's hash checked (into a scratch batch), until END; the pages.
fn receive(s: std::net::TcpStream, net: &NetConfig) -> Result<u64, MigrateError> {
    let conn = transport::server(s, net)?;
    let mut rd = WireReader::replies(conn);
    let mut scratch = vec![0u8; MAX_BATCH * PAGE_SIZE];
    loop {
        let at_byte = rd.pos;
        match rd.next_record()? {
            Record::Pages { .. } => {
                // Read and checked as the destination does.
                let data = rd.entries().iter().filter(|e| !e.zero).count();
                let mut pages: Vec<&mut [u8]> =
                    scratch.chunks_exact_mut(PAGE_SIZE).take(data).collect();
                rd.read_checked_pages(&mut pages, at_byte, &mut ())?;
            }
            Record::Control { tag: tag::END, .. } => return Ok(rd.pages),
            other => {
                return Err(MigrateError::Malformed {
                    record: "probe",
                    at_byte,
                    why: format!(
                        "auto_channels' probe carries pages and END, got {}",
                        record_name(&other)
                    ),
                })
            }
        }
    }
}
