//! One vCPU thread: waits for a pass, makes the pass's accesses through its
//! software TLB (faulting into the engine as a hardware exit would), and
//! steps out of guest mode where a pause, a full dirty ring, the throttle or
//! the pace needs it, saving where it was so a pause can resume it.

use super::control::{park, Control, Pacer};
use super::pass::{stamp, Rng, VcpuState, WorkloadConfig, LIVE_EVERY};
use crate::vcpu::{Vcpu, VcpuExit};
use crate::vm::KnownFormat;
use s2mmu::memslot::MemslotStore;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// A vCPU thread's state between and within passes.
struct VcpuLoop<'a, S: MemslotStore, F: KnownFormat> {
    vcpu: &'a mut Vcpu<S, F>,
    idx: usize,
    c: &'a Control,
    /// Guest address of the vCPU's region.
    base: u64,
    /// Pages in the region.
    pages: u64,
    page_size: u64,
    rng: Rng,
    /// Passes made (the current one while it runs).
    pass: u64,
    /// Writes made in the passes finished.
    total_writes: u64,
    /// Writes made in the current pass so far.
    written: u64,
    /// Nanoseconds of guest execution so far.
    guest_ns: u64,
    /// Throttle owed, served in sleeps of at least a millisecond.
    owed_ns: u64,
    pacer: Pacer,
    /// When guest time last started counting.
    mark: Instant,
}

/// Runs vCPU `idx` over its region at `base` until the host stops it;
/// `resume` continues a saved state (a migrated or restored guest).
pub(super) fn vcpu_thread<S: MemslotStore, F: KnownFormat>(
    vcpu: &mut Vcpu<S, F>,
    idx: usize,
    base: u64,
    cfg: WorkloadConfig,
    c: &Control,
    resume: Option<VcpuState>,
) {
    let mut l = VcpuLoop {
        vcpu,
        idx,
        c,
        base,
        pages: cfg.bytes_per_vcpu / cfg.page_size,
        page_size: cfg.page_size,
        rng: Rng(0x9e37_79b9_7f4a_7c15 ^ ((idx as u64 + 1) * 0x1000_0001)),
        pass: 0,
        total_writes: 0,
        written: 0,
        guest_ns: 0,
        owed_ns: 0,
        pacer: Pacer {
            rate: 0,
            since: Instant::now(),
            pages: 0,
        },
        mark: Instant::now(),
    };
    let mut first_page = 0u64;
    if let Some(s) = resume {
        l.pass = s.pass - 1;
        first_page = s.next_page;
        l.rng.0 = s.rng;
        l.total_writes = s.writes;
    }
    while l.wait_for_pass() {
        if !l.run_pass(std::mem::take(&mut first_page)) {
            return;
        }
    }
}

impl<S: MemslotStore, F: KnownFormat> VcpuLoop<'_, S, F> {
    /// Waits (outside guest mode) until the host asks for another pass;
    /// false when it asks the thread to stop instead.
    fn wait_for_pass(&mut self) -> bool {
        let c = self.c;
        let mut spins = 0u32;
        loop {
            if c.stop.load(Ordering::Acquire) {
                self.vcpu.exit();
                return false;
            }
            if c.free_running.load(Ordering::Acquire)
                || c.target.load(Ordering::Acquire) > self.pass
            {
                if park(self.vcpu, self.idx, c) {
                    return true;
                }
                continue;
            }
            self.vcpu.exit();
            spins += 1;
            if spins < 100 {
                std::hint::spin_loop();
            } else {
                // The host unparks vCPUs when it asks for a pass.
                std::thread::park_timeout(Duration::from_millis(1));
            }
        }
    }

    /// One pass from `first_page` on; false when the thread must end
    /// (stopped while parked, or a failed access).
    fn run_pass(&mut self, first_page: u64) -> bool {
        let c = self.c;
        self.pass += 1;
        let t0 = Instant::now();
        self.mark = t0;
        self.written = 0;
        let write_percent = c.write_percent.load(Ordering::Relaxed);
        let random = c.random.load(Ordering::Relaxed);
        for i in first_page..self.pages {
            if c.paused.load(Ordering::Relaxed) && !self.pause_at(i) {
                return false;
            }
            let rng_at_access = self.rng.0;
            let page = if random {
                self.rng.next() % self.pages
            } else {
                i
            };
            let write = write_percent >= 100 || (self.rng.next() % 100) < write_percent;
            if !self.access(page, write, i, rng_at_access) {
                return false;
            }
            self.written += u64::from(write);
            if self.vcpu.accesses.is_multiple_of(LIVE_EVERY) {
                self.publish_live();
            }
            if !self.serve_throttle(i) || !self.keep_pace(i) {
                return false;
            }
        }
        self.finish_pass(t0);
        true
    }

    /// The access to `page` (access `i` of the pass, made with the generator
    /// at `rng_at_access`), redone after a full dirty ring is reset; false
    /// when the thread must end.
    #[inline]
    fn access(&mut self, page: u64, write: bool, i: u64, rng_at_access: u64) -> bool {
        let gpa = self.base + page * self.page_size;
        loop {
            let r = if write {
                self.vcpu.write_u64(gpa, stamp(self.idx, self.pass, page))
            } else {
                self.vcpu.read_u64(gpa).map(|_| ())
            };
            match r {
                Ok(()) => return true,
                Err(VcpuExit::DirtyRingFull) => {
                    if !self.wait_ring_reset(i, rng_at_access) {
                        return false;
                    }
                }
                Err(e) => {
                    self.fail(&e);
                    return false;
                }
            }
        }
    }

    /// KVM_EXIT_DIRTY_RING_FULL: stays out until the host resets the ring,
    /// not counted as running (a pause must not wait). The access is redone
    /// after the reset: a pause meanwhile must resume it, not the next one.
    fn wait_ring_reset(&mut self, i: u64, rng_at_access: u64) -> bool {
        let c = self.c;
        let w = Instant::now();
        self.guest_ns += (w - self.mark).as_nanos() as u64;
        self.save(
            self.pass,
            i,
            rng_at_access,
            self.total_writes + self.written,
        );
        c.running[self.idx].store(false, Ordering::SeqCst);
        c.wake_host();
        while self.vcpu.ring_full() && !c.stop.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_micros(20));
        }
        c.ring_full_wait_ns
            .fetch_add(w.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.resume()
    }

    /// A failed access: reported, and the vCPU marked done for good.
    fn fail(&mut self, e: &VcpuExit) {
        let c = self.c;
        c.errors
            .lock()
            .unwrap()
            .push(format!("vCPU {}: {e}", self.idx));
        self.vcpu.exit();
        c.running[self.idx].store(false, Ordering::SeqCst);
        c.done[self.idx].store(u64::MAX, Ordering::Release);
        c.wake_host();
    }

    /// The host paused the guest before access `i`: saves the state there
    /// and parks; false when stopped while parked.
    fn pause_at(&mut self, i: u64) -> bool {
        self.guest_ns += self.mark.elapsed().as_nanos() as u64;
        let writes = self.total_writes + self.written;
        self.save(self.pass, i, self.rng.0, writes);
        self.c.live[self.idx].publish(self.vcpu, writes, self.guest_ns);
        self.resume()
    }

    /// Publishes the live counters, guest time counted up to now.
    fn publish_live(&mut self) {
        let now = Instant::now();
        self.guest_ns += (now - self.mark).as_nanos() as u64;
        self.mark = now;
        let writes = self.total_writes + self.written;
        self.c.live[self.idx].publish(self.vcpu, writes, self.guest_ns);
    }

    /// The throttle (read per page: a migration raises it mid-pass) is owed
    /// per page and served in sleeps of at least a millisecond outside
    /// guest mode (as QEMU's auto-converge sleeps vCPUs), so a throttled
    /// vCPU leaves the CPU to the host and a pause need not wait for it.
    #[inline]
    fn serve_throttle(&mut self, i: u64) -> bool {
        let throttle = self.c.throttle_ns.load(Ordering::Relaxed);
        if throttle == 0 {
            return true;
        }
        self.owed_ns += throttle;
        if self.owed_ns < 1_000_000 {
            return true;
        }
        self.step_out(i + 1);
        let nap = Duration::from_nanos(std::mem::take(&mut self.owed_ns));
        std::thread::sleep(nap);
        // A throttled vCPU does not catch up with its pace.
        self.pacer.since += nap;
        self.resume()
    }

    /// Ahead of the pace: sleeps outside guest mode, where a pause need not
    /// wait for it. Sleeps shorter than the timer's slack are batched.
    #[inline]
    fn keep_pace(&mut self, i: u64) -> bool {
        let rate = self.c.pace_pages_per_sec.load(Ordering::Relaxed);
        match self.pacer.delay(rate) {
            Some(d) if d >= Duration::from_micros(200) => {
                self.step_out(i + 1);
                std::thread::sleep(d);
                self.resume()
            }
            _ => true,
        }
    }

    /// Leaves guest mode before access `next_page`, saving the state there
    /// and counting the guest time so far.
    fn step_out(&mut self, next_page: u64) {
        self.vcpu.exit();
        self.guest_ns += self.mark.elapsed().as_nanos() as u64;
        let writes = self.total_writes + self.written;
        self.save(self.pass, next_page, self.rng.0, writes);
        self.c.running[self.idx].store(false, Ordering::SeqCst);
    }

    /// Back into guest mode once the host lets it (false: stopped).
    fn resume(&mut self) -> bool {
        if !park(self.vcpu, self.idx, self.c) {
            return false;
        }
        self.mark = Instant::now();
        true
    }

    /// The pass is done: its totals, times and fault counts recorded, and
    /// the host told.
    fn finish_pass(&mut self, t0: Instant) {
        let (c, idx) = (self.c, self.idx);
        self.vcpu.exit();
        self.guest_ns += self.mark.elapsed().as_nanos() as u64;
        self.total_writes += self.written;
        self.save(self.pass + 1, 0, self.rng.0, self.total_writes);
        c.running[idx].store(false, Ordering::SeqCst);
        c.live[idx].publish(self.vcpu, self.total_writes, self.guest_ns);
        c.pages_written[idx].fetch_add(self.written, Ordering::Relaxed);
        c.pass_times.lock().unwrap()[idx].push(t0.elapsed());
        c.fault_stats.lock().unwrap()[idx] = self.vcpu.fault_stats();
        c.done[idx].store(self.pass, Ordering::Release);
        c.wake_host();
    }

    /// Where the vCPU is, for a pause to resume from.
    fn save(&self, pass: u64, next_page: u64, rng: u64, writes: u64) {
        self.c.states.lock().unwrap()[self.idx] = VcpuState {
            pass,
            next_page,
            rng,
            writes,
        };
    }
}
