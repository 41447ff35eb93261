//! Connections of a migration: TCP with a deadline on every read and write
//! and TCP keepalive, optionally inside TLS (rustls), optionally with a
//! pre-shared key.
//!
//! Three ways to secure a connection:
//! - [`Security::Tls`]: mutual TLS 1.3 with certificates from files (or an
//!   ephemeral CA made in memory for the in-process migration): each side
//!   presents its certificate and checks the other's against the CA.
//! - [`Security::Psk`]: rustls has no external-PSK support, so TLS runs
//!   with an ephemeral self-signed certificate (encryption and integrity,
//!   not identity) and both sides then prove knowledge of the key:
//!   HMAC-SHA256 over fresh 32-byte nonces from both sides and the TLS
//!   exporter value of this session (RFC 5705/8446 keying material), each
//!   side with its own label. A peer without the key cannot answer; a
//!   relay between two TLS sessions cannot forward the answers, because
//!   the exporter differs per session; fresh nonces stop replays. The
//!   destination checks the source's answer before it answers itself or
//!   reads anything else, and the source checks the destination's before it
//!   sends anything of the guest.
//! - [`Security::Plain`]: bare TCP, for a trusted network only (said
//!   loudly by the command).

use super::error::MigrateError;
use ring::hmac;
use rustls::{ClientConfig, ClientConnection, ServerConfig, ServerConnection, StreamOwned};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod admit;
mod psk;
mod tls;

pub use admit::{Admission, Admitted, Opener, Refused, MAX_OPENING, MAX_PREAUTH};
pub use psk::{psk, psk_from_file};
use psk::{psk_client, psk_server};
pub use tls::{ephemeral_tls, make_pki, tls_from_files, Pki};
use tls::{tls_client, tls_server};

/// A connection carrying a migration stream.
pub trait Conn: Read + Write + Send {
    /// The TCP socket underneath, to shut it down from another thread.
    fn tcp(&self) -> Option<&TcpStream> {
        None
    }
}

/// A boxed connection.
pub type BoxConn = Box<dyn Conn>;

impl Conn for BoxConn {
    fn tcp(&self) -> Option<&TcpStream> {
        (**self).tcp()
    }
}

impl Conn for TcpStream {
    fn tcp(&self) -> Option<&TcpStream> {
        Some(self)
    }
}

/// A socket read in large chunks: rustls asks for 4 KiB at a time, which
/// would be a system call per 4 KiB of a bulk stream. Writes go straight
/// through. While a handshake runs, every read and write is bounded by
/// the handshake's overall deadline (not only each by the I/O timeout),
/// so a peer that drips its handshake a byte at a time is cut off. After
/// the handshake, writes keep a minimum rate ([`WritePace`]): a peer that
/// reads a byte now and then, each within the I/O timeout, cannot hold the
/// sender for ever.
pub struct SockBuf {
    sock: TcpStream,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    deadline: Option<Instant>,
    pace: WritePace,
}

/// The slowest a peer may take what this side writes, in bytes per second,
/// as the reader's [`MIN_RATE`](super::wire::MIN_RATE) for what it
/// receives: a real peer takes hundreds of MiB/s.
pub const MIN_WRITE_RATE: u64 = 256 << 10;

/// Bytes after which the writes' time account starts again, so bytes that
/// went out fast early give no credit for a later drip: within each window
/// the time spent blocked in writes may not exceed the grace (the I/O
/// timeout) plus the window's bytes at [`MIN_WRITE_RATE`].
pub const WRITE_WINDOW: u64 = 4 << 20;

/// The time this side spent blocked writing, against the bytes written.
#[derive(Clone, Copy, Debug)]
pub struct WritePace {
    grace: Duration,
    waited: Duration,
    bytes: u64,
}

impl WritePace {
    /// An account with `grace` (the I/O timeout).
    pub fn new(grace: Duration) -> Self {
        WritePace {
            grace,
            waited: Duration::ZERO,
            bytes: 0,
        }
    }

    /// Counts one write of `n` bytes that blocked for `took`.
    ///
    /// # Errors
    /// `TimedOut` once the window's time exceeds its allowance.
    pub fn record(&mut self, n: usize, took: Duration) -> std::io::Result<()> {
        self.waited += took;
        self.bytes += n as u64;
        let allowed =
            self.grace + Duration::from_secs_f64(self.bytes as f64 / MIN_WRITE_RATE as f64);
        if self.waited > allowed {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the peer took {} bytes in {:?}, slower than {} KiB/s",
                    self.bytes,
                    self.waited,
                    MIN_WRITE_RATE >> 10
                ),
            ));
        }
        if self.bytes >= WRITE_WINDOW {
            *self = WritePace::new(self.grace);
        }
        Ok(())
    }
}

impl SockBuf {
    fn new(sock: TcpStream, deadline: Option<Instant>) -> Self {
        SockBuf {
            sock,
            buf: vec![0u8; 256 << 10].into_boxed_slice(),
            start: 0,
            end: 0,
            deadline,
            pace: WritePace::new(DEFAULT_WRITE_GRACE),
        }
    }

    /// Before a read or write: the time left until the deadline becomes
    /// the socket's timeout; none left is `TimedOut`.
    fn arm(&self) -> std::io::Result<()> {
        let Some(d) = self.deadline else {
            return Ok(());
        };
        let left = d.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the handshake's overall deadline passed",
            ));
        }
        self.sock.set_read_timeout(Some(left))?;
        self.sock.set_write_timeout(Some(left))
    }

    /// Ends the handshake's deadline: the I/O timeout bounds each read and
    /// write again.
    fn end_handshake(&mut self, io_timeout: Duration) -> Result<(), MigrateError> {
        self.deadline = None;
        self.pace = WritePace::new(io_timeout);
        let io = |e: std::io::Error| MigrateError::io("configuring the connection", &e);
        self.sock.set_read_timeout(Some(io_timeout)).map_err(io)?;
        self.sock.set_write_timeout(Some(io_timeout)).map_err(io)
    }
}

impl Read for SockBuf {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.start == self.end {
            self.arm()?;
            if out.len() >= self.buf.len() {
                return self.sock.read(out);
            }
            let n = self.sock.read(&mut self.buf)?;
            self.start = 0;
            self.end = n;
        }
        let n = out.len().min(self.end - self.start);
        out[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        Ok(n)
    }
}

impl Write for SockBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.arm()?;
        let t = Instant::now();
        let n = self.sock.write(b)?;
        self.pace.record(n, t.elapsed())?;
        Ok(n)
    }
    fn write_vectored(&mut self, b: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        self.arm()?;
        let t = Instant::now();
        let n = self.sock.write_vectored(b)?;
        self.pace.record(n, t.elapsed())?;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.sock.flush()
    }
}

/// The grace of a connection's writes before its handshake ended (the
/// handshake's own deadline bounds them then).
const DEFAULT_WRITE_GRACE: Duration = Duration::from_secs(5);

impl Conn for SockBuf {
    fn tcp(&self) -> Option<&TcpStream> {
        Some(&self.sock)
    }
}

/// A bare TCP connection with the writes' minimum rate.
fn plain(s: TcpStream, io_timeout: Duration) -> Result<BoxConn, MigrateError> {
    let mut b = SockBuf::new(s, None);
    b.end_handshake(io_timeout)?;
    Ok(Box::new(b))
}

impl Conn for StreamOwned<ClientConnection, SockBuf> {
    fn tcp(&self) -> Option<&TcpStream> {
        Some(&self.sock.sock)
    }
}

impl Conn for StreamOwned<ServerConnection, SockBuf> {
    fn tcp(&self) -> Option<&TcpStream> {
        Some(&self.sock.sock)
    }
}

/// A reader and a writer as one connection (a recorded stream in, the
/// replies out).
pub struct Duplex<R, W> {
    /// Where the stream comes from.
    pub input: R,
    /// Where the replies go.
    pub output: W,
}

impl<R: Read, W> Read for Duplex<R, W> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.input.read(buf)
    }
}

impl<R, W: Write> Write for Duplex<R, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.output.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.output.flush()
    }
}

impl<R: Read + Send, W: Write + Send> Conn for Duplex<R, W> {}

/// How connections are secured.
#[derive(Clone)]
pub enum Security {
    /// Bare TCP.
    Plain,
    /// Mutual TLS: `server` for the destination, `client` for the source,
    /// and the name the source expects in the destination's certificate.
    Tls {
        server: Arc<ServerConfig>,
        client: Arc<ClientConfig>,
        server_name: String,
    },
    /// TLS with ephemeral certificates, then HMAC-SHA256 challenge-response
    /// with the key, bound to the TLS session.
    Psk {
        server: Arc<ServerConfig>,
        client: Arc<ClientConfig>,
        key: Arc<hmac::Key>,
    },
}

impl Security {
    /// In words, for the report.
    pub fn describe(&self) -> &'static str {
        match self {
            Security::Plain => "plain TCP (no authentication, no encryption)",
            Security::Tls { .. } => "mutual TLS 1.3",
            Security::Psk { .. } => "TLS 1.3 + pre-shared key (HMAC-SHA256 challenge-response)",
        }
    }
}

/// Socket settings of every connection.
#[derive(Clone)]
pub struct NetConfig {
    /// Deadline of every read and write (and of the TLS handshake's each
    /// step); also the keepalive idle time.
    pub io_timeout: Duration,
    /// How connections are secured.
    pub security: Security,
}

impl NetConfig {
    /// Bare TCP with `io_timeout`.
    pub fn plain(io_timeout: Duration) -> Self {
        NetConfig {
            io_timeout,
            security: Security::Plain,
        }
    }
}

fn setup(what: &str, e: impl std::fmt::Display) -> MigrateError {
    MigrateError::Setup(format!("{what}: {e}"))
}

/// Sets the deadlines, keepalive and TCP_NODELAY of a connection.
///
/// # Errors
/// [`MigrateError::Io`].
pub fn configure(s: &TcpStream, io_timeout: Duration) -> Result<(), MigrateError> {
    let io = |e: std::io::Error| MigrateError::io("configuring the connection", &e);
    s.set_nodelay(true).map_err(io)?;
    s.set_read_timeout(Some(io_timeout)).map_err(io)?;
    s.set_write_timeout(Some(io_timeout)).map_err(io)?;
    let sock = socket2::SockRef::from(s);
    let ka = socket2::TcpKeepalive::new()
        .with_time(io_timeout.max(Duration::from_secs(1)))
        .with_interval(Duration::from_secs(1))
        .with_retries(3);
    sock.set_tcp_keepalive(&ka).map_err(io)?;
    // Unacknowledged data older than this ends the connection: a peer
    // that vanished mid-write is noticed as surely as a silent one.
    sock.set_tcp_user_timeout(Some(io_timeout)).map_err(io)?;
    Ok(())
}

/// Connects to `addr` within the I/O timeout.
///
/// # Errors
/// [`MigrateError::Io`], [`MigrateError::Timeout`].
pub fn connect_tcp(addr: &str, net: &NetConfig) -> Result<TcpStream, MigrateError> {
    let what = format!("connecting to {addr}");
    let addrs: Vec<_> = addr
        .to_socket_addrs()
        .map_err(|e| MigrateError::io(what.clone(), &e))?
        .collect();
    let mut last = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, net.io_timeout) {
            Ok(s) => {
                configure(&s, net.io_timeout)?;
                return Ok(s);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) => MigrateError::io(what, &e),
        None => MigrateError::Setup(format!("{what}: no address")),
    })
}

/// The source's side of a new connection: TLS and the key exchange as
/// configured, all of it within one I/O timeout (an overall deadline, so
/// a destination that drips its handshake is cut off).
///
/// # Errors
/// [`MigrateError::Auth`] when the destination fails authentication,
/// [`MigrateError::Io`], [`MigrateError::Timeout`].
pub fn client(s: TcpStream, net: &NetConfig) -> Result<BoxConn, MigrateError> {
    let deadline = Some(Instant::now() + net.io_timeout);
    match &net.security {
        Security::Plain => plain(s, net.io_timeout),
        Security::Tls {
            client,
            server_name,
            ..
        } => {
            let mut c = tls_client(s, client, server_name, deadline)?;
            c.sock.end_handshake(net.io_timeout)?;
            Ok(Box::new(c))
        }
        Security::Psk { client, key, .. } => {
            let mut c = tls_client(s, client, "s2mmu-psk", deadline)?;
            psk_client(&mut c, key)?;
            c.sock.end_handshake(net.io_timeout)?;
            Ok(Box::new(c))
        }
    }
}

/// The destination's side of an accepted connection: TLS and the key
/// exchange within one I/O timeout from now (an overall deadline: a peer
/// that sends its ClientHello a byte at a time is cut off).
///
/// # Errors
/// [`MigrateError::Auth`] when the source fails authentication (nothing
/// of the stream was read), [`MigrateError::Io`], [`MigrateError::Timeout`].
pub fn server(s: TcpStream, net: &NetConfig) -> Result<BoxConn, MigrateError> {
    configure(&s, net.io_timeout)?;
    let deadline = Some(Instant::now() + net.io_timeout);
    match &net.security {
        Security::Plain => plain(s, net.io_timeout),
        Security::Tls { server, .. } => {
            let mut c = tls_server(s, server, deadline)?;
            c.sock.end_handshake(net.io_timeout)?;
            Ok(Box::new(c))
        }
        Security::Psk { server, key, .. } => {
            let mut c = tls_server(s, server, deadline)?;
            psk_server(&mut c, key)?;
            c.sock.end_handshake(net.io_timeout)?;
            Ok(Box::new(c))
        }
    }
}

/// Shuts a connection's socket down (to end a thread blocked on it).
pub fn shutdown(s: &TcpStream) {
    let _ = s.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod pace_tests {
    use super::*;
    use std::net::TcpListener;
    use std::thread;

    /// A connected pair; with `small`, small socket buffers, so the
    /// writer blocks on the reader at once.
    fn pair(small: bool) -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let w = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (r, _) = l.accept().unwrap();
        if small {
            socket2::SockRef::from(&w)
                .set_send_buffer_size(8 << 10)
                .unwrap();
            socket2::SockRef::from(&r)
                .set_recv_buffer_size(8 << 10)
                .unwrap();
        }
        (w, r)
    }

    /// Writes 8 MiB to a reader that takes `chunk` bytes every 50 ms (all
    /// it can at once from 1 MiB on), with a 5 s I/O timeout and a 200 ms
    /// grace for the writes' rate.
    fn write_to_reader(chunk: usize) -> std::io::Result<()> {
        let (w, mut r) = pair(chunk < 1 << 20);
        let reader = thread::spawn(move || {
            let mut buf = vec![0u8; chunk];
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(30) {
                match r.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                if chunk < 1 << 20 {
                    thread::sleep(Duration::from_millis(50));
                }
            }
        });
        let mut s = SockBuf::new(w, None);
        s.end_handshake(Duration::from_secs(5)).unwrap();
        s.pace = WritePace::new(Duration::from_millis(200));
        let r = s.write_all(&vec![7u8; 8 << 20]);
        drop(s);
        reader.join().unwrap();
        r
    }

    #[test]
    fn a_reader_below_the_minimum_rate_is_cut_off() {
        // 1 KiB every 50 ms is 20 KiB/s: every write makes progress within
        // the 5 s I/O timeout, so only the rate ends it.
        let e = write_to_reader(1 << 10).expect_err("a dripping reader is cut off");
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
        assert!(e.to_string().contains("slower than"), "{e}");
    }

    #[test]
    fn a_reader_at_full_speed_takes_everything() {
        write_to_reader(4 << 20).expect("a reader taking everything is served");
    }

    #[test]
    fn the_window_gives_no_credit_for_earlier_fast_bytes() {
        let mut p = WritePace::new(Duration::from_secs(1));
        p.record(WRITE_WINDOW as usize, Duration::ZERO).unwrap();
        // A new window: 2 s for one byte is past its 1 s grace.
        assert!(p.record(1, Duration::from_secs(2)).is_err());
    }
}
