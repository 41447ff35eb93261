//! Software TLBs for the simulated vCPUs, and the shootdown that makes the
//! engine's invalidations reach every one of them before it goes on.
//!
//! Each vCPU caches stage-2 translations (guest page -> host page, writable
//! or not) in a small direct-mapped [`SoftTlb`]. The engine invalidates
//! through [`TlbShootdown`], which implements [`s2mmu::TlbInvalidate`]: it
//! posts the range to every vCPU's mailbox, bumps the vCPU's request count,
//! and waits until every vCPU that is running guest code has acknowledged.
//! A vCPU checks its request count before each guest access, applies the
//! posted invalidations and acknowledges; a vCPU outside guest code (in a
//! fault handler, or idle) is not waited for, because it checks its
//! requests before it enters guest code again (KVM's vCPU-mode protocol).
//! So once a flush returns, no vCPU can use a translation it removed: a
//! stale writable entry cannot outlive write-protect plus flush, which is
//! what makes dirty logging lose no write.

use crate::sync::{fence, lock, wait_step, Arc, AtomicU64, AtomicU8, Mutex, Ordering};

const OUTSIDE_GUEST: u8 = 0;
const IN_GUEST: u8 = 1;

/// Invalidations posted to a vCPU and not yet applied.
#[derive(Default)]
struct Mailbox {
    ranges: Vec<(u64, u64)>,
    all: bool,
}

/// Posted ranges beyond which a vCPU flushes everything instead.
const MAX_POSTED_RANGES: usize = 32;

/// What a vCPU and the shootdown share.
pub struct VcpuTlbShared {
    mode: AtomicU8,
    requests: AtomicU64,
    acked: AtomicU64,
    mailbox: Mutex<Mailbox>,
    /// Invalidation requests this vCPU applied.
    pub flushes_applied: AtomicU64,
    /// Entries those requests removed.
    pub entries_removed: AtomicU64,
}

impl VcpuTlbShared {
    fn new() -> Self {
        VcpuTlbShared {
            mode: AtomicU8::new(OUTSIDE_GUEST),
            requests: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            mailbox: Mutex::new(Mailbox::default()),
            flushes_applied: AtomicU64::new(0),
            entries_removed: AtomicU64::new(0),
        }
    }
}

/// Counters of a [`TlbShootdown`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShootdownStats {
    /// Invalidation calls (by address, range or whole VMID).
    pub calls: u64,
    /// Whole-VMID flushes among them.
    pub vmid_flushes: u64,
    /// Nanoseconds spent in invalidation calls, waiting for vCPUs included.
    pub time_ns: u64,
    /// vCPUs waited for, summed over calls.
    pub vcpus_waited: u64,
}

/// The engine's TLB-invalidation backend for simulated vCPUs.
pub struct TlbShootdown {
    page_shift: u32,
    vcpus: Mutex<Vec<Arc<VcpuTlbShared>>>,
    calls: AtomicU64,
    vmid_flushes: AtomicU64,
    time_ns: AtomicU64,
    vcpus_waited: AtomicU64,
}

impl TlbShootdown {
    /// A shootdown with no vCPU yet, for tables with `2^page_shift`-byte
    /// pages.
    pub fn new(page_shift: u32) -> Self {
        TlbShootdown {
            page_shift,
            vcpus: Mutex::new(Vec::new()),
            calls: AtomicU64::new(0),
            vmid_flushes: AtomicU64::new(0),
            time_ns: AtomicU64::new(0),
            vcpus_waited: AtomicU64::new(0),
        }
    }

    /// The most entries a vCPU's software TLB holds (2^20, 24 MiB): far
    /// beyond any hardware TLB, and small enough that its size cannot overflow.
    pub const MAX_ENTRIES: usize = 1 << 20;

    /// Registers a vCPU and returns its TLB of `entries` entries, rounded up
    /// to a power of two and kept within 1..=[`Self::MAX_ENTRIES`].
    pub fn register(&self, entries: usize) -> SoftTlb {
        let shared = Arc::new(VcpuTlbShared::new());
        lock(&self.vcpus).push(shared.clone());
        SoftTlb::new(shared, entries, self.page_shift)
    }

    /// Counters so far.
    pub fn stats(&self) -> ShootdownStats {
        ShootdownStats {
            calls: self.calls.load(Ordering::Relaxed),
            vmid_flushes: self.vmid_flushes.load(Ordering::Relaxed),
            time_ns: self.time_ns.load(Ordering::Relaxed),
            vcpus_waited: self.vcpus_waited.load(Ordering::Relaxed),
        }
    }

    /// Posts `range` (or everything, for `None`) to every vCPU and waits for
    /// the running ones to apply it.
    fn shoot(&self, range: Option<(u64, u64)>) {
        let t0 = std::time::Instant::now();
        self.calls.fetch_add(1, Ordering::Relaxed);
        if range.is_none() {
            self.vmid_flushes.fetch_add(1, Ordering::Relaxed);
        }
        let vcpus = lock(&self.vcpus).clone();
        let mut wait = Vec::with_capacity(vcpus.len());
        for v in &vcpus {
            let seq = {
                let mut mb = lock(&v.mailbox);
                match range {
                    Some(r) if !mb.all && mb.ranges.len() < MAX_POSTED_RANGES => mb.ranges.push(r),
                    _ => {
                        mb.all = true;
                        mb.ranges.clear();
                    }
                }
                v.requests.fetch_add(1, Ordering::Release) + 1
            };
            wait.push(seq);
        }
        // Pairs with the fence in `SoftTlb::enter_guest`: either the vCPU
        // sees the request when it enters, or we see it in guest mode.
        fence(Ordering::SeqCst);
        let mut waited = 0;
        for (v, seq) in vcpus.iter().zip(wait) {
            let mut spins = 0u32;
            while v.mode.load(Ordering::SeqCst) == IN_GUEST && v.acked.load(Ordering::Acquire) < seq
            {
                if spins == 0 {
                    waited += 1;
                }
                wait_step(spins);
                spins += 1;
            }
        }
        self.vcpus_waited.fetch_add(waited, Ordering::Relaxed);
        self.time_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}

impl s2mmu::TlbInvalidate for TlbShootdown {
    /// After a permission relaxation nothing needs invalidating: a vCPU
    /// whose TLB holds the old, stricter entry misses on the access it
    /// lacks and walks the table again (what a spurious fault does on
    /// hardware). So no other vCPU is disturbed.
    fn flush_ipa_local(&self, _ipa: u64, _level: Option<u32>) {}

    fn flush_ipa(&self, ipa: u64, level: Option<u32>) {
        // By-IPA invalidation removes the entry at its level: with the
        // level hint that is the whole block (the TLB caches pages of it).
        let bits = self.page_shift - 3;
        let size = match level {
            Some(l) if l <= 3 => 1u64 << (bits * (3 - l) + self.page_shift),
            _ => 1 << self.page_shift,
        };
        let base = ipa & !(size - 1);
        self.shoot(Some((base, base + size)));
    }
    fn flush_range(&self, ipa: u64, size: u64) {
        self.shoot(Some((ipa, ipa.saturating_add(size))));
    }
    fn flush_vmid(&self) {
        self.shoot(None);
    }
}

#[derive(Clone, Copy, Default)]
struct Entry {
    /// Guest page number + 1 (0 = invalid).
    tag: u64,
    host_page: u64,
    writable: bool,
}

/// Counters of one vCPU's TLB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TlbStats {
    /// Lookups that hit.
    pub hits: u64,
    /// Lookups that missed (each is a table walk).
    pub misses: u64,
    /// Entries filled.
    pub fills: u64,
}

/// One vCPU's software TLB.
pub struct SoftTlb {
    shared: Arc<VcpuTlbShared>,
    entries: Box<[Entry]>,
    page_shift: u32,
    seen: u64,
    stats: TlbStats,
}

impl SoftTlb {
    fn new(shared: Arc<VcpuTlbShared>, entries: usize, page_shift: u32) -> Self {
        let n = entries
            .clamp(1, TlbShootdown::MAX_ENTRIES)
            .next_power_of_two();
        SoftTlb {
            shared,
            entries: vec![Entry::default(); n].into_boxed_slice(),
            page_shift,
            seen: 0,
            stats: TlbStats::default(),
        }
    }

    /// What this vCPU shares with the shootdown.
    pub fn shared(&self) -> &Arc<VcpuTlbShared> {
        &self.shared
    }

    /// Counters so far.
    pub fn stats(&self) -> TlbStats {
        self.stats
    }

    /// Marks the vCPU as running guest code and applies pending requests.
    /// Call before the first access after [`SoftTlb::exit_guest`].
    #[inline]
    pub fn enter_guest(&mut self) {
        // Dekker with `TlbShootdown::shoot`: store, full fence, load on both
        // sides, so the fence alone orders the store (one barrier, not two).
        self.shared.mode.store(IN_GUEST, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.check_requests();
    }

    /// Marks the vCPU as outside guest code (fault handling, idle), so
    /// invalidations do not wait for it.
    #[inline]
    pub fn exit_guest(&mut self) {
        self.shared.mode.store(OUTSIDE_GUEST, Ordering::Release);
    }

    /// Applies posted invalidations. Call before every guest access.
    #[inline]
    pub fn check_requests(&mut self) {
        if self.shared.requests.load(Ordering::Acquire) != self.seen {
            self.apply_requests();
        }
    }

    #[cold]
    fn apply_requests(&mut self) {
        let (seq, mb) = {
            let mut mb = lock(&self.shared.mailbox);
            let seq = self.shared.requests.load(Ordering::Acquire);
            (seq, std::mem::take(&mut *mb))
        };
        let mut removed = 0u64;
        if mb.all {
            for e in self.entries.iter_mut() {
                removed += (e.tag != 0) as u64;
                *e = Entry::default();
            }
        } else {
            for e in self.entries.iter_mut() {
                if e.tag == 0 {
                    continue;
                }
                let ipa = (e.tag - 1) << self.page_shift;
                if mb.ranges.iter().any(|&(s, end)| ipa >= s && ipa < end) {
                    *e = Entry::default();
                    removed += 1;
                }
            }
        }
        self.seen = seq;
        self.shared.flushes_applied.fetch_add(1, Ordering::Relaxed);
        self.shared
            .entries_removed
            .fetch_add(removed, Ordering::Relaxed);
        self.shared.acked.store(seq, Ordering::Release);
    }

    #[inline]
    fn slot(&self, page: u64) -> usize {
        (page as usize) & (self.entries.len() - 1)
    }

    /// The host address for `gpa` if the TLB holds a translation allowing
    /// the access.
    #[inline]
    pub fn lookup(&mut self, gpa: u64, write: bool) -> Option<u64> {
        let page = gpa >> self.page_shift;
        let e = self.entries[self.slot(page)];
        if e.tag == page + 1 && (e.writable || !write) {
            self.stats.hits += 1;
            Some(e.host_page + (gpa & ((1 << self.page_shift) - 1)))
        } else {
            self.stats.misses += 1;
            None
        }
    }

    /// Caches the translation of the page holding `gpa`.
    #[inline]
    pub fn fill(&mut self, gpa: u64, host_addr: u64, writable: bool) {
        let page = gpa >> self.page_shift;
        let mask = (1u64 << self.page_shift) - 1;
        let i = self.slot(page);
        self.entries[i] = Entry {
            tag: page + 1,
            host_page: host_addr & !mask,
            writable,
        };
        self.stats.fills += 1;
    }

    /// The log2 of the page size it caches translations of.
    pub fn page_shift(&self) -> u32 {
        self.page_shift
    }

    /// Number of valid entries.
    pub fn valid_entries(&self) -> usize {
        self.entries.iter().filter(|e| e.tag != 0).count()
    }
}

impl Drop for SoftTlb {
    fn drop(&mut self) {
        // A dropped vCPU never runs guest code again: never wait for it.
        self.shared.mode.store(OUTSIDE_GUEST, Ordering::SeqCst);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use s2mmu::TlbInvalidate;

    #[test]
    fn fill_lookup_and_permission() {
        let sd = TlbShootdown::new(12);
        let mut t = sd.register(64);
        t.enter_guest();
        assert_eq!(t.lookup(0x5123, false), None);
        t.fill(0x5123, 0x7000_0000, false);
        assert_eq!(t.lookup(0x5ff8, false), Some(0x7000_0ff8));
        assert_eq!(
            t.lookup(0x5000, true),
            None,
            "read-only entry refuses writes"
        );
    }

    #[test]
    fn flush_reaches_a_running_vcpu_before_returning() {
        let sd = Arc::new(TlbShootdown::new(12));
        let mut t = sd.register(64);
        t.enter_guest();
        t.fill(0x1000, 0x9000, true);
        t.fill(0x2000, 0xa000, true);
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        std::thread::scope(|s| {
            let sd2 = sd.clone();
            let done2 = done.clone();
            s.spawn(move || {
                sd2.flush_range(0x1000, 0x1000);
                done2.store(true, Ordering::SeqCst);
            });
            // The flusher waits for us: it cannot have returned before we
            // applied the request.
            let mut applied = false;
            while !applied {
                assert!(!done.load(Ordering::SeqCst) || applied);
                if t.shared.requests.load(Ordering::Acquire) != 0 {
                    assert!(!done.load(Ordering::SeqCst));
                    t.check_requests();
                    applied = true;
                }
                std::hint::spin_loop();
            }
        });
        assert!(done.load(Ordering::SeqCst));
        assert_eq!(t.lookup(0x1000, false), None);
        assert_eq!(t.lookup(0x2000, true), Some(0xa000));
        assert_eq!(sd.stats().calls, 1);
    }

    #[test]
    fn vcpu_outside_guest_is_not_waited_for_but_applies_on_entry() {
        let sd = TlbShootdown::new(12);
        let mut t = sd.register(64);
        t.enter_guest();
        t.fill(0x1000, 0x9000, true);
        t.exit_guest();
        sd.flush_vmid();
        assert_eq!(sd.stats().vcpus_waited, 0);
        assert_eq!(t.valid_entries(), 1, "not applied while outside");
        t.enter_guest();
        assert_eq!(t.valid_entries(), 0);
        assert_eq!(t.shared().entries_removed.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn many_ranges_degrade_to_a_full_flush() {
        let sd = TlbShootdown::new(12);
        let mut t = sd.register(64);
        for i in 0..40u64 {
            t.fill(i << 12, 0x10_0000 + (i << 12), true);
        }
        for i in 0..40u64 {
            sd.flush_range((100 + i) << 12, 4096);
        }
        t.enter_guest();
        assert_eq!(
            t.valid_entries(),
            0,
            "too many posted ranges flush everything"
        );
    }
}
