//! Connections of a migration: a [`Connection`] (read and write with a
//! deadline on each, a [`ShutdownHandle`] that ends it from any thread, a
//! description of the peer) and a [`Listener`] (accept within a deadline,
//! shut down from any thread). Two transports implement them: TCP
//! ([`tcp`]: keepalive, `TCP_NODELAY`, a user timeout) and Unix sockets
//! ([`unix`]: same-host upgrades). TLS and the pre-shared key are layered
//! over any connection.
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

use crate::stream_error::MigrateError;
use ring::hmac;
use rustls::{ClientConfig, ServerConfig, StreamOwned};
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod admit;
pub mod plain_probe;
mod psk;
mod sockbuf;
pub mod tcp;
mod tls;
pub mod unix;

#[cfg(test)]
mod tests;

pub use admit::{Admission, Admitted, Opener, Refused, MAX_OPENING, MAX_PREAUTH};
pub use plain_probe::{plain_tcp_link, sink_addr_for, PlainLink, PlainSink};
pub use psk::{psk, psk_from_file};
use psk::{psk_client, psk_server};
use sockbuf::plain;
pub use sockbuf::{SockBuf, WritePace, MIN_WRITE_RATE, WRITE_WINDOW};
pub use tcp::{configure, connect_tcp};
pub use tls::{ephemeral_tls, make_pki, tls_from_files, Pki};
use tls::{tls_client, tls_server};
pub use unix::{connect_unix, UnixListen};

/// A connection carrying a migration stream: a byte stream whose reads
/// and writes each have a deadline, which another thread can shut down,
/// and whose peer can be named in messages.
pub trait Connection: Read + Write + Send {
    /// Bounds each read and each write to `timeout` (None: no bound).
    ///
    /// # Errors
    /// The transport's error when it cannot be set.
    fn set_io_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()>;

    /// The bound of each read (None: none, or not known).
    fn io_timeout(&self) -> Option<Duration>;

    /// Sets the connection up for a migration: the deadlines, and the
    /// transport's own liveness settings (TCP: keepalive, `TCP_NODELAY`,
    /// a user timeout).
    ///
    /// # Errors
    /// The transport's error when a setting fails.
    fn configure(&self, io_timeout: Duration) -> std::io::Result<()> {
        self.set_io_timeout(Some(io_timeout))
    }

    /// A handle that shuts this connection down from any thread (a thread
    /// blocked reading or writing it returns at once).
    ///
    /// # Errors
    /// The transport's error when the handle cannot be made (no file
    /// descriptor left to duplicate the socket).
    fn shutdown_handle(&self) -> std::io::Result<ShutdownHandle>;

    /// The peer, in words (an address, a socket path).
    fn peer(&self) -> String;
}

/// A boxed connection.
pub type BoxConn = Box<dyn Connection>;

/// Bytes of encrypted records a TLS connection queues before it writes
/// them: rustls's default (64 KiB) makes a system call per 64 KiB, so a
/// 1 MiB batch of pages took 16; with 1 MiB it goes out in one `writev`
/// of 64 records (rustls writes at most 64 chunks at once). A bound per
/// connection, not a growth.
pub const TLS_SEND_BUFFER: usize = 1 << 20;

/// Forwards every method of [`Connection`] through a pointer.
macro_rules! forward_connection {
    ($($t:tt)*) => {
        $($t)* {
            fn set_io_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
                (**self).set_io_timeout(timeout)
            }
            fn io_timeout(&self) -> Option<Duration> {
                (**self).io_timeout()
            }
            fn configure(&self, io_timeout: Duration) -> std::io::Result<()> {
                (**self).configure(io_timeout)
            }
            fn shutdown_handle(&self) -> std::io::Result<ShutdownHandle> {
                (**self).shutdown_handle()
            }
            fn peer(&self) -> String {
                (**self).peer()
            }
        }
    };
}
forward_connection!(impl<C: Connection + ?Sized> Connection for Box<C>);
forward_connection!(impl<C: Connection + ?Sized> Connection for &mut C);

/// Ends a connection or a listener from any thread: what a thread blocked
/// on it waits for returns at once with an error or the end of the
/// stream. Cloning shares the one connection.
#[derive(Clone)]
pub struct ShutdownHandle(Option<Arc<dyn Fn() + Send + Sync>>);

impl ShutdownHandle {
    /// A handle that runs `shut` (idempotent: it may run more than once).
    pub fn new(shut: impl Fn() + Send + Sync + 'static) -> Self {
        ShutdownHandle(Some(Arc::new(shut)))
    }

    /// A handle with nothing to shut down (a recorded stream).
    pub fn none() -> Self {
        ShutdownHandle(None)
    }

    /// Shuts the connection down (both directions).
    pub fn shutdown(&self) {
        if let Some(f) = &self.0 {
            f();
        }
    }
}

impl std::fmt::Debug for ShutdownHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "ShutdownHandle"
        } else {
            "ShutdownHandle(none)"
        })
    }
}

/// Where connections come in: accepts within a deadline, and can be shut
/// down from another thread.
pub trait Listener: Send + Sync {
    /// The next connection and its peer's description; None once
    /// `deadline` passed (a deadline already past: only a connection
    /// already waiting). A shut-down listener returns an error.
    ///
    /// # Errors
    /// The transport's error when accepting fails; [`transient`] says
    /// which errors concern one connection only (the caller may go on).
    fn accept_until(&self, deadline: Option<Instant>)
        -> std::io::Result<Option<(BoxConn, String)>>;

    /// A handle that shuts the listening socket down: every later accept
    /// fails.
    ///
    /// # Errors
    /// The transport's error when the handle cannot be made.
    fn shutdown_handle(&self) -> std::io::Result<ShutdownHandle>;

    /// Where it listens, in words.
    fn local(&self) -> String;
}

/// Accept errors that concern one connection or a passing shortage (the
/// connection was reset before it was accepted, no file descriptor left
/// for a moment): the listener goes on.
pub fn transient(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionReset, Interrupted};
    matches!(e.kind(), ConnectionAborted | ConnectionReset | Interrupted)
        || matches!(
            e.raw_os_error(),
            Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::EPROTO)
        )
}

/// How long a listener sleeps between looks at a socket with nothing
/// waiting (the listeners poll without blocking, so a deadline and a
/// shutdown are both seen within it).
const ACCEPT_POLL: Duration = Duration::from_millis(1);

/// Accepts with `try_accept` (on a non-blocking socket) until something
/// comes, it fails, or `deadline` passes.
fn accept_polling<T>(
    deadline: Option<Instant>,
    mut try_accept: impl FnMut() -> std::io::Result<T>,
) -> std::io::Result<Option<T>> {
    loop {
        match try_accept() {
            Ok(t) => return Ok(Some(t)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        let now = Instant::now();
        let wait = match deadline {
            Some(d) if d <= now => return Ok(None),
            Some(d) => (d - now).min(ACCEPT_POLL),
            None => ACCEPT_POLL,
        };
        std::thread::sleep(wait);
    }
}

/// Connects to `addr`: `unix:PATH` is a Unix socket, anything else a TCP
/// address (`host:port`); within the I/O timeout, configured.
///
/// # Errors
/// [`MigrateError::Io`], [`MigrateError::Timeout`], [`MigrateError::Setup`]
/// for an address that names nothing.
pub fn connect(addr: &str, net: &NetConfig) -> Result<BoxConn, MigrateError> {
    match addr.strip_prefix("unix:") {
        Some(path) => Ok(Box::new(connect_unix(std::path::Path::new(path), net)?)),
        None => Ok(Box::new(connect_tcp(addr, net)?)),
    }
}

/// Listens at `addr`: `unix:PATH` is a Unix socket, anything else a TCP
/// address.
///
/// # Errors
/// [`MigrateError::Io`] naming the address.
pub fn bind(addr: &str) -> Result<Box<dyn Listener>, MigrateError> {
    let what = format!("listening on {addr}");
    let io = |e: std::io::Error| MigrateError::io(what.clone(), &e);
    match addr.strip_prefix("unix:") {
        Some(path) => Ok(Box::new(unix::UnixListen::bind(std::path::Path::new(
            path,
        ))?)),
        None => Ok(Box::new(std::net::TcpListener::bind(addr).map_err(io)?)),
    }
}

impl<C: Send> Connection for StreamOwned<C, SockBuf>
where
    StreamOwned<C, SockBuf>: Read + Write,
{
    fn set_io_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        self.sock.set_io_timeout(timeout)
    }
    fn io_timeout(&self) -> Option<Duration> {
        self.sock.io_timeout()
    }
    fn shutdown_handle(&self) -> std::io::Result<ShutdownHandle> {
        self.sock.shutdown_handle()
    }
    fn peer(&self) -> String {
        self.sock.peer()
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

impl<R: Read + Send, W: Write + Send> Connection for Duplex<R, W> {
    fn set_io_timeout(&self, _timeout: Option<Duration>) -> std::io::Result<()> {
        Ok(())
    }
    fn io_timeout(&self) -> Option<Duration> {
        None
    }
    fn shutdown_handle(&self) -> std::io::Result<ShutdownHandle> {
        Ok(ShutdownHandle::none())
    }
    fn peer(&self) -> String {
        "a recorded stream".into()
    }
}

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

/// The source's side of a new connection: TLS and the key exchange as
/// configured, all of it within one I/O timeout (an overall deadline, so
/// a destination that drips its handshake is cut off).
///
/// # Errors
/// [`MigrateError::Auth`] when the destination fails authentication,
/// [`MigrateError::Io`], [`MigrateError::Timeout`].
pub fn client<C: Connection + 'static>(s: C, net: &NetConfig) -> Result<BoxConn, MigrateError> {
    let s: BoxConn = Box::new(s);
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
            c.conn.set_buffer_limit(Some(TLS_SEND_BUFFER));
            Ok(Box::new(c))
        }
        Security::Psk { client, key, .. } => {
            let mut c = tls_client(s, client, "s2mmu-psk", deadline)?;
            psk_client(&mut c, key)?;
            c.sock.end_handshake(net.io_timeout)?;
            c.conn.set_buffer_limit(Some(TLS_SEND_BUFFER));
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
pub fn server<C: Connection + 'static>(s: C, net: &NetConfig) -> Result<BoxConn, MigrateError> {
    s.configure(net.io_timeout)
        .map_err(|e| MigrateError::io("configuring the connection", &e))?;
    let s: BoxConn = Box::new(s);
    let deadline = Some(Instant::now() + net.io_timeout);
    match &net.security {
        Security::Plain => plain(s, net.io_timeout),
        Security::Tls { server, .. } => {
            let mut c = tls_server(s, server, deadline)?;
            c.sock.end_handshake(net.io_timeout)?;
            c.conn.set_buffer_limit(Some(TLS_SEND_BUFFER));
            Ok(Box::new(c))
        }
        Security::Psk { server, key, .. } => {
            let mut c = tls_server(s, server, deadline)?;
            psk_server(&mut c, key)?;
            c.sock.end_handshake(net.io_timeout)?;
            c.conn.set_buffer_limit(Some(TLS_SEND_BUFFER));
            Ok(Box::new(c))
        }
    }
}
