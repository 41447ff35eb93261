//! Receiving the stream: every channel on its own thread, pages straight
//! into guest memory (each checked against its channel, its address and
//! its hash), probes, and the population of memory before the stream.

use super::sync::SyncProgress;
use crate::hash::{page_hash, ZERO_PAGE};
use crate::session::postcopy;
use crate::stages::{RecvStages, RecvTiming, StageClock, StageObserver};
use crate::stream_error::MigrateError;
use crate::transport::{BoxConn, Connection, ShutdownHandle};
use crate::vm::{GuestRam, SessionVm};
use crate::wire::{
    channel_of, record_name, tag, tag_name, Dec, Enc, Header, Record, WireReader, WireWriter,
    MAX_BATCH, PAGE_SIZE,
};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The destination's guest memory, written directly (no vCPU runs before
/// the resume, and every page belongs to exactly one channel's thread).
pub(super) struct RawMem<'a, R: GuestRam> {
    pub(super) ram: &'a R,
}

impl<R: GuestRam> RawMem<'_, R> {
    /// The page at `off`.
    ///
    /// # Safety
    /// `off` is a page-aligned offset inside guest memory (`page_offset`
    /// checked it lies in one mapping), no vCPU runs, and only the calling
    /// thread accesses this page while the slice lives (the page belongs
    /// to its channel).
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn page(&self, off: u64) -> &mut [u8] {
        let host = self.ram.host_range(off, PAGE_SIZE as u64);
        // The caller's contract: the page was found in guest memory.
        let host = host.expect("a page page_offset found in guest memory");
        // SAFETY: inside a live mapping of the RAM `self` borrows (the
        // caller's contract and GuestRam's), and exclusively this
        // thread's.
        unsafe { std::slice::from_raw_parts_mut(host as *mut u8, PAGE_SIZE) }
    }
}

/// What the receiving threads share.
pub(super) struct ReceiveState<'a, V: SessionVm> {
    pub(super) vm: &'a V,
    pub(super) raw: RawMem<'a, V::Ram>,
    pub(super) channels: u16,
    /// One bit per page: received at least once.
    pub(super) received: Vec<AtomicU64>,
    /// Each page's hash.
    pub(super) hashes: Vec<AtomicU64>,
    /// With verify-full: the memory the guest resumes from.
    pub(super) snapshot: Option<Vec<AtomicU64>>,
    /// Pages taken so far on each channel, for SYNC.
    pub(super) sync: SyncProgress,
}

impl<V: SessionVm> ReceiveState<'_, V> {
    /// Takes the data of the PAGES record just read on `channel` into
    /// guest memory (one vectored read for all its pages), checking each
    /// page; `obs` watches the record, the reader telling it where each
    /// read of the data begins and ends (the stream books the reads and
    /// the rest apart: [`RecvTiming`]).
    pub(super) fn take_pages<R: Read>(
        &self,
        rd: &mut WireReader<R>,
        channel: u16,
        at_byte: u64,
        obs: &mut impl StageObserver<RecvStages>,
    ) -> Result<(), MigrateError> {
        obs.begin(&rd.stages);
        let r = self
            .entry_offsets(rd, channel, at_byte)
            .and_then(|(offs, n)| self.land_pages(rd, &offs[..n], at_byte, obs));
        obs.end(&mut rd.stages);
        if let (Ok(()), Some(t)) = (&r, self.sync.taken.get(usize::from(channel))) {
            t.fetch_add(rd.entries().len() as u64, Ordering::Release);
        }
        rd.stages.pages += rd.entries().len() as u64;
        r
    }

    /// Where each entry of the record just read lands, checked before any
    /// byte does: in guest memory, on its own channel, and not twice in
    /// the record (each page becomes its own slice).
    fn entry_offsets<R: Read>(
        &self,
        rd: &WireReader<R>,
        channel: u16,
        at_byte: u64,
    ) -> Result<([u64; MAX_BATCH], usize), MigrateError> {
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
        Ok((offs, n))
    }

    /// Reads the record's pages into guest memory at `offs` (checked by
    /// [`Self::entry_offsets`]), checking each page's hash as it lands;
    /// `obs` is told of each read.
    fn land_pages<R: Read>(
        &self,
        rd: &mut WireReader<R>,
        offs: &[u64],
        at_byte: u64,
        obs: &mut impl StageObserver<RecvStages>,
    ) -> Result<(), MigrateError> {
        let n = offs.len();
        let mut pages: Vec<&mut [u8]> = Vec::with_capacity(n);
        for (k, e) in rd.entries().iter().enumerate() {
            if !e.zero {
                // SAFETY: `offs[k]` is a page of guest memory (page_offset),
                // the guest does not run before the resume, the page
                // belongs to `channel`, which only this thread reads, and
                // no other slice of this record covers it (no duplicates).
                pages.push(unsafe { self.raw.page(offs[k]) });
            }
        }
        // Each page's hash is checked as it arrives (while in the cache).
        let r = rd.read_checked_pages(&mut pages, at_byte, obs);
        drop(pages);
        if let Err(e) = r {
            self.forget(offs);
            return Err(e);
        }
        self.mark_received(rd, offs);
        Ok(())
    }

    /// After a failed read or check: the pages at `offs` may hold bytes
    /// that were never checked (a short read, a bad page and those after
    /// it: the data lands in guest memory before its hash is checked), so
    /// none of them counts as received any more. Every page still
    /// marked received then holds the bytes its stored hash was checked
    /// against, whatever reads those marks after the failure.
    fn forget(&self, offs: &[u64]) {
        for &off in offs {
            let i = off / PAGE_SIZE as u64;
            self.received[(i / 64) as usize].fetch_and(!(1u64 << (i % 64)), Ordering::Relaxed);
        }
    }

    /// Records the pages at `offs` (the entries of the record just read,
    /// the hashes of their data checked as they were read) as received:
    /// a zero page is written as zeros where an earlier copy landed.
    fn mark_received<R: Read>(&self, rd: &WireReader<R>, offs: &[u64]) {
        for (k, &off) in offs.iter().enumerate() {
            let e = rd.entries()[k];
            let i = off / PAGE_SIZE as u64;
            let bit = 1u64 << (i % 64);
            let seen = self.received[(i / 64) as usize].load(Ordering::Relaxed) & bit != 0;
            // SAFETY: `off` is a page of guest memory that only this
            // thread touches (take_pages's checks); the slices
            // given to the read are gone.
            let page = unsafe { self.raw.page(off) };
            let hash = if e.zero {
                if seen {
                    page.fill(0);
                }
                page_hash(&ZERO_PAGE, e.gpa)
            } else {
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
    }
}

/// Reads a PROBE and drops its bytes; returns its length.
pub(super) fn take_probe<R: Read>(rd: &mut WireReader<R>, h: &Header) -> Result<u64, MigrateError> {
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
pub(super) fn channel_loop<V: SessionVm>(
    rd: &mut WireReader<BoxConn>,
    sh: &ReceiveState<'_, V>,
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
    let mut timing = RecvTiming::default();
    let authenticated = rd.get_mut().authenticates();
    rd.set_authenticated(authenticated);
    loop {
        let at_byte = rd.pos;
        match rd.next_record()? {
            Record::Pages { .. } => sh.take_pages(rd, channel, at_byte, &mut timing)?,
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

/// What the main channel delivered up to its END (or POSTCOPY).
pub(super) struct Received {
    /// Bytes of all channels' link probes.
    pub(super) probe_bytes: u64,
    /// The STATE record's body and where it was, if the stream carried
    /// one (the guest decodes it).
    pub(super) state: Option<(Vec<u8>, u64)>,
    /// When the STATE record came in (the start of the destination's
    /// part of the downtime, see [`super::config::ResumeParts`]).
    pub(super) state_at: Option<Instant>,
    /// Post-copy: the pages still missing (a bitmap).
    pub(super) postcopy_missing: Option<Vec<u64>>,
}

/// Receives every channel at once, the further ones on their own threads,
/// until each one's END; the first error ends the others' connections.
pub(super) fn receive_channels<C: Connection, V: SessionVm>(
    rd: &mut WireReader<&mut C>,
    extras: &mut [WireReader<BoxConn>],
    sh: &ReceiveState<'_, V>,
    header: &Header,
) -> Result<Received, MigrateError> {
    let sockets: Vec<ShutdownHandle> = extras
        .iter_mut()
        .filter_map(|r| r.get_mut().shutdown_handle().ok())
        .collect();
    std::thread::scope(|sc| {
        let (ptx, prx) = std::sync::mpsc::channel();
        let handles: Vec<_> = extras
            .iter_mut()
            .enumerate()
            .map(|(k, r)| {
                let ptx = ptx.clone();
                sc.spawn(move || {
                    let cpu = StageClock::start_with_cpu();
                    let res = channel_loop(r, sh, header, k as u16 + 1, &ptx);
                    r.stages.cpu_ns += cpu.cpu_ns();
                    if res.is_err() {
                        sh.sync.channel_failed.store(true, Ordering::Release);
                        // The source's sender on this channel fails at
                        // once instead of at its write deadline.
                        if let Ok(s) = r.get_mut().shutdown_handle() {
                            s.shutdown();
                        }
                    }
                    res
                })
            })
            .collect();
        drop(ptx);
        let cpu = StageClock::start_with_cpu();
        let main_result = main_channel(rd, sh, header, &prx);
        rd.stages.cpu_ns += cpu.cpu_ns();
        if main_result.is_err() {
            // End the other channels' threads now rather than at their
            // timeouts.
            for s in &sockets {
                s.shutdown();
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
                (Err(m), Err(e)) if super::sync::stopped_for_a_channel(m) => r = Err(e),
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
pub(super) fn main_channel<C: Connection, V: SessionVm>(
    rd: &mut WireReader<&mut C>,
    sh: &ReceiveState<'_, V>,
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
    let mut state_at = None;
    let mut postcopy_missing = None;
    let mut timing = RecvTiming::default();
    let authenticated = rd.get_mut().authenticates();
    rd.set_authenticated(authenticated);
    loop {
        let at_byte = rd.pos;
        match rd.next_record()? {
            Record::Pages { .. } => sh.take_pages(rd, 0, at_byte, &mut timing)?,
            Record::Control {
                tag: t,
                body,
                at_byte,
            } => match t {
                tag::ROUND => {}
                tag::SYNC => super::sync::answer(rd, &sh.sync, sh.vm, &body, at_byte)?,
                tag::STATE => {
                    state = Some((body, at_byte));
                    state_at = Some(Instant::now());
                }
                tag::POSTCOPY if header.postcopy && state.is_some() => {
                    postcopy_missing = Some(postcopy::decode_missing(&body, at_byte, page_count)?);
                    break;
                }
                tag::END => {
                    check_end(&body, at_byte, rd.pages)?;
                    break;
                }
                tag::ABORT => return Err(MigrateError::aborted(&body)),
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
        state_at,
        postcopy_missing,
    })
}

/// Backs all of guest memory with RAM before the stream starts, as QEMU's
/// `-mem-prealloc` and Cloud Hypervisor's `prefault` do: the kernel's
/// page zeroing (and, in a VM, the host's first touch) then does not run
/// inside round 0. 64 MiB at a time with `MADV_POPULATE_WRITE` (touching
/// each page where the kernel lacks it), telling the source every half
/// second that the destination is alive.
pub(super) fn populate<R: Read + Write, V: SessionVm>(
    vm: &V,
    rd: &mut WireReader<R>,
) -> Result<Duration, MigrateError> {
    let t0 = Instant::now();
    let mem = vm.ram();
    let chunk = 64u64 << 20;
    let mut told = t0;
    let mut off = 0u64;
    while let Some((host, span)) = mem.host_span(off) {
        let len = chunk.min(span);
        if len == 0 {
            break; // outside GuestRam's contract: nothing more to populate
        }
        // SAFETY: the range lies inside one of the VM's own live mappings
        // (`host_span`); the advice only faults its pages in (their
        // contents stay zero).
        let r = unsafe {
            libc::madvise(
                host as *mut libc::c_void,
                len as usize,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if r != 0 {
            // Older kernels: touch each page (fresh memory is zero, so is
            // what is written).
            let mut p = off;
            while p < off + len {
                mem.write_from(p, &[0u8; 8]);
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

pub(super) fn page_offset<V: SessionVm>(
    vm: &V,
    gpa: u64,
    at_byte: u64,
) -> Result<u64, MigrateError> {
    match vm.locate(gpa) {
        Some((_, off))
            if gpa.is_multiple_of(PAGE_SIZE as u64)
                && vm.ram().host_range(off, PAGE_SIZE as u64).is_some() =>
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

#[cfg(all(test, feature = "sim"))]
#[path = "receive_tests.rs"]
mod tests;
