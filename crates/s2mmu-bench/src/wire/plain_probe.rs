//! The honest link figure: plain TCP between the same endpoints with
//! nothing else in the path (what iperf3 measures): no TLS, no record
//! framing, no checksum, no guest. The migration's own figures are quoted
//! against it.
//!
//! The migration library carries none of it: a migration needs no
//! plain-TCP figure, and a run that wants one measures it here,
//! back to back with its migration ([`plain_link_in_process`],
//! [`plain_link_to`]).
//!
//! A [`PlainSink`] listens on its own port; [`plain_tcp_link`] opens
//! `channels` connections to it at once (iperf3's `-P`). On each it runs
//! two phases, each an 8-byte length, then that many bytes from one
//! buffer, then the sink's 8-byte count of what arrived: first an untimed
//! warm-up ([`WARMUP_BYTES`]), then, once every connection is warm, the
//! timed phase. The time covers the delivery, not only the send buffers.
//! Every length is bounded ([`MAX_PLAIN_PROBE`]), the sink serves at most
//! [`MAX_PLAIN_CHANNELS`] connections at once and [`PHASES`] phases each,
//! and every read and write has the I/O deadline.
//!
//! Why it reads what iperf3 reads (measured on the 2-core development
//! machine): with 1 MiB writes and reads it read 30-40 % below
//! iperf3 (one copy of 1 MiB on each side does not stay in a 512 KiB L2;
//! iperf3 writes and reads 128 KiB), and the first probe in a process read
//! about half of the next one (fresh buffers and socket memory); 128 KiB
//! and the warm-up fix both.

use s2mmu_migrate::sim::source::SimRun;
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::transport::{configure, NetConfig};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The most bytes one probe connection may announce.
pub const MAX_PLAIN_PROBE: u64 = 64 << 30;
/// Connections one probe may open (and the sink serves at once).
pub const MAX_PLAIN_CHANNELS: u16 = 64;
/// Bytes each connection sends, untimed, before the timed phase (at most
/// the timed phase's own bytes).
pub const WARMUP_BYTES: u64 = 32 << 20;
/// Phases a connection carries: the warm-up and the timed one.
pub const PHASES: usize = 2;
/// Bytes of each write and of the sink's reads: iperf3's default for TCP
/// (`-l 128K`), so both copies stay in a core's cache as iperf3's do.
const CHUNK: usize = 128 << 10;

/// A plain-TCP link figure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlainLink {
    /// Bytes delivered over all connections.
    pub bytes: u64,
    /// Connections at once.
    pub channels: u16,
    /// From the first write to the last count back.
    pub elapsed: Duration,
}

impl PlainLink {
    /// Bytes per second.
    pub fn bytes_per_s(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// The receiving end of the probe, on its own port: every connection's
/// bytes are read and dropped, and their count sent back.
pub struct PlainSink {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PlainSink {
    /// Listens at `bind` (e.g. `127.0.0.1:0`); each connection is served
    /// on a thread of its own with `io_timeout` on every read and write.
    ///
    /// # Errors
    /// [`MigrateError::Io`] when the port cannot be bound.
    pub fn start(bind: &str, io_timeout: Duration) -> Result<Self, MigrateError> {
        Self::start_bounded(bind, io_timeout, MAX_PLAIN_PROBE)
    }

    /// [`PlainSink::start`] taking at most `max_len` bytes a phase on a
    /// connection (a destination's limit on guest memory): a longer phase
    /// ends its connection before anything of it is read.
    ///
    /// # Errors
    /// [`MigrateError::Io`] when the port cannot be bound.
    pub fn start_bounded(
        bind: &str,
        io_timeout: Duration,
        max_len: u64,
    ) -> Result<Self, MigrateError> {
        let what = format!("the plain-TCP probe's sink on {bind}");
        let l = TcpListener::bind(bind).map_err(|e| MigrateError::io(what.clone(), &e))?;
        let addr = l
            .local_addr()
            .map_err(|e| MigrateError::io(what.clone(), &e))?;
        l.set_nonblocking(true)
            .map_err(|e| MigrateError::io(what, &e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let max_len = max_len.min(MAX_PLAIN_PROBE);
        let thread = std::thread::Builder::new()
            .name("plain-sink".into())
            .spawn(move || accept_loop(&l, &st, io_timeout, max_len))
            .map_err(|e| MigrateError::io("starting the plain-TCP sink", &e))?;
        Ok(PlainSink {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Where the destination at `dest` keeps its plain-TCP sink for a
/// two-process run: the same address, the next port (None at port 65535).
pub fn sink_addr_for(dest: SocketAddr) -> Option<SocketAddr> {
    let port = dest.port().checked_add(1)?;
    Some(SocketAddr::new(dest.ip(), port))
}

impl Drop for PlainSink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(l: &TcpListener, stop: &AtomicBool, io_timeout: Duration, max_len: u64) {
    let open = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::SeqCst) {
        match l.accept() {
            // A connection over the bound is closed at once: the sink
            // never holds more than a probe's threads.
            Ok((s, _)) if open.load(Ordering::SeqCst) >= usize::from(MAX_PLAIN_CHANNELS) => drop(s),
            Ok((s, _)) => {
                open.fetch_add(1, Ordering::SeqCst);
                let o = open.clone();
                let spawned = std::thread::Builder::new()
                    .name("plain-sink-conn".into())
                    .spawn(move || {
                        drop(sink_one(s, io_timeout, max_len));
                        o.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    open.fetch_sub(1, Ordering::SeqCst);
                }
            }
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// Serves one connection's phases: each a length and its bytes, answered
/// with their count; the connection ends after [`PHASES`] or when the
/// prober closes it.
fn sink_one(mut s: TcpStream, io_timeout: Duration, max_len: u64) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    configure(&s, io_timeout).map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut buf = vec![0u8; CHUNK];
    for _ in 0..PHASES {
        let mut len = [0u8; 8];
        match s.read_exact(&mut len) {
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            r => r?,
        }
        let len = u64::from_le_bytes(len);
        if len > max_len {
            return Err(std::io::Error::other("probe length over the bound"));
        }
        let mut got = 0u64;
        while got < len {
            let want = (len - got).min(CHUNK as u64) as usize;
            let n = s.read(&mut buf[..want])?;
            if n == 0 {
                break;
            }
            got += n as u64;
        }
        s.write_all(&got.to_le_bytes())?;
    }
    Ok(())
}

/// [`plain_tcp_link`] to the sink beside the destination `addr` (its
/// next port: [`sink_addr_for`]).
///
/// # Errors
/// `addr` has no TCP port to probe beside (a Unix socket), or the probe
/// failed ([`plain_tcp_link`]'s errors); the message names the sink.
pub fn plain_link_beside(
    addr: &str,
    channels: u16,
    total: u64,
    io_timeout: Duration,
) -> Result<PlainLink, String> {
    use std::net::ToSocketAddrs;
    let sink = addr.to_socket_addrs().ok().and_then(|mut a| a.next());
    match sink.and_then(sink_addr_for) {
        Some(sink) => plain_tcp_link(sink, channels, total, io_timeout)
            .map_err(|e| format!("plain TCP to the destination's sink {sink}: {e}")),
        None => Err(format!("plain TCP: {addr} has no TCP port to probe beside")),
    }
}

/// Sends `total` bytes over `channels` plain TCP connections to `addr` at
/// once and waits for every count back; before the clock starts, each
/// connection sends [`WARMUP_BYTES`] (at most its own share) and has them
/// counted.
///
/// # Errors
/// [`MigrateError::Setup`] for a size or count over the bounds,
/// [`MigrateError::Io`] / [`MigrateError::Timeout`] from the sockets, and
/// [`MigrateError::Malformed`] when the sink counted other than was sent.
pub fn plain_tcp_link(
    addr: SocketAddr,
    channels: u16,
    total: u64,
    io_timeout: Duration,
) -> Result<PlainLink, MigrateError> {
    if channels == 0 || channels > MAX_PLAIN_CHANNELS {
        return Err(MigrateError::Setup(format!(
            "plain-TCP probe over {channels} connections (1 to {MAX_PLAIN_CHANNELS})"
        )));
    }
    let n = u64::from(channels);
    if total < n || total / n > MAX_PLAIN_PROBE {
        return Err(MigrateError::Setup(format!(
            "plain-TCP probe of {total} bytes over {channels} connections (at least one byte and at most {MAX_PLAIN_PROBE} each)"
        )));
    }
    let what = format!("the plain-TCP probe to {addr}");
    let mut conns = Vec::new();
    for _ in 0..channels {
        let s = TcpStream::connect_timeout(&addr, io_timeout)
            .map_err(|e| MigrateError::io(what.clone(), &e))?;
        configure(&s, io_timeout)?;
        conns.push(s);
    }
    let (results, elapsed) = send_all(conns, total);
    let mut bytes = 0;
    for r in results {
        bytes += r.map_err(|e| MigrateError::io(what.clone(), &e))?;
    }
    if bytes != total {
        return Err(MigrateError::Malformed {
            record: "plain-TCP probe count",
            at_byte: 0,
            why: format!("the sink counted {bytes} bytes of {total}"),
        });
    }
    Ok(PlainLink {
        bytes,
        channels,
        elapsed,
    })
}

/// Runs every connection's phases on a thread of its own; the clock
/// starts once every warm-up is done. Each result is the timed phase's
/// count (or why the connection failed).
fn send_all(conns: Vec<TcpStream>, total: u64) -> (Vec<std::io::Result<u64>>, Duration) {
    let n = conns.len() as u64;
    let per = total / n;
    let filler: Vec<u8> = (0..CHUNK as u32).map(|i| (i * 7 + 1) as u8).collect();
    // Every sender and this thread meet once the warm-ups are over, even
    // a sender whose warm-up failed, so the wait always ends.
    let warm = Barrier::new(conns.len() + 1);
    std::thread::scope(|sc| {
        let hs: Vec<_> = conns
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                let len = if i == 0 { total - per * (n - 1) } else { per };
                let (filler, warm) = (&filler, &warm);
                sc.spawn(move || send_one(s, len, filler, warm))
            })
            .collect();
        warm.wait();
        let t0 = Instant::now();
        let results: Vec<_> = hs
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("a probe thread panicked")))
            })
            .collect();
        (results, t0.elapsed())
    })
}

/// The warm-up phase, the meeting, then the timed phase of `len` bytes;
/// returns the sink's count of the timed phase.
fn send_one(mut s: TcpStream, len: u64, filler: &[u8], warm: &Barrier) -> std::io::Result<u64> {
    let warmup = WARMUP_BYTES.min(len);
    let warmed = send_phase(&mut s, warmup, filler);
    warm.wait();
    let got = warmed?;
    if got != warmup {
        return Err(std::io::Error::other(format!(
            "the sink counted {got} warm-up bytes of {warmup}"
        )));
    }
    send_phase(&mut s, len, filler)
}

/// Writes the length and `len` bytes, returns the sink's count.
fn send_phase(s: &mut TcpStream, len: u64, filler: &[u8]) -> std::io::Result<u64> {
    s.write_all(&len.to_le_bytes())?;
    let mut left = len;
    while left > 0 {
        let k = left.min(filler.len() as u64) as usize;
        s.write_all(&filler[..k])?;
        left -= k as u64;
    }
    let mut got = [0u8; 8];
    s.read_exact(&mut got)?;
    Ok(u64::from_le_bytes(got))
}

const MIB: f64 = (1u64 << 20) as f64;

/// Says `l` on `run`'s progress, `to` naming where it went.
fn say(run: &SimRun, l: &PlainLink, to: &str) {
    let p = &run.session.progress;
    if p.is_on() {
        p.line(&format!(
            "{}plain TCP: {:.1} MiB in {:.1} ms at {:.1} MiB/s over {} connection(s){to} (no TLS, no framing, no checksum: what iperf3 measures)",
            run.session.label,
            l.bytes as f64 / MIB,
            l.elapsed.as_secs_f64() * 1e3,
            l.bytes_per_s() / MIB,
            l.channels
        ));
    }
}

/// An in-process run's honest link figure, just before the migration:
/// plain TCP over loopback to a sink of its own with the run's connection
/// count and guest memory's bytes (the stack's own link probe sends as
/// many), said on the run's progress.
///
/// # Errors
/// As [`plain_tcp_link`], and binding the sink.
pub fn plain_link_in_process(run: &SimRun, net: &NetConfig) -> Result<PlainLink, MigrateError> {
    let sink = PlainSink::start("127.0.0.1:0", net.io_timeout)?;
    let (channels, mem) = (run.session.channels, run.guest.mem_size);
    let l = plain_tcp_link(sink.addr(), channels, mem, net.io_timeout)?;
    say(run, &l, "");
    Ok(l)
}

/// A two-process source's honest link figure, before the migration: plain
/// TCP to the destination's sink at `addr`'s next port ([`sink_addr_for`])
/// with the run's connection count and guest memory's bytes, said on the
/// run's progress.
///
/// # Errors
/// It cannot be measured (a Unix socket, no sink there), in words.
pub fn plain_link_to(run: &SimRun, addr: &str, net: &NetConfig) -> Result<PlainLink, String> {
    let (channels, mem) = (run.session.channels, run.guest.mem_size);
    let l = plain_link_beside(addr, channels, mem, net.io_timeout)?;
    say(run, &l, " to the destination's sink");
    Ok(l)
}

/// The plain-TCP sink beside a destination listening on `local` (its
/// next port: [`sink_addr_for`]) for a source's honest link figure,
/// taking at most `max_len` bytes a phase on a connection (a
/// destination's limit on guest memory); with the address it listens on.
///
/// # Errors
/// `local` is no TCP address (a Unix socket), or the port cannot be
/// bound, in words.
pub fn plain_sink_beside(
    local: &str,
    max_len: u64,
    net: &NetConfig,
) -> Result<(SocketAddr, PlainSink), String> {
    let at = local
        .parse::<SocketAddr>()
        .ok()
        .and_then(sink_addr_for)
        .ok_or_else(|| format!("no plain-TCP sink beside {local}"))?;
    PlainSink::start_bounded(&at.to_string(), net.io_timeout, max_len)
        .map(|s| (at, s))
        .map_err(|e| format!("no plain-TCP sink on {at} ({e})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bare TCP listener in the sink's place: for each of `conns`
    /// connections, both phases' bodies as they arrived, each answered
    /// with its length, or with `count(phase, len)` where given.
    fn raw_sink(
        conns: usize,
        count: fn(usize, u64) -> u64,
    ) -> (SocketAddr, std::thread::JoinHandle<Vec<Vec<u8>>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        // Each connection on a thread of its own: a prober's timed phase
        // waits for every connection's warm-up.
        let h = std::thread::spawn(move || {
            let hs: Vec<_> = (0..conns)
                .map(|_| {
                    let (mut s, _) = l.accept().unwrap();
                    std::thread::spawn(move || {
                        let mut seen = Vec::new();
                        for phase in 0..PHASES {
                            let mut len = [0u8; 8];
                            if s.read_exact(&mut len).is_err() {
                                break;
                            }
                            let len = u64::from_le_bytes(len);
                            let mut body = vec![0u8; len as usize];
                            s.read_exact(&mut body).unwrap();
                            s.write_all(&count(phase, len).to_le_bytes()).unwrap();
                            seen.push(body);
                        }
                        seen
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        (addr, h)
    }

    #[test]
    fn the_probe_is_plain_tcp_bytes_and_nothing_else() {
        // A bare TCP listener in the sink's place sees, on each
        // connection, exactly an 8-byte length and then the filler, twice
        // (the warm-up, then the timed bytes): no TLS record, no stream
        // framing, no checksum.
        let (addr, raw) = raw_sink(2, |_, len| len);
        let link = plain_tcp_link(addr, 2, 3 << 20, Duration::from_secs(10)).unwrap();
        let seen = raw.join().unwrap();
        assert_eq!(link.bytes, 3 << 20);
        let lens: Vec<usize> = seen.iter().map(Vec::len).collect();
        // Channel 0 carries the odd byte; each warm-up is its phase's size
        // (under WARMUP_BYTES).
        assert_eq!(lens, [(3 << 19), (3 << 19), (3 << 19), (3 << 19)]);
        for body in seen {
            for (i, &b) in body.iter().enumerate() {
                assert_eq!(b, ((i % CHUNK) as u32 * 7 + 1) as u8, "byte {i}");
            }
        }
        // Over WARMUP_BYTES, the warm-up stops there and the timed phase
        // carries all of the figure's bytes.
        let (addr, raw) = raw_sink(1, |_, len| len);
        let link = plain_tcp_link(addr, 1, WARMUP_BYTES + 5, Duration::from_secs(10)).unwrap();
        let lens: Vec<u64> = raw.join().unwrap().iter().map(|b| b.len() as u64).collect();
        assert_eq!(lens, [WARMUP_BYTES, WARMUP_BYTES + 5]);
        assert_eq!(link.bytes, WARMUP_BYTES + 5);
    }

    #[test]
    fn the_sink_counts_what_arrived() {
        let sink = PlainSink::start("127.0.0.1:0", Duration::from_secs(10)).unwrap();
        for ch in [1, 4] {
            let l =
                plain_tcp_link(sink.addr(), ch, (8 << 20) + 3, Duration::from_secs(10)).unwrap();
            assert_eq!((l.bytes, l.channels), ((8 << 20) + 3, ch));
            assert!(l.bytes_per_s() > 0.0);
        }
    }

    #[test]
    fn a_sink_that_counts_short_is_an_error_and_bounds_hold() {
        // Short in the timed phase: the figure's count is wrong.
        let (addr, short) = raw_sink(1, |phase, len| if phase == 1 { len - 1 } else { len });
        let r = plain_tcp_link(addr, 1, 4096, Duration::from_secs(5));
        short.join().unwrap();
        assert!(matches!(r, Err(MigrateError::Malformed { .. })), "{r:?}");
        // Short in the warm-up: the connection fails, nothing is timed.
        let (addr, short) = raw_sink(1, |phase, len| if phase == 0 { len - 1 } else { len });
        let r = plain_tcp_link(addr, 1, 4096, Duration::from_secs(5));
        short.join().unwrap();
        assert!(matches!(r, Err(MigrateError::Io { .. })), "{r:?}");
        let t = Duration::from_secs(1);
        assert!(plain_tcp_link(addr, 0, 4096, t).is_err());
        assert!(plain_tcp_link(addr, 65, 1 << 20, t).is_err());
        assert!(plain_tcp_link(addr, 1, MAX_PLAIN_PROBE + 1, t).is_err());
    }

    #[test]
    fn a_bounded_sink_refuses_a_longer_phase_and_the_sink_port_is_the_next() {
        let sink =
            PlainSink::start_bounded("127.0.0.1:0", Duration::from_secs(10), 1 << 20).unwrap();
        let t = Duration::from_secs(10);
        assert_eq!(
            plain_tcp_link(sink.addr(), 1, 1 << 20, t).unwrap().bytes,
            1 << 20
        );
        let r = plain_tcp_link(sink.addr(), 1, (1 << 20) + 1, t);
        assert!(matches!(r, Err(MigrateError::Io { .. })), "{r:?}");
        let a: SocketAddr = "10.1.2.3:4000".parse().unwrap();
        assert_eq!(sink_addr_for(a), Some("10.1.2.3:4001".parse().unwrap()));
        assert_eq!(sink_addr_for("[::1]:65535".parse().unwrap()), None);
    }

    #[test]
    fn the_sink_serves_at_most_its_bound_of_connections_at_once() {
        let sink = PlainSink::start("127.0.0.1:0", Duration::from_secs(20)).unwrap();
        // MAX_PLAIN_CHANNELS idle connections hold every slot.
        let held: Vec<TcpStream> = (0..MAX_PLAIN_CHANNELS)
            .map(|_| TcpStream::connect(sink.addr()).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        // One more is closed at once: its read ends (EOF or reset) instead
        // of waiting for the sink's answer.
        let mut extra = TcpStream::connect(sink.addr()).unwrap();
        extra
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut b = [0u8; 1];
        match extra.read(&mut b) {
            Ok(0) => {}
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
            Ok(n) => panic!("the sink sent {n} bytes to a connection over its bound"),
        }
        // Once those close, a probe runs again.
        drop(held);
        std::thread::sleep(Duration::from_millis(300));
        let l = plain_tcp_link(sink.addr(), 2, 1 << 20, Duration::from_secs(10)).unwrap();
        assert_eq!(l.bytes, 1 << 20);
    }

    #[test]
    fn a_run_s_probe_sends_its_guest_memory_over_its_channels() {
        let net = NetConfig {
            io_timeout: Duration::from_secs(10),
            security: s2mmu_migrate::transport::Security::Plain,
        };
        let run = SimRun::default().with(|g, s| {
            g.mem_size = (4 << 20) + 4096;
            s.channels = 3;
            s.progress = s2mmu_migrate::session::Progress::off();
        });
        let l = plain_link_in_process(&run, &net).unwrap();
        assert_eq!((l.bytes, l.channels), ((4 << 20) + 4096, 3));
        // Beside a destination: its next port (free a moment ago).
        let free = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let local = format!("127.0.0.1:{}", free.port() - 1);
        let (at, _sink) = plain_sink_beside(&local, 1 << 30, &net).unwrap();
        assert_eq!(at, free);
        let l = plain_link_to(&run, &local, &net).unwrap();
        assert_eq!((l.bytes, l.channels), ((4 << 20) + 4096, 3));
        let e = plain_link_to(&run, "unix:/tmp/nowhere", &net).unwrap_err();
        assert!(e.contains("no TCP port"), "{e}");
        assert!(plain_sink_beside("unix:/tmp/nowhere", 1, &net).is_err());
    }
}
