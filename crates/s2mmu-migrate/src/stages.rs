//! Where a stream's time goes, stage by stage: on the sending
//! side reading guest memory (with the zero-page check, one fused pass),
//! hashing, the writes (encryption plus the socket) and the socket's own
//! system calls; on the receiving side the reads (the socket, decryption
//! and the copy into guest memory), the socket's own system calls and
//! the checks. Encryption is the writes' time less the socket's,
//! decryption and copy the reads' less the socket's: the socket's time
//! is measured in the transport's buffered socket ([`crate::transport::SockBuf`])
//! per thread, so each channel's thread reads its own.
//!
//! A thread's CPU time comes from `/proc/thread-self/schedstat` (Linux),
//! read once at each end of a stretch of work, not per page.

use std::cell::Cell;
use std::time::Instant;

thread_local! {
    /// Nanoseconds this thread spent in socket writes and reads.
    static SOCKET_NS: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// Nanoseconds this thread has spent so far in the transport's socket
/// writes and reads (system calls only: no encryption).
pub fn socket_ns() -> (u64, u64) {
    SOCKET_NS.with(Cell::get)
}

/// Counts a socket call that started at `t0`.
pub(crate) fn count_socket(write: bool, t0: Instant) {
    let ns = t0.elapsed().as_nanos() as u64;
    SOCKET_NS.with(|c| {
        let (w, r) = c.get();
        c.set(if write { (w + ns, r) } else { (w, r + ns) });
    });
}

/// CPU time this thread has used, in nanoseconds (None where the kernel
/// does not say).
///
/// Read with `CLOCK_THREAD_CPUTIME_ID`, which brings the running thread's
/// figure up to date: `/proc/thread-self/schedstat` is only updated at the
/// scheduler's ticks and switches, so a phase shorter than a tick could
/// read as 0 there.
pub fn thread_cpu_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the call writes only it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return None;
    }
    Some(u64::try_from(ts.tv_sec).ok()? * 1_000_000_000 + u64::try_from(ts.tv_nsec).ok()?)
}

/// The sending side's stages, summed over channels.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SendStages {
    /// Reading guest memory into the batch, with the zero-page check.
    pub read_ns: u64,
    /// Hashing the pages.
    pub hash_ns: u64,
    /// The writes of page data and records: encryption plus the socket.
    pub write_ns: u64,
    /// Of the writes, the socket's system calls.
    pub socket_ns: u64,
    /// CPU time of the sending threads (0: not known).
    pub cpu_ns: u64,
    /// Page records sent.
    pub pages: u64,
}

impl SendStages {
    /// Encryption (and the TLS layer's own copies): the writes less the
    /// socket.
    pub fn encrypt_ns(&self) -> u64 {
        self.write_ns.saturating_sub(self.socket_ns)
    }

    /// Adds `o`.
    pub fn add(&mut self, o: &SendStages) {
        self.read_ns += o.read_ns;
        self.hash_ns += o.hash_ns;
        self.write_ns += o.write_ns;
        self.socket_ns += o.socket_ns;
        self.cpu_ns += o.cpu_ns;
        self.pages += o.pages;
    }
}

/// The receiving side's stages, summed over channels.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RecvStages {
    /// Reading page data: the socket, decryption and the copy into guest
    /// memory.
    pub read_ns: u64,
    /// Of the reads, the socket's system calls.
    pub socket_ns: u64,
    /// Checking the pages: hashes, channels, addresses.
    pub check_ns: u64,
    /// CPU time of the receiving threads (0: not known).
    pub cpu_ns: u64,
    /// Page records received.
    pub pages: u64,
}

impl RecvStages {
    /// Decryption and the copy into guest memory: the reads less the
    /// socket.
    pub fn decrypt_copy_ns(&self) -> u64 {
        self.read_ns.saturating_sub(self.socket_ns)
    }

    /// Adds `o`.
    pub fn add(&mut self, o: &RecvStages) {
        self.read_ns += o.read_ns;
        self.socket_ns += o.socket_ns;
        self.check_ns += o.check_ns;
        self.cpu_ns += o.cpu_ns;
        self.pages += o.pages;
    }
}

/// Watches one stretch of the page path (a job of pages sent, a record of
/// pages taken) and books its time to the stages. The path tells it where
/// the stretch begins and ends, and where work inside it that is booked
/// apart begins and ends (the sender's flushes, the receiver's reads); the
/// path itself keeps no clock. `()` watches nothing and costs nothing (a
/// pass outside the stream's stages, such as the verification pass).
pub(crate) trait StageObserver<S> {
    /// A stretch begins; `stages` as they stand.
    fn begin(&mut self, _stages: &S) {}
    /// Work booked apart begins inside the stretch.
    fn inner_begin(&mut self) {}
    /// That work ended.
    fn inner_end(&mut self) {}
    /// The stretch ended; its time goes to `stages`.
    fn end(&mut self, _stages: &mut S) {}
}

impl<S> StageObserver<S> for () {}

/// A stretch's clock and the time of the work inside it booked apart.
#[derive(Default)]
struct Stretch {
    t0: Option<Instant>,
    inner_t0: Option<Instant>,
    inner_ns: u64,
}

impl Stretch {
    fn begin(&mut self) {
        self.t0 = Some(Instant::now());
        self.inner_ns = 0;
    }

    fn inner_begin(&mut self) {
        self.inner_t0 = Some(Instant::now());
    }

    fn inner_end(&mut self) {
        if let Some(t) = self.inner_t0.take() {
            self.inner_ns += t.elapsed().as_nanos() as u64;
        }
    }

    /// The stretch's whole time and its inner work's, once it ended (None
    /// for a stretch that never began).
    fn end(&mut self) -> Option<(u64, u64)> {
        let took = self.t0.take()?.elapsed().as_nanos() as u64;
        Some((took, self.inner_ns.min(took)))
    }
}

/// The sender's reading of guest memory: a job's time less its flushes'
/// (hashing and writing, booked by the writer).
#[derive(Default)]
pub(crate) struct ReadTiming(Stretch);

impl StageObserver<SendStages> for ReadTiming {
    fn begin(&mut self, _: &SendStages) {
        self.0.begin();
    }

    fn inner_begin(&mut self) {
        self.0.inner_begin();
    }

    fn inner_end(&mut self) {
        self.0.inner_end();
    }

    fn end(&mut self, stages: &mut SendStages) {
        if let Some((took, flushes)) = self.0.end() {
            stages.read_ns += took - flushes;
        }
    }
}

/// The receiver's taking of a record of pages: the reads of its data (the
/// reader marks each as inner work) go to the reads, with the socket's
/// system calls among them; the rest (the entries' checks, the pages'
/// hashes and their copies into place) to the checks.
#[derive(Default)]
pub(crate) struct RecvTiming {
    stretch: Stretch,
    socket0: u64,
}

impl StageObserver<RecvStages> for RecvTiming {
    fn begin(&mut self, _: &RecvStages) {
        self.stretch.begin();
        self.socket0 = socket_ns().1;
    }

    fn inner_begin(&mut self) {
        self.stretch.inner_begin();
    }

    fn inner_end(&mut self) {
        self.stretch.inner_end();
    }

    fn end(&mut self, stages: &mut RecvStages) {
        if let Some((took, reads)) = self.stretch.end() {
            stages.read_ns += reads;
            stages.check_ns += took - reads;
            stages.socket_ns += socket_ns().1.saturating_sub(self.socket0);
        }
    }
}

/// Times a stretch of one thread's work: its wall time, its socket time
/// and its CPU time.
#[derive(Clone, Copy, Debug)]
pub struct StageClock {
    t0: Instant,
    socket0: (u64, u64),
    cpu0: Option<u64>,
}

impl StageClock {
    /// Starts now, on this thread.
    pub fn start() -> Self {
        StageClock {
            t0: Instant::now(),
            socket0: socket_ns(),
            cpu0: None,
        }
    }

    /// Starts now, also reading this thread's CPU time (a file read: use
    /// it per stretch of work, not per page).
    pub fn start_with_cpu() -> Self {
        StageClock {
            cpu0: thread_cpu_ns(),
            ..Self::start()
        }
    }

    /// Nanoseconds since the start.
    pub fn wall_ns(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64
    }

    /// Socket (write, read) nanoseconds of this thread since the start.
    pub fn socket_ns(&self) -> (u64, u64) {
        let (w, r) = socket_ns();
        (w - self.socket0.0, r - self.socket0.1)
    }

    /// CPU nanoseconds of this thread since the start (0: not known).
    pub fn cpu_ns(&self) -> u64 {
        match (self.cpu0, thread_cpu_ns()) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_time_is_per_thread_and_cpu_time_grows() {
        let c = StageClock::start_with_cpu();
        count_socket(true, Instant::now() - std::time::Duration::from_millis(5));
        assert!(c.socket_ns().0 >= 5_000_000);
        assert_eq!(c.socket_ns().1, 0);
        let other = std::thread::spawn(socket_ns).join().unwrap();
        assert_eq!(other, (0, 0), "another thread's socket time is its own");
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        if thread_cpu_ns().is_some() {
            assert!(c.cpu_ns() > 0, "a busy loop used CPU");
        }
    }
}
