//! The floor under a migration's round 0: plain TCP moving one memory
//! region into another, over loopback, with nothing else in the path.
//!
//! The plain-TCP probe ([`super::plain_probe`]) and iperf3 write from a
//! 128 KiB buffer that stays in the cache and read into another. A
//! migration cannot: it reads every page of the guest's memory once (cold)
//! and writes every page of the destination's once (cold). This probe
//! moves a region of the guest's size the way a migration must, with the
//! kernel's two copies only: the source's `write` reads the region, the
//! destination's `read` writes straight into a prefaulted region of the
//! same size. No framing, no hash, no zero-page check. With
//! [`FloorCipher::Aes128Gcm`] it adds only what TLS 1.3 must add: each
//! 16 KiB is sealed with ring's AES-128-GCM (the AEAD rustls and the
//! record layer use) into a reused buffer and written as one record; the
//! destination reads each record into a reused buffer, opens it in place
//! and copies the plaintext into its region.
//!
//! So a migration's round 0 can at best reach this figure: what it adds
//! (the stream's records and checks, the dirty log, the guest) comes on
//! top. Both regions are anonymous memory advised for transparent huge
//! pages, the simulated guest's default backing. What arrived is compared
//! with what was sent after the clock stops.

use crate::host::available_memory;
use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use s2mmu_migrate::stages::thread_cpu_ns;
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::transport::configure;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Barrier;
use std::time::{Duration, Instant};

/// The largest region the probe moves (it holds two of them).
pub const MAX_FLOOR_BYTES: u64 = 16 << 30;
/// Connections one probe may open.
pub const MAX_FLOOR_CHANNELS: u16 = 64;
/// Bytes of each write and read without a cipher: iperf3's default, as the
/// plain probe's.
const CHUNK: usize = 128 << 10;
/// Bytes of each write and read with a cipher: 32 records, as the record
/// layer's reads of 512 KiB (its writes are of up to 64 records).
const SEALED_CHUNK: usize = 32 << 14;
/// Plaintext bytes of one sealed record (TLS 1.3's largest).
const RECORD_PLAIN: usize = 1 << 14;
/// A record on the wire: header, plaintext, inner content type, tag.
const RECORD_WIRE: usize = 5 + RECORD_PLAIN + 1 + 16;
/// Bytes each connection moves from and to cached buffers before the
/// clock starts (the plain probe's warm-up: fresh sockets read slower).
const WARMUP: usize = 32 << 20;
/// Host page size the figures are per.
const PAGE: u64 = 4096;
/// Alignment of each region, so its huge pages line up.
const HUGE: usize = 2 << 20;

/// What the probe adds to the kernel's copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloorCipher {
    /// Nothing: plain TCP.
    None,
    /// AES-128-GCM records of 16 KiB, sealed and opened by ring.
    Aes128Gcm,
}

/// One run of the probe.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FloorLink {
    /// Bytes moved (the region's size).
    pub bytes: u64,
    /// Connections at once.
    pub channels: u16,
    /// What was added to the copies.
    pub cipher: FloorCipher,
    /// From the first write to the last byte in the destination region.
    pub elapsed: Duration,
    /// CPU time of the sending threads in the timed phase, summed.
    pub send_cpu_ns: u64,
    /// CPU time of the receiving threads in the timed phase, summed.
    pub recv_cpu_ns: u64,
}

impl FloorLink {
    /// Bytes per second.
    pub fn bytes_per_s(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    /// The senders' CPU a 4 KiB page.
    pub fn send_ns_per_page(&self) -> f64 {
        self.send_cpu_ns as f64 / (self.bytes / PAGE).max(1) as f64
    }
    /// The receivers' CPU a 4 KiB page.
    pub fn recv_ns_per_page(&self) -> f64 {
        self.recv_cpu_ns as f64 / (self.bytes / PAGE).max(1) as f64
    }
}

/// A zeroed, prefaulted region of `len` bytes, advised for huge pages
/// before its first touch.
struct Region {
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl Region {
    fn new(len: usize) -> Result<Region, MigrateError> {
        let mut buf: Vec<u8> = Vec::new();
        buf.try_reserve_exact(len + HUGE).map_err(|_| {
            MigrateError::Setup(format!("memory floor: no memory for a {len}-byte region"))
        })?;
        let start = buf.as_ptr().align_offset(HUGE).min(HUGE);
        // SAFETY: madvise only advises the kernel about pages of this
        // process; the range lies inside the allocation just reserved
        // (start + len <= len + HUGE bytes), which nothing else uses yet.
        // Its result is ignored: without huge pages the probe still runs.
        unsafe {
            libc::madvise(buf.as_mut_ptr().add(start).cast(), len, libc::MADV_HUGEPAGE);
        }
        // Touches every page: the destination's region is prefaulted, as
        // the migration's destination memory is.
        buf.resize(len + HUGE, 0);
        Ok(Region { buf, start, len })
    }
    fn bytes(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

/// Moves a region of `bytes` over `channels` loopback connections at once
/// (each its own contiguous share), after an untimed warm-up of each
/// connection, and checks that the destination region equals the source.
///
/// # Errors
/// [`MigrateError::Setup`] for a size or count out of bounds, two regions
/// larger than the machine's available memory, or a region that cannot be
/// allocated, [`MigrateError::Io`] / [`MigrateError::Timeout`]
/// from the sockets (every read and write has `io_timeout`), and
/// [`MigrateError::Malformed`] when the destination region differs.
pub fn memory_floor(
    channels: u16,
    bytes: u64,
    cipher: FloorCipher,
    io_timeout: Duration,
) -> Result<FloorLink, MigrateError> {
    if channels == 0 || channels > MAX_FLOOR_CHANNELS {
        return Err(MigrateError::Setup(format!(
            "memory floor over {channels} connections (1 to {MAX_FLOOR_CHANNELS})"
        )));
    }
    let share_unit = RECORD_PLAIN as u64 * u64::from(channels);
    if bytes == 0 || bytes > MAX_FLOOR_BYTES || !bytes.is_multiple_of(share_unit) {
        return Err(MigrateError::Setup(format!(
            "memory floor of {bytes} bytes over {channels} connections (a multiple of {share_unit}, at most {MAX_FLOOR_BYTES})"
        )));
    }
    // Refused before allocating where the two regions would not fit,
    // rather than left to the out-of-memory killer.
    if let Some(avail) = available_memory() {
        if bytes.saturating_mul(2) > avail {
            return Err(MigrateError::Setup(format!(
                "memory floor of {bytes} bytes needs two regions of that size; the machine has {avail} bytes available"
            )));
        }
    }
    let len = bytes as usize;
    let mut src = Region::new(len)?;
    fill(src.bytes_mut());
    let mut dst = Region::new(len)?;
    let (send, recv) = connect(channels, io_timeout)?;
    let t = move_region(src.bytes(), dst.bytes_mut(), send, recv, cipher)?;
    if let Some(at) = first_difference(src.bytes(), dst.bytes()) {
        return Err(MigrateError::Malformed {
            record: "memory floor",
            at_byte: at as u64,
            why: "the destination region differs from the source".into(),
        });
    }
    Ok(FloorLink {
        bytes,
        channels,
        cipher,
        elapsed: t.0,
        send_cpu_ns: t.1,
        recv_cpu_ns: t.2,
    })
}

/// Data no page of which is zero or repeats its neighbour.
fn fill(b: &mut [u8]) {
    for (i, w) in b.chunks_exact_mut(8).enumerate() {
        let v = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        w.copy_from_slice(&v.to_le_bytes());
    }
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    let step = 1 << 20;
    let chunk = a
        .chunks(step)
        .zip(b.chunks(step))
        .position(|(x, y)| x != y)?;
    let off = chunk * step;
    a[off..]
        .iter()
        .zip(&b[off..])
        .position(|(x, y)| x != y)
        .map(|i| off + i)
}

/// `channels` connected pairs over loopback, each configured as the
/// migration's (deadlines, keepalive, `TCP_NODELAY`).
fn connect(
    channels: u16,
    io_timeout: Duration,
) -> Result<(Vec<TcpStream>, Vec<TcpStream>), MigrateError> {
    let io = |e: std::io::Error| MigrateError::io("the memory floor's loopback connections", &e);
    let l = TcpListener::bind("127.0.0.1:0").map_err(io)?;
    let addr = l.local_addr().map_err(io)?;
    let (mut send, mut recv) = (Vec::new(), Vec::new());
    for _ in 0..channels {
        let s = TcpStream::connect_timeout(&addr, io_timeout).map_err(io)?;
        // The connect has completed, so the accept does not wait.
        let (r, _) = l.accept().map_err(io)?;
        configure(&s, io_timeout)?;
        configure(&r, io_timeout)?;
        send.push(s);
        recv.push(r);
    }
    Ok((send, recv))
}

/// Runs each connection's sender and receiver on threads of their own;
/// the clock runs from the meeting after the warm-ups to the last
/// receiver's end. Returns the time and the timed CPU of both sides.
fn move_region(
    src: &[u8],
    dst: &mut [u8],
    send: Vec<TcpStream>,
    recv: Vec<TcpStream>,
    cipher: FloorCipher,
) -> Result<(Duration, u64, u64), MigrateError> {
    let n = send.len();
    let share = src.len() / n;
    let key = floor_key(cipher)?;
    let met = Barrier::new(2 * n + 1);
    let io = |e: std::io::Error| MigrateError::io("the memory floor", &e);
    std::thread::scope(|sc| {
        let mut hs = Vec::new();
        for ((s, from), (r, to)) in send
            .into_iter()
            .zip(src.chunks(share))
            .zip(recv.into_iter().zip(dst.chunks_mut(share)))
        {
            let (met, key) = (&met, key.as_ref());
            hs.push(sc.spawn(move || {
                let mut end = End::new(s, key);
                side(met, |warm| match warm {
                    true => end.send_warmup(),
                    false => from.chunks(end.chunk()).try_for_each(|p| end.send(p)),
                })
            }));
            hs.push(sc.spawn(move || {
                let mut end = End::new(r, key);
                side(met, |warm| match warm {
                    true => end.recv_warmup(),
                    false => to.chunks_mut(end.chunk()).try_for_each(|p| end.recv(p)),
                })
            }));
        }
        met.wait();
        let t0 = Instant::now();
        let (mut cpu_send, mut cpu_recv) = (0, 0);
        for (i, h) in hs.into_iter().enumerate() {
            let cpu = h
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("a floor thread panicked")))
                .map_err(io)?;
            if i % 2 == 0 {
                cpu_send += cpu;
            } else {
                cpu_recv += cpu;
            }
        }
        Ok((t0.elapsed(), cpu_send, cpu_recv))
    })
}

/// One connection's end: `run(true)`, the warm-up, the meeting, then
/// `run(false)`, the timed phase; returns the timed phase's CPU time. A
/// failed warm-up still meets the others, so the meeting always ends.
fn side(met: &Barrier, mut run: impl FnMut(bool) -> std::io::Result<()>) -> std::io::Result<u64> {
    let warm = run(true);
    met.wait();
    warm?;
    let c0 = thread_cpu_ns().unwrap_or(0);
    run(false)?;
    Ok(thread_cpu_ns().unwrap_or(0).saturating_sub(c0))
}

/// One end of a connection: its socket, the cipher's key and sequence
/// number, and the reused buffer records are sealed and opened in.
struct End<'k> {
    sock: TcpStream,
    key: Option<&'k LessSafeKey>,
    seq: u64,
    wire: Vec<u8>,
}

impl<'k> End<'k> {
    fn new(sock: TcpStream, key: Option<&'k LessSafeKey>) -> Self {
        let wire = Vec::with_capacity(SEALED_CHUNK / RECORD_PLAIN * RECORD_WIRE);
        End {
            sock,
            key,
            seq: 0,
            wire,
        }
    }

    /// Bytes moved per write or read.
    fn chunk(&self) -> usize {
        if self.key.is_some() {
            SEALED_CHUNK
        } else {
            CHUNK
        }
    }

    fn nonce(&mut self) -> Nonce {
        let mut n = [0u8; aead::NONCE_LEN];
        n[4..].copy_from_slice(&self.seq.to_be_bytes());
        self.seq += 1;
        Nonce::assume_unique_for_key(n)
    }

    /// Writes `piece` (at most [`End::chunk`] bytes): as it is, or sealed in
    /// records of 16 KiB, all with one write.
    fn send(&mut self, piece: &[u8]) -> std::io::Result<()> {
        let Some(key) = self.key else {
            return self.sock.write_all(piece);
        };
        let mut wire = std::mem::take(&mut self.wire);
        wire.clear();
        for rec in piece.chunks(RECORD_PLAIN) {
            let len = (rec.len() + 1 + 16) as u16;
            let header = [0x17, 3, 3, (len >> 8) as u8, len as u8];
            wire.extend_from_slice(&header);
            let at = wire.len();
            wire.extend_from_slice(rec);
            wire.push(0x17);
            let nonce = self.nonce();
            let tag = key
                .seal_in_place_separate_tag(nonce, Aad::from(header), &mut wire[at..])
                .map_err(|_| std::io::Error::other("memory floor: sealing failed"))?;
            wire.extend_from_slice(tag.as_ref());
        }
        let r = self.sock.write_all(&wire);
        self.wire = wire;
        r
    }

    /// Reads `piece` (at most [`End::chunk`] bytes, a multiple of 16 KiB with a
    /// cipher): straight into it, or as records opened in the reused
    /// buffer whose plaintext is then copied into it.
    fn recv(&mut self, piece: &mut [u8]) -> std::io::Result<()> {
        let Some(key) = self.key else {
            return self.sock.read_exact(piece);
        };
        let records = piece.len() / RECORD_PLAIN;
        let mut wire = std::mem::take(&mut self.wire);
        wire.resize(records * RECORD_WIRE, 0);
        let r = self.sock.read_exact(&mut wire);
        let r = r.and_then(|()| {
            for (rec, out) in wire
                .chunks_exact_mut(RECORD_WIRE)
                .zip(piece.chunks_mut(RECORD_PLAIN))
            {
                let header: [u8; 5] = rec[..5].try_into().unwrap_or_default();
                let nonce = self.nonce();
                let plain = key
                    .open_in_place(nonce, Aad::from(header), &mut rec[5..])
                    .map_err(|_| std::io::Error::other("memory floor: a record did not open"))?;
                if plain.len() != RECORD_PLAIN + 1 || plain[RECORD_PLAIN] != 0x17 {
                    return Err(std::io::Error::other(
                        "memory floor: a record of the wrong size",
                    ));
                }
                out.copy_from_slice(&plain[..RECORD_PLAIN]);
            }
            Ok(())
        });
        self.wire = wire;
        r
    }

    /// [`WARMUP`] bytes from a cached buffer.
    fn send_warmup(&mut self) -> std::io::Result<()> {
        let filler: Vec<u8> = (0..self.chunk() as u32)
            .map(|i| (i * 7 + 1) as u8)
            .collect();
        (0..WARMUP / self.chunk()).try_for_each(|_| self.send(&filler))
    }

    /// [`WARMUP`] bytes into a cached buffer.
    fn recv_warmup(&mut self) -> std::io::Result<()> {
        let mut sink = vec![0u8; self.chunk()];
        (0..WARMUP / self.chunk()).try_for_each(|_| self.recv(&mut sink))
    }
}

fn floor_key(cipher: FloorCipher) -> Result<Option<LessSafeKey>, MigrateError> {
    match cipher {
        FloorCipher::None => Ok(None),
        FloorCipher::Aes128Gcm => {
            // A fixed key: the probe measures the cipher's cost, it protects
            // nothing (its bytes are its own filler).
            let k = UnboundKey::new(&aead::AES_128_GCM, &[0x5a; 16])
                .map_err(|_| MigrateError::Setup("memory floor: AES-128-GCM key".into()))?;
            Ok(Some(LessSafeKey::new(k)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(20);

    #[test]
    fn moves_the_region_intact_over_each_cipher_and_several_connections() {
        for cipher in [FloorCipher::None, FloorCipher::Aes128Gcm] {
            for ch in [1u16, 3] {
                let bytes = 48 * RECORD_PLAIN as u64 * u64::from(ch);
                let f = memory_floor(ch, bytes, cipher, T).expect("probe");
                assert_eq!((f.bytes, f.channels, f.cipher), (bytes, ch, cipher));
                assert!(f.bytes_per_s() > 0.0);
            }
        }
    }

    #[test]
    fn two_regions_larger_than_the_available_memory_are_refused() {
        let avail = available_memory().expect("/proc/meminfo");
        let unit = RECORD_PLAIN as u64;
        let bytes = (avail / 2 / unit + 1) * unit;
        if bytes <= MAX_FLOOR_BYTES {
            let e = memory_floor(1, bytes, FloorCipher::None, T).unwrap_err();
            assert!(e.to_string().contains("available"), "{e}");
        }
    }

    #[test]
    fn a_difference_is_found_where_it_is() {
        let a = vec![7u8; 3 << 20];
        let mut b = a.clone();
        assert_eq!(first_difference(&a, &b), None);
        b[(2 << 20) + 5] = 0;
        assert_eq!(first_difference(&a, &b), Some((2 << 20) + 5));
    }

    #[test]
    fn the_filler_has_no_zero_or_repeated_page() {
        let mut b = vec![0u8; 64 << 10];
        fill(&mut b);
        let pages: Vec<&[u8]> = b.chunks(PAGE as usize).collect();
        assert!(pages.iter().all(|p| p.iter().any(|&x| x != 0)));
        assert!(pages.windows(2).all(|w| w[0] != w[1]));
    }

    #[test]
    fn sizes_and_counts_out_of_bounds_are_refused_before_allocating() {
        let unit = RECORD_PLAIN as u64;
        for (ch, bytes) in [
            (0, unit),
            (MAX_FLOOR_CHANNELS + 1, unit * 65),
            (1, 0),
            (1, unit + 4096),
            (2, unit),
            (1, MAX_FLOOR_BYTES + unit),
        ] {
            let e = memory_floor(ch, bytes, FloorCipher::None, T).unwrap_err();
            assert!(matches!(e, MigrateError::Setup(_)), "{ch} {bytes}: {e}");
        }
    }
}
