//! TLS 1.3 application data after the handshake, sealed and opened in
//! place with the session's traffic keys (RFC 8446 section 5).
//!
//! rustls's buffered connection copies every received byte three times in
//! user space (its socket read into the deframer, the decrypted record into
//! a fresh `Vec`, that into the caller's buffer) and allocates per record.
//! Here the socket is read straight into one large buffer, each record is
//! decrypted where it lies, and the plaintext is copied once, into the
//! caller's buffer (guest memory on the destination). Sending seals
//! records in place in one buffer and writes a whole call's records with
//! one system call. The handshake, the certificates and the pre-shared key
//! stay rustls's; only the record layer of the established session is
//! done here, with ring's AEAD (the same code rustls uses).

#[cfg(any(test, feature = "fuzzing"))]
use super::conn::BoxConn;
use super::conn::{
    connection_via, frames_checked, record_plain, Connection, ShutdownHandle, SEAL_AFTER,
    SEAL_BEFORE, SEAL_PLAIN, SEAL_SPAN,
};
use super::sockbuf::SockBuf;
use crate::stream_store::{copy_streaming, fence_streaming};
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use rustls::{ConnectionTrafficSecrets, ExtractedSecrets};
use std::io::{Error, ErrorKind, Read, Write};
use std::time::Duration;

/// Outer content type of every TLS 1.3 record after the handshake.
const APPLICATION_DATA: u8 = 0x17;
/// Inner content types.
const ALERT: u8 = 0x15;
const HANDSHAKE: u8 = 0x16;
/// Bytes of a record header.
const HEADER: usize = 5;
/// Largest plaintext of a record (2^14).
pub const MAX_PLAIN: usize = 1 << 14;
/// Largest ciphertext of a record (RFC 8446: 2^14 + 256).
pub const MAX_CIPHER: usize = MAX_PLAIN + 256;
/// AEAD tag bytes (AES-GCM and ChaCha20-Poly1305 alike).
const TAG: usize = 16;
/// Records per key at most: AES-GCM's confidentiality limit is 2^24.5
/// records (RFC 8446 section 5.5); this layer does no key update, so a
/// connection stops there (2^24 records of 16 KiB: 256 GiB, four times
/// the largest guest).
pub const MAX_RECORDS: u64 = 1 << 24;
/// Bytes of the receive buffer: the socket is read in chunks this large.
const RECV_BUF: usize = 512 << 10;
/// A vectored read asking for this many bytes or more is bulk data (a
/// PAGES record's pages, each 4 KiB, into guest memory that is not read
/// again before the guest runs): its plaintext is copied with streaming
/// stores. The stream's other reads ask for a record head or less.
const BULK: usize = 64 << 10;
/// Plaintext sealed per write call at most (64 records, one system call).
const SEND_CHUNK: usize = 64 * MAX_PLAIN;

// The layout `Connection::write_sealed`'s callers build is this layer's.
const _: () = assert!(SEAL_BEFORE == HEADER && SEAL_AFTER == 1 + TAG && SEAL_PLAIN == MAX_PLAIN);

/// One direction's key, nonce base and sequence number.
struct Direction {
    key: LessSafeKey,
    iv: [u8; aead::NONCE_LEN],
    seq: u64,
}

impl Direction {
    fn new((seq, secrets): (u64, ConnectionTrafficSecrets)) -> std::io::Result<Self> {
        let (alg, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&aead::CHACHA20_POLY1305, key, iv)
            }
            _ => return Err(Error::other("TLS cipher suite without a record layer here")),
        };
        let key = UnboundKey::new(alg, key.as_ref())
            .map_err(|_| Error::other("TLS traffic key of the wrong length"))?;
        let iv: [u8; aead::NONCE_LEN] = iv
            .as_ref()
            .try_into()
            .map_err(|_| Error::other("TLS traffic IV of the wrong length"))?;
        Ok(Direction {
            key: LessSafeKey::new(key),
            iv,
            seq,
        })
    }

    /// The next record's nonce (the IV XOR the sequence number), counting
    /// the record: the IV's last 8 bytes XOR the number, as one word.
    #[inline(always)]
    fn next_nonce(&mut self) -> std::io::Result<Nonce> {
        if self.seq >= MAX_RECORDS {
            return Err(Error::other(
                "TLS record limit of one key reached (no key update here)",
            ));
        }
        let (head, tail) = self.iv.split_at(4);
        let tail = u64::from_be_bytes(tail.try_into().map_err(|_| Error::other("IV length"))?);
        let mut n = [0u8; aead::NONCE_LEN];
        n[..4].copy_from_slice(head);
        n[4..].copy_from_slice(&(tail ^ self.seq).to_be_bytes());
        self.seq += 1;
        Ok(Nonce::assume_unique_for_key(n))
    }
}

/// An established TLS 1.3 session over a [`SockBuf`], its records sealed
/// and opened here.
pub struct RecordConn {
    sock: SockBuf,
    tx: Direction,
    rx: Direction,
    /// Received bytes: `[plain.0, plain.1)` is the opened record's
    /// plaintext not yet read, `[raw, end)` what follows, not yet opened.
    rbuf: Box<[u8]>,
    plain: (usize, usize),
    raw: usize,
    end: usize,
    /// Plaintext rustls had decrypted before the switch, read first.
    pending: Vec<u8>,
    pending_at: usize,
    /// Sealed records on their way out.
    wbuf: Vec<u8>,
    /// The peer sent close_notify: reads return the end of the stream.
    closed: bool,
    /// A write failed part-way: the stream is cut, every later write fails.
    broken: bool,
}

fn bad(what: &str) -> Error {
    Error::new(ErrorKind::InvalidData, format!("TLS record: {what}"))
}

impl RecordConn {
    /// The session of `secrets` over `sock`, with `pending` (plaintext
    /// already decrypted by rustls) to be read first.
    ///
    /// # Errors
    /// `Other` for a cipher suite or key this layer does not handle.
    pub(super) fn new(
        sock: SockBuf,
        secrets: ExtractedSecrets,
        pending: Vec<u8>,
    ) -> std::io::Result<Self> {
        Ok(RecordConn {
            sock,
            tx: Direction::new(secrets.tx)?,
            rx: Direction::new(secrets.rx)?,
            rbuf: vec![0u8; RECV_BUF].into_boxed_slice(),
            plain: (0, 0),
            raw: 0,
            end: 0,
            pending,
            pending_at: 0,
            wbuf: Vec::with_capacity(SEND_CHUNK + (SEND_CHUNK / MAX_PLAIN) * (HEADER + 1 + TAG)),
            closed: false,
            broken: false,
        })
    }

    /// Opens the record at `raw` if it is here whole; whether one was.
    fn open_buffered(&mut self) -> std::io::Result<bool> {
        let avail = self.end - self.raw;
        if avail < HEADER {
            return Ok(false);
        }
        let h: [u8; HEADER] = self.rbuf[self.raw..self.raw + HEADER]
            .try_into()
            .map_err(|_| bad("short header"))?;
        let len = usize::from(u16::from_be_bytes([h[3], h[4]]));
        if h[0] != APPLICATION_DATA || h[1] != 3 || h[2] != 3 {
            return Err(bad("not an application-data record of TLS 1.2/1.3 framing"));
        }
        if !(TAG + 1..=MAX_CIPHER).contains(&len) {
            return Err(bad("length out of bounds"));
        }
        if avail < HEADER + len {
            return Ok(false);
        }
        let body = self.raw + HEADER;
        self.raw = body + len;
        let nonce = self.rx.next_nonce()?;
        let opened = self
            .rx
            .key
            .open_in_place(nonce, Aad::from(h), &mut self.rbuf[body..body + len])
            .map_err(|_| bad("decryption failed (tampered or out of order)"))?;
        // RFC 8446 section 5.4: padding does not lift the record size
        // limit, the whole inner plaintext is at most 2^14 + 1 bytes (the
        // outer bound of 2^14 + 256 leaves room for any AEAD's expansion).
        if opened.len() > MAX_PLAIN + 1 {
            return Err(bad("record_overflow: inner plaintext over 2^14 + 1 bytes"));
        }
        // The inner type is the last non-zero byte (zeros are padding).
        let Some(at) = opened.iter().rposition(|&b| b != 0) else {
            return Err(bad("no content type"));
        };
        match opened[at] {
            APPLICATION_DATA => self.plain = (body, body + at),
            ALERT if opened[..at] == [1, 0] => self.closed = true,
            ALERT => return Err(bad("alert from the peer")),
            HANDSHAKE => return Err(bad("post-handshake message (not used by this stream)")),
            _ => return Err(bad("unknown content type")),
        }
        Ok(true)
    }

    /// Reads more of the stream from the socket; false at its end.
    fn read_more(&mut self) -> std::io::Result<bool> {
        if self.raw == self.end {
            (self.raw, self.end) = (0, 0);
        } else if self.rbuf.len() - self.end < HEADER + MAX_CIPHER {
            self.rbuf.copy_within(self.raw..self.end, 0);
            self.end -= self.raw;
            self.raw = 0;
        }
        let n = self.sock.read_direct(&mut self.rbuf[self.end..])?;
        self.end += n;
        Ok(n > 0)
    }

    /// Makes plaintext available (opening records, reading the socket
    /// only when `block`); false when there is none (the stream ended, or
    /// none without blocking).
    fn ready(&mut self, block: bool) -> std::io::Result<bool> {
        while self.plain.0 == self.plain.1 {
            if self.closed {
                return Ok(false);
            }
            if self.open_buffered()? {
                continue;
            }
            if !block {
                return Ok(false);
            }
            if !self.read_more()? {
                if self.end > self.raw {
                    return Err(Error::new(ErrorKind::UnexpectedEof, "TLS record cut"));
                }
                return Err(Error::new(
                    ErrorKind::UnexpectedEof,
                    "peer closed connection without sending TLS close_notify",
                ));
            }
        }
        Ok(true)
    }

    /// Copies the opened plaintext into `out`; the bytes copied.
    fn take(&mut self, out: &mut [u8]) -> usize {
        self.take_into(out, false, &mut false)
    }

    /// [`Self::take`], with streaming stores where `bulk` (`streamed` is
    /// set when they were used: a fence is owed).
    fn take_into(&mut self, out: &mut [u8], bulk: bool, streamed: &mut bool) -> usize {
        let n = out.len().min(self.plain.1 - self.plain.0);
        let src = &self.rbuf[self.plain.0..self.plain.0 + n];
        if bulk {
            *streamed |= copy_streaming(&mut out[..n], src);
        } else {
            out[..n].copy_from_slice(src);
        }
        self.plain.0 += n;
        n
    }

    /// Seals `data` (at most [`SEND_CHUNK`]) into records in `wbuf`.
    fn seal(&mut self, data: &[u8]) -> std::io::Result<()> {
        let mut wbuf = std::mem::take(&mut self.wbuf);
        let r = self.seal_into(&mut wbuf, data);
        self.wbuf = wbuf;
        r
    }

    /// Seals `data` into records appended to `out`.
    fn seal_into(&mut self, out: &mut Vec<u8>, data: &[u8]) -> std::io::Result<()> {
        for chunk in data.chunks(MAX_PLAIN) {
            let len = chunk.len() + 1 + TAG;
            let start = out.len();
            let h = [APPLICATION_DATA, 3, 3, (len >> 8) as u8, len as u8];
            out.extend_from_slice(&h);
            out.extend_from_slice(chunk);
            out.push(APPLICATION_DATA);
            let nonce = self.tx.next_nonce()?;
            let tag = self
                .tx
                .key
                .seal_in_place_separate_tag(nonce, Aad::from(h), &mut out[start + HEADER..])
                .map_err(|_| Error::other("TLS record sealing failed"))?;
            out.extend_from_slice(tag.as_ref());
        }
        Ok(())
    }
}

impl RecordConn {
    /// Seals the records laid out in `frames` (cut to their length) in
    /// place: each record's header before its plaintext, its content type
    /// and tag after.
    fn seal_frames(&mut self, frames: &mut [u8], plain: usize) -> std::io::Result<()> {
        for (r, rec) in frames.chunks_mut(SEAL_SPAN).enumerate() {
            let n = record_plain(plain, r);
            let len = n + 1 + TAG;
            let h = [APPLICATION_DATA, 3, 3, (len >> 8) as u8, len as u8];
            rec[..HEADER].copy_from_slice(&h);
            rec[HEADER + n] = APPLICATION_DATA;
            let nonce = self.tx.next_nonce()?;
            let tag = self
                .tx
                .key
                .seal_in_place_separate_tag(nonce, Aad::from(h), &mut rec[HEADER..HEADER + n + 1])
                .map_err(|_| Error::other("TLS record sealing failed"))?;
            rec[HEADER + n + 1..HEADER + n + 1 + TAG].copy_from_slice(tag.as_ref());
        }
        Ok(())
    }

    /// Writes all of `a` then all of `b`, in vectored writes.
    fn write_two(&mut self, a: &[u8], b: &[u8]) -> std::io::Result<()> {
        let total = a.len() + b.len();
        let mut done = 0;
        while done < total {
            let bufs = if done < a.len() {
                [std::io::IoSlice::new(&a[done..]), std::io::IoSlice::new(b)]
            } else {
                [
                    std::io::IoSlice::new(&b[done - a.len()..]),
                    std::io::IoSlice::new(&[]),
                ]
            };
            match self.sock.write_vectored(&bufs) {
                Ok(0) => return Err(Error::from(ErrorKind::WriteZero)),
                Ok(n) => done += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl Read for RecordConn {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.pending_at < self.pending.len() {
            let n = out.len().min(self.pending.len() - self.pending_at);
            out[..n].copy_from_slice(&self.pending[self.pending_at..self.pending_at + n]);
            self.pending_at += n;
            return Ok(n);
        }
        if out.is_empty() || !self.ready(true)? {
            return Ok(0);
        }
        Ok(self.take(out))
    }

    /// Fills as many of `bufs` as the records already here allow, blocking
    /// only while nothing was copied. A read of [`BULK`] bytes or more
    /// (a PAGES record's data, landing in guest memory) copies the
    /// plaintext with streaming stores, fenced before it returns.
    fn read_vectored(&mut self, bufs: &mut [std::io::IoSliceMut<'_>]) -> std::io::Result<usize> {
        if self.pending_at < self.pending.len() {
            let first = bufs.iter_mut().find(|b| !b.is_empty());
            return first.map_or(Ok(0), |b| self.read(b));
        }
        let bulk = bufs.iter().map(|b| b.len()).sum::<usize>() >= BULK;
        let mut streamed = false;
        let mut got = 0;
        let r = (|| {
            for b in bufs.iter_mut() {
                let mut at = 0;
                while at < b.len() {
                    if !self.ready(got == 0)? {
                        return Ok(());
                    }
                    let n = self.take_into(&mut b[at..], bulk, &mut streamed);
                    at += n;
                    got += n;
                }
            }
            Ok(())
        })();
        if streamed {
            fence_streaming();
        }
        r.map(|()| got)
    }
}

impl Write for RecordConn {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.broken {
            return Err(Error::new(ErrorKind::BrokenPipe, "an earlier write failed"));
        }
        let data = &data[..data.len().min(SEND_CHUNK)];
        self.wbuf.clear();
        self.seal(data)?;
        let r = self.sock.write_all(&self.wbuf);
        if r.is_err() {
            self.broken = true;
        }
        r.map(|_| data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.sock.flush()
    }
}

impl Connection for RecordConn {
    connection_via!(sock);
    fn seals_in_place(&self) -> bool {
        true
    }
    /// Every record is opened with its AEAD tag checked before a byte of
    /// it is read.
    fn authenticates(&self) -> bool {
        true
    }
    /// Seals `head` into the send buffer and `frames` where they lie, and
    /// writes both, in one system call when the socket takes them.
    fn write_sealed(
        &mut self,
        head: &[u8],
        frames: &mut [u8],
        plain: usize,
    ) -> std::io::Result<()> {
        if self.broken {
            return Err(Error::new(ErrorKind::BrokenPipe, "an earlier write failed"));
        }
        let frames = frames_checked(frames, plain)?;
        let mut wbuf = std::mem::take(&mut self.wbuf);
        wbuf.clear();
        let r = self
            .seal_into(&mut wbuf, head)
            .and_then(|()| self.seal_frames(frames, plain))
            .and_then(|()| self.write_two(&wbuf, frames));
        self.wbuf = wbuf;
        // Records may have been counted and not sent: the stream is cut.
        if r.is_err() {
            self.broken = true;
        }
        r
    }
}

/// A session over `sock` whose two directions share `key` and `iv` (so
/// what one such session seals another opens), AES-256-GCM or, with
/// `chacha`, ChaCha20-Poly1305, its records numbered from `first_seq` in
/// both directions. For tests and the record opener's fuzz target only
/// (feature `fuzzing`): a fixed key is no secret.
///
/// # Errors
/// None in practice (the key and IV have their suites' lengths).
#[cfg(any(test, feature = "fuzzing"))]
pub fn fixed_key_session(
    sock: BoxConn,
    key: [u8; 32],
    iv: [u8; 12],
    chacha: bool,
    first_seq: u64,
) -> std::io::Result<BoxConn> {
    let secrets = || match chacha {
        true => ConnectionTrafficSecrets::Chacha20Poly1305 {
            key: key.into(),
            iv: iv.into(),
        },
        false => ConnectionTrafficSecrets::Aes256Gcm {
            key: key.into(),
            iv: iv.into(),
        },
    };
    let secrets = ExtractedSecrets {
        tx: (first_seq, secrets()),
        rx: (first_seq, secrets()),
    };
    let mut sock = SockBuf::new(sock, None);
    sock.end_handshake(Duration::from_secs(5))
        .map_err(|e| Error::other(e.to_string()))?;
    Ok(Box::new(RecordConn::new(sock, secrets, Vec::new())?))
}

/// Plaintext rustls may hold at the switch at most (its own received
/// buffer's default bound is 16 KiB).
const MAX_PENDING: usize = 64 << 10;

/// Whether the sessions of these configurations can move to
/// [`RecordConn`]: secrets may be extracted, and (server) no session
/// tickets follow the handshake.
pub(super) fn server_can_take_over(cfg: &rustls::ServerConfig) -> bool {
    cfg.enable_secret_extraction && cfg.send_tls13_tickets == 0
}

/// Lets the TLS sessions of `server` and `client` move to [`RecordConn`]
/// after their handshakes.
pub(super) fn allow_take_over(
    server: &mut rustls::ServerConfig,
    client: &mut rustls::ClientConfig,
) {
    server.enable_secret_extraction = true;
    server.send_tls13_tickets = 0;
    client.enable_secret_extraction = true;
}

/// The established session `conn` over `sock` as a [`RecordConn`]: what
/// rustls still has to send goes out, what it decrypted and not handed out
/// is kept to be read first. `sock` was framed during the handshake, so
/// rustls holds no part of a later record.
///
/// # Errors
/// `Other` when rustls keeps its secrets or the session is not TLS 1.3,
/// the socket's error when sending rustls's last records fails.
pub(super) fn take_over(
    conn: impl Into<rustls::Connection>,
    mut sock: SockBuf,
) -> std::io::Result<RecordConn> {
    let mut conn: rustls::Connection = conn.into();
    if conn.protocol_version() != Some(rustls::ProtocolVersion::TLSv1_3) {
        return Err(Error::other("not a TLS 1.3 session"));
    }
    while conn.wants_write() {
        conn.write_tls(&mut sock)?;
    }
    let mut pending = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match conn.reader().read(&mut chunk) {
            Ok(0) => return Err(bad("the peer closed the session at once")),
            Ok(n) if pending.len() + n > MAX_PENDING => return Err(bad("too much buffered")),
            Ok(n) => pending.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    let secrets = conn
        .dangerous_extract_secrets()
        .map_err(|e| Error::other(format!("TLS secrets: {e}")))?;
    RecordConn::new(sock, secrets, pending)
}
