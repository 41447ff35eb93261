//! The honest link figure: plain TCP between the same endpoints with
//! nothing else in the path (what iperf3 measures): no TLS, no record
//! framing, no checksum, no guest. The migration's own figures are quoted
//! against it.
//!
//! A [`PlainSink`] listens on its own port; [`plain_tcp_link`] opens
//! `channels` connections to it at once (iperf3's `-P`), writes on each an
//! 8-byte length and then that many bytes from one buffer, and waits for
//! each connection's 8-byte count of what arrived: the time covers the
//! delivery, not only the send buffers. Every length is bounded
//! ([`MAX_PLAIN_PROBE`]) and every read and write has the I/O deadline.

use super::tcp::configure;
use crate::stream_error::MigrateError;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The most bytes one probe connection may announce.
pub const MAX_PLAIN_PROBE: u64 = 64 << 30;
/// Connections one probe may open.
pub const MAX_PLAIN_CHANNELS: u16 = 64;
/// Bytes of each write (and of the sink's reads): as large as the
/// migration's own largest writes, so the figure is the socket's.
const CHUNK: usize = 1 << 20;

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
        let what = format!("the plain-TCP probe's sink on {bind}");
        let l = TcpListener::bind(bind).map_err(|e| MigrateError::io(what.clone(), &e))?;
        let addr = l
            .local_addr()
            .map_err(|e| MigrateError::io(what.clone(), &e))?;
        l.set_nonblocking(true)
            .map_err(|e| MigrateError::io(what, &e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let thread = std::thread::Builder::new()
            .name("plain-sink".into())
            .spawn(move || accept_loop(&l, &st, io_timeout))
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

impl Drop for PlainSink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(l: &TcpListener, stop: &AtomicBool, io_timeout: Duration) {
    while !stop.load(Ordering::SeqCst) {
        match l.accept() {
            Ok((s, _)) => {
                let _ = std::thread::Builder::new()
                    .name("plain-sink-conn".into())
                    .spawn(move || drop(sink_one(s, io_timeout)));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// Reads one connection's length and bytes, answers their count.
fn sink_one(mut s: TcpStream, io_timeout: Duration) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    configure(&s, io_timeout).map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut len = [0u8; 8];
    s.read_exact(&mut len)?;
    let len = u64::from_le_bytes(len);
    if len > MAX_PLAIN_PROBE {
        return Err(std::io::Error::other("probe length over the bound"));
    }
    let mut buf = vec![0u8; CHUNK];
    let mut got = 0u64;
    while got < len {
        let want = (len - got).min(CHUNK as u64) as usize;
        let n = s.read(&mut buf[..want])?;
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    s.write_all(&got.to_le_bytes())
}

/// Sends `total` bytes over `channels` plain TCP connections to `addr` at
/// once and waits for every count back.
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
    let filler: Vec<u8> = (0..CHUNK as u32).map(|i| (i * 7 + 1) as u8).collect();
    let per = total / n;
    let t0 = Instant::now();
    let results: Vec<std::io::Result<u64>> = std::thread::scope(|sc| {
        let hs: Vec<_> = conns
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                let len = if i == 0 { total - per * (n - 1) } else { per };
                let filler = &filler;
                sc.spawn(move || send_one(s, len, filler))
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("a probe thread panicked")))
            })
            .collect()
    });
    let elapsed = t0.elapsed();
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

/// Writes the length and `len` bytes, returns the sink's count.
fn send_one(mut s: TcpStream, len: u64, filler: &[u8]) -> std::io::Result<u64> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_is_plain_tcp_bytes_and_nothing_else() {
        // A bare TCP listener in the sink's place sees, on each
        // connection, exactly an 8-byte length and then the filler: no
        // TLS record, no stream framing, no checksum.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let raw = std::thread::spawn(move || {
            let mut seen = Vec::new();
            for _ in 0..2 {
                let (mut s, _) = l.accept().unwrap();
                let mut len = [0u8; 8];
                s.read_exact(&mut len).unwrap();
                let len = u64::from_le_bytes(len);
                let mut body = vec![0u8; len as usize];
                s.read_exact(&mut body).unwrap();
                s.write_all(&len.to_le_bytes()).unwrap();
                seen.push(body);
            }
            seen
        });
        let link = plain_tcp_link(addr, 2, 3 << 20, Duration::from_secs(10)).unwrap();
        let seen = raw.join().unwrap();
        assert_eq!(link.bytes, 3 << 20);
        assert_eq!(seen.iter().map(Vec::len).sum::<usize>(), 3 << 20);
        for body in seen {
            for (i, &b) in body.iter().enumerate() {
                assert_eq!(b, ((i % CHUNK) as u32 * 7 + 1) as u8, "byte {i}");
            }
        }
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
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let short = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut b = vec![0u8; 8 + 4096];
            s.read_exact(&mut b).unwrap();
            s.write_all(&4095u64.to_le_bytes()).unwrap();
        });
        let r = plain_tcp_link(addr, 1, 4096, Duration::from_secs(5));
        short.join().unwrap();
        assert!(matches!(r, Err(MigrateError::Malformed { .. })), "{r:?}");
        let t = Duration::from_secs(1);
        assert!(plain_tcp_link(addr, 0, 4096, t).is_err());
        assert!(plain_tcp_link(addr, 65, 1 << 20, t).is_err());
        assert!(plain_tcp_link(addr, 1, MAX_PLAIN_PROBE + 1, t).is_err());
    }
}
