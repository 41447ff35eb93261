//! The MMU lock: a reader-writer lock whose fault-path readers scale.
//!
//! KVM's `mmu_lock` is a queued rwlock: every reader adds to one shared
//! count, so with several vCPUs on the dirty-logging fast path that count's
//! cache line moves between CPUs on every fault, and the move costs more
//! than the compare-and-swap the fast path exists for. [`MmuLock`] keeps
//! such an rwlock for writers and for readers that are not vCPUs, and gives
//! each vCPU a reader slot of its own, on a cache line of its own (BRAVO:
//! Dice and Kogan, "BRAVO: Biased Locking for Reader-Writer Locks", USENIX
//! ATC 2019):
//!
//! - while the lock is *biased*, a vCPU reads by setting its slot and then
//!   checking that the bias is still on; it writes no line another CPU
//!   reads on its path, and reads one (the bias) that only writers change;
//! - a writer takes the rwlock for writing, turns the bias off, and waits
//!   until every slot is clear; a vCPU that finds the bias off reads through
//!   the rwlock like any other reader;
//! - the bias comes back after [`REBIAS_AFTER`] vCPU reads through the
//!   rwlock with no write between them, so phases with many writes (split on
//!   fault, the write-lock baseline) pay no revocations, and phases of reads
//!   (the dirty-logging fast path) run on the slots.
//!
//! Ordering: a slot reader stores its slot, then a sequentially consistent
//! fence, then loads the bias; a writer stores the bias, then a fence, then
//! loads the slots (Dekker's pattern): of the two fences one comes first,
//! and the side after it sees the other's store. A reader that saw the bias
//! on is therefore seen by the writer, which waits for it; a reader that the
//! writer did not see saw the bias off. (Fences rather than sequentially
//! consistent accesses: the same cost on x86, and what loom can check.)

use crate::sync::{DefaultPlatform, Platform, Stopwatch};
use alloc::boxed::Box;
use core::cell::UnsafeCell;
use core::marker::PhantomData;
use core::ops::{Deref, DerefMut};
#[cfg(not(loom))]
use core::sync::atomic::{fence, AtomicBool, AtomicU32, Ordering};
#[cfg(loom)]
use loom::sync::atomic::{fence, AtomicBool, AtomicU32, Ordering};

/// The shared rwlock: the platform's raw lock (loom's under loom).
#[cfg(not(loom))]
type SharedRw<P> = lock_api::RwLock<<P as Platform>::RawRwLock, ()>;
#[cfg(not(loom))]
type SharedRead<'a, P> = lock_api::RwLockReadGuard<'a, <P as Platform>::RawRwLock, ()>;
#[cfg(not(loom))]
type SharedWrite<'a, P> = lock_api::RwLockWriteGuard<'a, <P as Platform>::RawRwLock, ()>;
#[cfg(loom)]
type SharedRw<P> = (loom::sync::RwLock<()>, PhantomData<P>);
#[cfg(loom)]
type SharedRead<'a, P> = (loom::sync::RwLockReadGuard<'a, ()>, PhantomData<P>);
#[cfg(loom)]
type SharedWrite<'a, P> = (loom::sync::RwLockWriteGuard<'a, ()>, PhantomData<P>);

/// vCPU reads through the shared rwlock, with no write between them, after
/// which the lock is biased towards the slots again.
#[cfg(not(loom))]
pub const REBIAS_AFTER: u32 = 64;
/// Small under loom, so a model reaches the re-bias.
#[cfg(loom)]
pub const REBIAS_AFTER: u32 = 2;

/// One vCPU's reader slot, alone on its cache line (128 bytes: adjacent-line
/// prefetchers pull lines in pairs).
#[repr(align(128))]
///
/// A count, not a flag: nothing stops safe code from reading through one
/// slot from two threads (or twice from one), and a writer must wait for
/// every such reader, not for the first to leave.
struct ReaderSlot(AtomicU32);

/// A reader-writer lock around `T` whose vCPU readers use per-vCPU slots
/// while no writer is around (see the module documentation).
pub struct MmuLock<T, P: Platform = DefaultPlatform> {
    rw: SharedRw<P>,
    /// Whether vCPU readers may read through their slots. Set only by a
    /// reader holding `rw` for reading, cleared only by the writer holding
    /// it for writing.
    bias: AtomicBool,
    /// vCPU reads through `rw` since the last write.
    shared_reads: AtomicU32,
    /// Slots handed out so far (slot indices are below this).
    slots: Box<[ReaderSlot]>,
    data: UnsafeCell<T>,
    _platform: PhantomData<P>,
}

// SAFETY: the lock hands out `&T` to any number of readers and `&mut T` to
// one writer with no reader, as a reader-writer lock does, so it is `Sync`
// exactly when `T` may be sent and shared between threads.
unsafe impl<T: Send + Sync, P: Platform> Sync for MmuLock<T, P> {}
// SAFETY: moving the lock moves `T`; the rest is atomics and a raw lock
// (`Send` by the platform's bound).
unsafe impl<T: Send, P: Platform> Send for MmuLock<T, P> {}

/// A guard and whether taking it had to wait.
pub struct Acquired<G> {
    /// The guard.
    pub guard: G,
    /// Nanoseconds spent waiting for a writer or for readers, if the lock
    /// was not free at once (a contention).
    pub waited_ns: Option<u64>,
}

/// Shared access to the data of an [`MmuLock`].
pub struct ReadGuard<'a, T, P: Platform = DefaultPlatform> {
    lock: &'a MmuLock<T, P>,
    slot: Option<&'a ReaderSlot>,
    _rw: Option<SharedRead<'a, P>>,
}

/// Exclusive access to the data of an [`MmuLock`].
pub struct WriteGuard<'a, T, P: Platform = DefaultPlatform> {
    lock: &'a MmuLock<T, P>,
    _rw: SharedWrite<'a, P>,
}

impl<T> MmuLock<T> {
    /// A lock around `data` with `slots` vCPU reader slots (0: every reader
    /// uses the shared rwlock, KVM's `mmu_lock`), on the default platform.
    /// It starts biased: there is no writer yet. At most
    /// [`super::MAX_VCPUS`] slots are made (readers beyond them use the
    /// shared rwlock, as with 0), whatever `slots` asks for.
    pub fn new(data: T, slots: usize) -> Self {
        Self::for_platform(data, slots)
    }
}

impl<T, P: Platform> MmuLock<T, P> {
    /// As [`MmuLock::new`], with platform `P`'s raw lock and clock.
    pub fn for_platform(data: T, slots: usize) -> Self {
        let slots = slots.min(super::MAX_VCPUS);
        MmuLock {
            #[cfg(not(loom))]
            rw: lock_api::RwLock::new(()),
            #[cfg(loom)]
            rw: (loom::sync::RwLock::new(()), PhantomData),
            bias: AtomicBool::new(slots > 0),
            shared_reads: AtomicU32::new(0),
            slots: (0..slots).map(|_| ReaderSlot(AtomicU32::new(0))).collect(),
            data: UnsafeCell::new(data),
            _platform: PhantomData,
        }
    }

    /// The reader slot of vCPU `vcpu`, or `None` beyond the lock's slots
    /// (that vCPU reads through the shared rwlock). Slots are a matter of
    /// speed, not of safety: readers sharing one, or passing any index, are
    /// still excluded from writers.
    pub fn slot_for(&self, vcpu: usize) -> Option<usize> {
        (vcpu < self.slots.len()).then_some(vcpu)
    }

    /// Whether vCPU readers currently read through their slots.
    pub fn biased(&self) -> bool {
        self.bias.load(Ordering::Relaxed)
    }

    /// Takes the lock for reading: through `slot` (from
    /// [`MmuLock::slot_for`]) while the lock is biased, else through the
    /// shared rwlock.
    pub fn read(&self, slot: Option<usize>) -> Acquired<ReadGuard<'_, T, P>> {
        let slot = slot.and_then(|i| self.slots.get(i));
        if let Some(s) = slot {
            if self.bias.load(Ordering::Relaxed) {
                s.0.fetch_add(1, Ordering::Relaxed);
                fence(Ordering::SeqCst);
                if self.bias.load(Ordering::Relaxed) {
                    return Acquired {
                        guard: ReadGuard {
                            lock: self,
                            slot: Some(s),
                            _rw: None,
                        },
                        waited_ns: None,
                    };
                }
                // A writer is revoking the bias: step aside.
                s.0.fetch_sub(1, Ordering::Release);
            }
        }
        let (rw, waited_ns) = shared_read::<P>(&self.rw);
        if slot.is_some()
            && !self.bias.load(Ordering::Relaxed)
            && self.shared_reads.fetch_add(1, Ordering::Relaxed) + 1 >= REBIAS_AFTER
        {
            // No writer can hold `rw` now; the next one sees the bias
            // through the rwlock and revokes it.
            self.bias.store(true, Ordering::Relaxed);
        }
        Acquired {
            guard: ReadGuard {
                lock: self,
                slot: None,
                _rw: Some(rw),
            },
            waited_ns,
        }
    }

    /// Takes the lock for writing: the shared rwlock, then, if the lock is
    /// biased, revokes the bias and waits for the slot readers to leave.
    pub fn write(&self) -> Acquired<WriteGuard<'_, T, P>> {
        let (rw, mut waited_ns) = shared_write::<P>(&self.rw);
        self.shared_reads.store(0, Ordering::Relaxed);
        // Only a reader holding `rw` sets the bias, so it cannot turn on
        // while this writer holds it.
        if self.bias.load(Ordering::Relaxed) {
            self.bias.store(false, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            // Every slot, not just those handed out: a reader may pass any
            // index, and an index it was not given is still its slot.
            let mut t = None;
            for s in self.slots.iter() {
                let mut spins = 0u32;
                // Acquire: pairs with the reader's release of its slot.
                while s.0.load(Ordering::Acquire) != 0 {
                    t.get_or_insert_with(Stopwatch::<P::Clock>::start);
                    backoff::<P>(&mut spins);
                }
            }
            if let Some(t) = t {
                *waited_ns.get_or_insert(0) += t.elapsed_ns();
            }
        }
        Acquired {
            guard: WriteGuard {
                lock: self,
                _rw: rw,
            },
            waited_ns,
        }
    }
}

/// Takes the shared rwlock for reading without waiting if it is free, else
/// waits and returns how long (0 without a clock).
#[cfg(not(loom))]
fn shared_read<P: Platform>(rw: &SharedRw<P>) -> (SharedRead<'_, P>, Option<u64>) {
    match rw.try_read() {
        Some(g) => (g, None),
        None => {
            let t = Stopwatch::<P::Clock>::start();
            let g = rw.read();
            (g, Some(t.elapsed_ns()))
        }
    }
}

/// As [`shared_read`], for writing.
#[cfg(not(loom))]
fn shared_write<P: Platform>(rw: &SharedRw<P>) -> (SharedWrite<'_, P>, Option<u64>) {
    match rw.try_write() {
        Some(g) => (g, None),
        None => {
            let t = Stopwatch::<P::Clock>::start();
            let g = rw.write();
            (g, Some(t.elapsed_ns()))
        }
    }
}

/// Loom's lock, taken through a poisoned state (the guarded table is
/// consistent between walker steps).
#[cfg(loom)]
fn shared_read<P: Platform>(rw: &SharedRw<P>) -> (SharedRead<'_, P>, Option<u64>) {
    let g =
        rw.0.read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
    ((g, PhantomData), None)
}

/// As [`shared_read`], for writing.
#[cfg(loom)]
fn shared_write<P: Platform>(rw: &SharedRw<P>) -> (SharedWrite<'_, P>, Option<u64>) {
    let g =
        rw.0.write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
    ((g, PhantomData), None)
}

/// Spins briefly, then yields: a slot reader that holds the lock may be
/// preempted on a machine with fewer CPUs than vCPUs.
#[inline]
fn backoff<P: Platform>(spins: &mut u32) {
    #[cfg(loom)]
    {
        let _ = spins;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    {
        *spins += 1;
        if *spins < 64 {
            core::hint::spin_loop();
        } else {
            P::relax();
        }
    }
}

impl<T, P: Platform> Deref for ReadGuard<'_, T, P> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard is a reader of the lock (its slot is set and a
        // writer waits for it, or it holds `rw` for reading), so no
        // `WriteGuard` exists while it lives.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T, P: Platform> Drop for ReadGuard<'_, T, P> {
    fn drop(&mut self) {
        if let Some(s) = self.slot {
            // Release: the reads of the critical section happen before a
            // writer that sees the slot clear.
            s.0.fetch_sub(1, Ordering::Release);
        }
    }
}

impl<T, P: Platform> Deref for WriteGuard<'_, T, P> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the writer holds `rw` for writing and no slot reader is
        // inside (it revoked the bias and waited, or the bias was off), so
        // no other guard exists while it lives.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T, P: Platform> DerefMut for WriteGuard<'_, T, P> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as for `deref`; `&mut self` makes the borrow unique.
        unsafe { &mut *self.lock.data.get() }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    /// Two readers on one slot: the writer must wait for both (the lock
    /// handed out `&mut` while a reader lived when slots were flags).
    #[test]
    fn readers_sharing_a_slot_both_hold_off_writers() {
        let l = Arc::new(MmuLock::new(0u64, 4));
        let s = l.slot_for(1);
        let a = l.read(s).guard;
        let b = l.read(s).guard;
        drop(a);
        let l2 = l.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let w = std::thread::spawn(move || {
            *l2.write().guard += 1;
            tx.send(()).unwrap();
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(rx.try_recv().is_err(), "the writer got in while b reads");
        assert_eq!(*b, 0);
        drop(b);
        rx.recv().unwrap();
        w.join().unwrap();
        assert_eq!(
            *l.read(Some(3)).guard,
            1,
            "an index never handed out is a slot too"
        );
    }

    #[test]
    fn biases_after_enough_vcpu_reads_and_a_write_revokes() {
        let l = MmuLock::new(0u32, 4);
        assert!(l.biased(), "no writer yet");
        let s = l.slot_for(1);
        assert_eq!(s, Some(1));
        assert_eq!(l.slot_for(4), None, "beyond the slots");
        drop(l.write());
        assert!(!l.biased());
        for _ in 0..REBIAS_AFTER {
            assert!(!l.biased());
            drop(l.read(s));
        }
        assert!(l.biased());
        // Non-vCPU readers do not bias.
        let l2 = MmuLock::new(0u32, 4);
        drop(l2.write());
        for _ in 0..2 * REBIAS_AFTER {
            drop(l2.read(None));
        }
        assert!(!l2.biased());
        {
            let g = l.read(s).guard;
            assert!(g.slot.is_some(), "a biased read uses the slot");
        }
        *l.write().guard += 1;
        assert!(!l.biased(), "a write revokes the bias");
        assert!(l.read(s).guard.slot.is_none());
        assert_eq!(*l.read(None).guard, 1);
    }

    #[test]
    fn without_slots_it_is_a_plain_rwlock() {
        let l = MmuLock::new(5u32, 0);
        assert_eq!(l.slot_for(0), None);
        for _ in 0..2 * REBIAS_AFTER {
            drop(l.read(None));
        }
        assert!(!l.biased());
        *l.write().guard = 6;
        assert_eq!(*l.read(None).guard, 6);
    }

    /// Writers and slot readers never overlap: each writer makes the data
    /// odd while it holds the lock, and no reader ever sees it odd; the
    /// writes all land.
    #[test]
    fn readers_never_see_a_writer_inside() {
        const READERS: usize = 3;
        // Miri checks every access for data races: fewer rounds, the same
        // steps.
        const WRITES: u64 = if cfg!(miri) { 40 } else { 2_000 };
        const PAUSE: u32 = if cfg!(miri) { 10 } else { 200 };
        let l = Arc::new(MmuLock::new(AtomicU64::new(0), READERS));
        let stop = Arc::new(AtomicBool::new(false));
        // The writer starts once every reader has read: on a loaded machine
        // a reader thread may otherwise first run after the last write.
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let readers: Vec<_> = (0..READERS)
            .map(|i| {
                let (l, stop, running) = (l.clone(), stop.clone(), running.clone());
                std::thread::spawn(move || {
                    let slot = l.slot_for(i);
                    let mut reads = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let g = l.read(slot).guard;
                        assert_eq!(g.load(Ordering::Relaxed) % 2, 0, "a writer is inside");
                        drop(g);
                        reads += 1;
                        if reads == 1 {
                            running.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    reads
                })
            })
            .collect();
        while running.load(Ordering::Relaxed) < READERS {
            std::thread::yield_now();
        }
        for _ in 0..WRITES {
            let g = l.write().guard;
            g.fetch_add(1, Ordering::Relaxed);
            std::hint::spin_loop();
            g.fetch_add(1, Ordering::Relaxed);
            drop(g);
            for _ in 0..PAUSE {
                std::hint::spin_loop();
            }
        }
        stop.store(true, Ordering::Relaxed);
        let reads: u64 = readers.into_iter().map(|h| h.join().unwrap()).sum();
        assert!(reads > 0);
        assert_eq!(l.read(None).guard.load(Ordering::Relaxed), 2 * WRITES);
    }
}
