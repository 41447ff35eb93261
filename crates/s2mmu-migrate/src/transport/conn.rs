//! What every transport implements: a [`Connection`] with a deadline on
//! each read and write, a [`ShutdownHandle`], a [`Listener`], and the
//! helpers the listeners share. A leaf: the rest of `transport` builds on
//! it, and it imports nothing of theirs.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

    /// Whether [`Connection::write_sealed`] seals records in place (a
    /// TLS record layer): a bulk writer that lays its bytes out as
    /// [`sealed_offset`] says then saves a copy of every byte.
    fn seals_in_place(&self) -> bool {
        false
    }

    /// Bytes written to the connection that its peer has not taken yet
    /// (the socket's unsent queue), where the transport knows: a sender
    /// that sees them pile up is ahead of its link.
    fn unsent_bytes(&self) -> Option<u64> {
        None
    }

    /// Whether every byte read from the connection was authenticated
    /// by it (a TLS record's AEAD tag): damage on the way is then refused
    /// by the connection, before the stream sees the bytes.
    fn authenticates(&self) -> bool {
        false
    }

    /// Writes `head`, then the first `plain` bytes of the stream laid
    /// out in `frames` as [`sealed_offset`] says (room left for each
    /// record's header before and its content type and tag after). A
    /// connection that [seals in place](Connection::seals_in_place)
    /// encrypts `frames` where they lie (the plaintext is gone after the
    /// call); any other writes the plaintext as it is.
    ///
    /// # Errors
    /// `InvalidInput` when `frames` is shorter than [`sealed_len`]`(plain)`;
    /// the connection's error when writing fails.
    fn write_sealed(
        &mut self,
        head: &[u8],
        frames: &mut [u8],
        plain: usize,
    ) -> std::io::Result<()> {
        let frames = frames_checked(frames, plain)?;
        self.write_all(head)?;
        record_plaintexts(frames, plain).try_for_each(|p| self.write_all(p))
    }
}

/// Bytes reserved before each record's plaintext in a buffer for
/// [`Connection::write_sealed`]: a TLS record header.
pub const SEAL_BEFORE: usize = 5;
/// Bytes reserved after each record's plaintext: TLS 1.3's inner content
/// type and the AEAD tag.
pub const SEAL_AFTER: usize = 1 + 16;
/// Plaintext bytes of each record but the last (TLS's largest, 2^14).
pub const SEAL_PLAIN: usize = 1 << 14;
/// Bytes one whole record takes in such a buffer.
pub const SEAL_SPAN: usize = SEAL_BEFORE + SEAL_PLAIN + SEAL_AFTER;

/// Where the stream's byte `at` lies in a buffer for
/// [`Connection::write_sealed`].
/// (Saturating: no buffer is that large.)
pub const fn sealed_offset(at: usize) -> usize {
    (at / SEAL_PLAIN)
        .saturating_mul(SEAL_SPAN)
        .saturating_add(SEAL_BEFORE + at % SEAL_PLAIN)
}

/// Bytes of such a buffer that `plain` bytes of the stream take, their
/// records' reserved room included (saturating).
pub const fn sealed_len(plain: usize) -> usize {
    let rest = plain % SEAL_PLAIN;
    let last = if rest > 0 {
        SEAL_BEFORE + rest + SEAL_AFTER
    } else {
        0
    };
    (plain / SEAL_PLAIN)
        .saturating_mul(SEAL_SPAN)
        .saturating_add(last)
}

/// Plaintext bytes that record `r` of a buffer for
/// [`Connection::write_sealed`] carries of the stream's first `plain`
/// (`SEAL_PLAIN` each, the last one the rest); `r` must be below
/// `plain.div_ceil(SEAL_PLAIN)`.
pub(crate) fn record_plain(plain: usize, r: usize) -> usize {
    (plain - r * SEAL_PLAIN).min(SEAL_PLAIN)
}

/// Each record's plaintext, in order, of `frames` laid out for
/// [`Connection::write_sealed`] and cut to [`sealed_len`]`(plain)`.
pub(crate) fn record_plaintexts(frames: &[u8], plain: usize) -> impl Iterator<Item = &[u8]> {
    frames
        .chunks(SEAL_SPAN)
        .enumerate()
        .map(move |(r, rec)| &rec[SEAL_BEFORE..SEAL_BEFORE + record_plain(plain, r)])
}

/// `frames` cut to [`sealed_len`]`(plain)`, or `InvalidInput` when it is
/// shorter.
pub(super) fn frames_checked(frames: &mut [u8], plain: usize) -> std::io::Result<&mut [u8]> {
    let have = frames.len();
    // sealed_len(plain) >= plain: checked first, the sum cannot overflow.
    let len = if plain <= have {
        sealed_len(plain)
    } else {
        usize::MAX
    };
    frames.get_mut(..len).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{have} bytes of frames for {plain} bytes of records"),
        )
    })
}

/// A boxed connection.
pub type BoxConn = Box<dyn Connection>;

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
            fn unsent_bytes(&self) -> Option<u64> {
                (**self).unsent_bytes()
            }
            fn seals_in_place(&self) -> bool {
                (**self).seals_in_place()
            }
            fn authenticates(&self) -> bool {
                (**self).authenticates()
            }
            fn write_sealed(&mut self, h: &[u8], f: &mut [u8], n: usize) -> std::io::Result<()> {
                (**self).write_sealed(h, f, n)
            }
        }
    };
}
forward_connection!(impl<C: Connection + ?Sized> Connection for Box<C>);
forward_connection!(impl<C: Connection + ?Sized> Connection for &mut C);

/// Writes, inside an `impl Connection`, the methods that pass straight to
/// the connection in field `$field`: the deadline, the shutdown handle and
/// the peer's name (`all` adds the rest, for a wrapper that changes none).
macro_rules! connection_via {
    ($field:ident) => {
        fn set_io_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
            self.$field.set_io_timeout(timeout)
        }
        fn io_timeout(&self) -> Option<Duration> {
            self.$field.io_timeout()
        }
        fn shutdown_handle(&self) -> std::io::Result<ShutdownHandle> {
            self.$field.shutdown_handle()
        }
        fn peer(&self) -> String {
            self.$field.peer()
        }
        fn unsent_bytes(&self) -> Option<u64> {
            self.$field.unsent_bytes()
        }
    };
    ($field:ident, all) => {
        $crate::transport::conn::connection_via!($field);
        fn configure(&self, io_timeout: Duration) -> std::io::Result<()> {
            self.$field.configure(io_timeout)
        }
        fn seals_in_place(&self) -> bool {
            self.$field.seals_in_place()
        }
        fn authenticates(&self) -> bool {
            self.$field.authenticates()
        }
        fn write_sealed(&mut self, h: &[u8], f: &mut [u8], n: usize) -> std::io::Result<()> {
            self.$field.write_sealed(h, f, n)
        }
    };
}
pub(super) use connection_via;

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
pub(super) fn accept_polling<T>(
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

/// A writer into a buffer shared by its clones: one clone goes into a
/// [`Duplex`] as its output, the other reads back what was written. For
/// tests and the fuzz targets only (feature `fuzzing`).
#[cfg(any(test, feature = "fuzzing"))]
#[derive(Clone, Default)]
pub struct SharedSink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(any(test, feature = "fuzzing"))]
impl SharedSink {
    /// A copy of every byte written so far, in order.
    pub fn bytes(&self) -> Vec<u8> {
        // A writer that panicked holding the lock left whole writes behind.
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(any(test, feature = "fuzzing"))]
impl Write for SharedSink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let mut buf = self.0.lock().unwrap_or_else(|p| p.into_inner());
        buf.try_reserve(b.len()).map_err(std::io::Error::other)?;
        buf.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
