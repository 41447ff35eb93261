//! The buffered socket under every connection: large reads, the
//! handshake's overall deadline and the writes' minimum rate, over any
//! [`Connection`].

use super::conn::{connection_via, BoxConn, Connection, ShutdownHandle};
use crate::stream_error::MigrateError;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// A socket read in large chunks: rustls asks for 4 KiB at a time, which
/// would be a system call per 4 KiB of a bulk stream. Writes go straight
/// through. While a handshake runs, every read and write is bounded by
/// the handshake's overall deadline (not only each by the I/O timeout),
/// so a peer that drips its handshake a byte at a time is cut off. After
/// the handshake, writes keep a minimum rate ([`WritePace`]): a peer that
/// reads a byte now and then, each within the I/O timeout, cannot hold the
/// sender for ever.
pub struct SockBuf {
    pub(super) sock: BoxConn,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    deadline: Option<Instant>,
    pace: WritePace,
    /// While a TLS handshake runs: each read ends at a TLS record's end,
    /// so rustls never holds bytes past the last record it processed and
    /// the stream can move to [`RecordConn`](super::records::RecordConn).
    framed: bool,
    /// Bytes of the current TLS record not yet handed out (framed only).
    record_left: usize,
}

/// The slowest a peer may take what this side writes, in bytes per second,
/// as the reader's [`MIN_RATE`](crate::wire::MIN_RATE) for what it
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
    rate: crate::pace::Pace,
}

impl WritePace {
    /// An account with `grace` (the I/O timeout).
    pub fn new(grace: Duration) -> Self {
        WritePace {
            rate: crate::pace::Pace::new(grace, MIN_WRITE_RATE, "took", "bytes"),
        }
    }

    /// Counts one write of `n` bytes that blocked for `took`.
    ///
    /// # Errors
    /// `TimedOut` once the window's time exceeds its allowance.
    pub fn record(&mut self, n: usize, took: Duration) -> std::io::Result<()> {
        self.rate.record(n, took)?;
        if self.rate.bytes() >= WRITE_WINDOW {
            self.rate.restart();
        }
        Ok(())
    }
}

impl SockBuf {
    /// `sock` buffered; with `deadline`, every read and write until
    /// [`SockBuf::end_handshake`] is bounded by it.
    pub fn new(sock: BoxConn, deadline: Option<Instant>) -> Self {
        SockBuf {
            sock,
            buf: vec![0u8; 256 << 10].into_boxed_slice(),
            start: 0,
            end: 0,
            deadline,
            pace: WritePace::new(DEFAULT_WRITE_GRACE),
            framed: false,
            record_left: 0,
        }
    }

    /// `sock` buffered as by [`SockBuf::new`], each read ending at a TLS
    /// record's end until [`SockBuf::end_handshake`].
    pub(super) fn framed(sock: BoxConn, deadline: Option<Instant>) -> Self {
        let mut s = SockBuf::new(sock, deadline);
        s.framed = true;
        s
    }

    /// Moves what is buffered to the front and reads once more after it;
    /// the bytes read (0: the end of the stream).
    fn fill_more(&mut self) -> std::io::Result<usize> {
        self.buf.copy_within(self.start..self.end, 0);
        self.end -= self.start;
        self.start = 0;
        self.arm()?;
        let t = Instant::now();
        let r = self.sock.read(&mut self.buf[self.end..]);
        crate::stages::count_socket(false, t);
        let n = r?;
        self.end += n;
        Ok(n)
    }

    /// A read that stops at the end of the current TLS record (its
    /// 5-byte header gives the length).
    fn read_framed(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.record_left == 0 {
            while self.end - self.start < 5 {
                if self.fill_more()? == 0 {
                    break;
                }
            }
            let h = &self.buf[self.start..self.end];
            self.record_left = match h.len() >= 5 {
                true => 5 + usize::from(u16::from_be_bytes([h[3], h[4]])),
                false => h.len(),
            };
        }
        if self.start == self.end && self.fill_more()? == 0 {
            return Ok(0);
        }
        let n = out.len().min(self.end - self.start).min(self.record_left);
        out[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        self.record_left -= n;
        Ok(n)
    }

    /// Reads into `out`: what is buffered first, else straight from the
    /// socket (no copy through the buffer).
    pub(super) fn read_direct(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.start < self.end {
            let n = out.len().min(self.end - self.start);
            out[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
            self.start += n;
            return Ok(n);
        }
        self.arm()?;
        let t = Instant::now();
        let r = self.sock.read(out);
        crate::stages::count_socket(false, t);
        r
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
        self.sock.set_io_timeout(Some(left))
    }

    /// Ends the handshake's deadline: the I/O timeout bounds each read and
    /// write again.
    ///
    /// # Errors
    /// [`MigrateError::Io`] when the timeout cannot be set.
    pub fn end_handshake(&mut self, io_timeout: Duration) -> Result<(), MigrateError> {
        self.deadline = None;
        self.framed = false;
        self.pace = WritePace::new(io_timeout);
        self.sock
            .set_io_timeout(Some(io_timeout))
            .map_err(|e| MigrateError::io("configuring the connection", &e))
    }
}

impl Read for SockBuf {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let want = out.len();
        self.read_wanting(out, want)
    }

    /// Several buffers at once (the destination's pages): what is buffered
    /// first; with nothing buffered and at least `DIRECT_READ` (64 KiB) asked
    /// for, one `readv` straight into them (no copy through the buffer).
    fn read_vectored(&mut self, bufs: &mut [std::io::IoSliceMut<'_>]) -> std::io::Result<usize> {
        if self.start < self.end && !self.framed {
            return Ok(self.copy_buffered(bufs));
        }
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if self.framed || total < DIRECT_READ {
            let first = bufs.iter_mut().find(|b| !b.is_empty());
            return first.map_or(Ok(0), |b| self.read_wanting(b, total));
        }
        self.arm()?;
        let t = Instant::now();
        let r = self.sock.read_vectored(bufs);
        crate::stages::count_socket(false, t);
        r
    }
}

impl SockBuf {
    /// A read into `out` by a caller about to ask for `want` bytes in all
    /// (at least `out`'s length): with nothing buffered, the buffer takes
    /// up to that many (at least [`SMALL_FILL`]) in one system call.
    fn read_wanting(&mut self, out: &mut [u8], want: usize) -> std::io::Result<usize> {
        if self.framed {
            return self.read_framed(out);
        }
        if self.start == self.end {
            self.arm()?;
            let t = Instant::now();
            if out.len() >= self.buf.len() {
                let r = self.sock.read(out);
                crate::stages::count_socket(false, t);
                return r;
            }
            // A small read fills at most SMALL_FILL: bulk data comes with
            // large or vectored reads straight into its destination (the
            // pages), so buffering past a record's head would only copy
            // those bytes twice.
            let fill = self.buf.len().min(want.max(SMALL_FILL));
            let r = self.sock.read(&mut self.buf[..fill]);
            crate::stages::count_socket(false, t);
            let n = r?;
            self.start = 0;
            self.end = n;
        }
        let n = out.len().min(self.end - self.start);
        out[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        Ok(n)
    }
}

/// The most a small read (a record's head) takes into the buffer: a full
/// PAGES record's head (tag, count, 256 entries, check: 4107 bytes) and
/// little of the data after it, which the next (vectored) read then takes
/// straight into the pages. Reading 256 KiB here copied about a quarter of
/// every 1 MiB record through the buffer.
const SMALL_FILL: usize = 8 << 10;

/// Bytes a vectored read must ask for to go straight to the socket with
/// nothing buffered (smaller ones fill the buffer: fewer system calls).
const DIRECT_READ: usize = 64 << 10;

impl SockBuf {
    /// Copies what is buffered into `bufs` in order; the bytes copied.
    fn copy_buffered(&mut self, bufs: &mut [std::io::IoSliceMut<'_>]) -> usize {
        let mut n = 0;
        for b in bufs.iter_mut() {
            let k = b.len().min(self.end - self.start);
            b[..k].copy_from_slice(&self.buf[self.start..self.start + k]);
            self.start += k;
            n += k;
            if self.start == self.end {
                break;
            }
        }
        n
    }
}

impl Write for SockBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.arm()?;
        let t = Instant::now();
        let r = self.sock.write(b);
        crate::stages::count_socket(true, t);
        let n = r?;
        self.pace.record(n, t.elapsed())?;
        Ok(n)
    }
    fn write_vectored(&mut self, b: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        self.arm()?;
        let t = Instant::now();
        let r = self.sock.write_vectored(b);
        crate::stages::count_socket(true, t);
        let n = r?;
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

impl Connection for SockBuf {
    connection_via!(sock);
}

/// A bare connection with the writes' minimum rate.
pub(super) fn plain(s: BoxConn, io_timeout: Duration) -> Result<BoxConn, MigrateError> {
    let mut b = SockBuf::new(s, None);
    b.end_handshake(io_timeout)?;
    Ok(Box::new(b))
}

#[cfg(test)]
mod pace_tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
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
        let mut s = SockBuf::new(Box::new(w), None);
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

    /// A record's head is read through the buffer, its data straight into
    /// the pages: a small read with 128 KiB waiting takes at most
    /// [`SMALL_FILL`] from the socket, and the vectored read after it
    /// gets the rest of the bytes in order.
    #[test]
    fn a_small_read_buffers_no_more_than_a_head() {
        let (mut w, r) = pair(false);
        let sent: Vec<u8> = (0..128 << 10).map(|i: u32| (i % 251) as u8).collect();
        w.write_all(&sent).unwrap();
        let mut s = SockBuf::new(Box::new(r), None);
        s.end_handshake(Duration::from_secs(5)).unwrap();
        let mut tag = [0u8; 1];
        s.read_exact(&mut tag).unwrap();
        assert!(s.end <= SMALL_FILL, "{} bytes buffered", s.end);
        let mut rest = vec![0u8; sent.len() - 1];
        let mut got = 0;
        while got < rest.len() {
            let (a, b) = rest[got..].split_at_mut(PAGE);
            let mut bufs = [std::io::IoSliceMut::new(a), std::io::IoSliceMut::new(b)];
            got += s.read_vectored(&mut bufs).unwrap();
            if got + PAGE > rest.len() {
                s.read_exact(&mut rest[got..]).unwrap();
                break;
            }
        }
        assert_eq!(tag[0], sent[0]);
        assert!(rest == sent[1..], "the bytes came out of order");
    }

    const PAGE: usize = 4096;

    #[test]
    fn the_window_gives_no_credit_for_earlier_fast_bytes() {
        let mut p = WritePace::new(Duration::from_secs(1));
        p.record(WRITE_WINDOW as usize, Duration::ZERO).unwrap();
        // A new window: 2 s for one byte is past its 1 s grace.
        assert!(p.record(1, Duration::from_secs(2)).is_err());
    }
}
