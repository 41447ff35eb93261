//! TLB invalidation: the interface the engine calls, and batching.
//!
//! The engine never touches a TLB itself. It calls a [`TlbInvalidate`]
//! backend: a hypervisor's stage-2 invalidation instructions, the simulated
//! vCPUs' software TLBs, or [`TlbRecorder`] in tests. Every invalidation is a
//! stage-2 one, by IPA (a hypervisor backend must use `TLBI IPAS2E1IS`, or
//! `IPAS2LE1IS` for a leaf, followed by `VMALLE1IS`, or `VMALLS12E1IS` for
//! a whole VMID: never a stage-1 by-VA invalidation, which would leave
//! stale stage-2 entries).
//!
//! Range invalidations are gathered in a [`TlbBatch`]: ranges issued during
//! one operation coalesce, and the batch is flushed when it is finished or
//! dropped, so a caller cannot forget it. A range larger than the policy's
//! page limit is either split into limit-sized calls (Linux mainline) or
//! replaced by one whole-VMID flush.

pub mod arm64;
pub(crate) mod traced;

/// The invalidation primitives a backend implements.
pub trait TlbInvalidate: Send + Sync {
    /// Invalidates the stage-2 translation of `ipa`.
    ///
    /// `Some(level)`: the entry that changed is the leaf (page or block) at
    /// `level` that mapped `ipa`, and no table entry changed, so a
    /// last-level invalidation with `level` as its hint is enough (arm64's
    /// `TLBI IPAS2LE1IS` with TTL). `None`: the level is unknown, and every
    /// level is invalidated. The engine invalidates a changed table entry
    /// by range ([`TlbInvalidate::flush_range`]), never through this call.
    fn flush_ipa(&self, ipa: u64, level: Option<u32>);
    /// Like [`TlbInvalidate::flush_ipa`] but only on the calling CPU (after a
    /// permission relaxation, where other CPUs at worst take a spurious fault).
    fn flush_ipa_local(&self, ipa: u64, level: Option<u32>) {
        self.flush_ipa(ipa, level);
    }
    /// Invalidates every stage-2 translation in `[ipa, ipa + size)`. One call
    /// is one hypervisor call: callers keep `size` within the range limit.
    fn flush_range(&self, ipa: u64, size: u64);
    /// Invalidates every translation of the VM.
    fn flush_vmid(&self);
}

/// A backend that does nothing: for tables no CPU walks yet (building an
/// unlinked table, tear-down).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoTlb;

impl TlbInvalidate for NoTlb {
    fn flush_ipa(&self, _ipa: u64, _level: Option<u32>) {}
    fn flush_range(&self, _ipa: u64, _size: u64) {}
    fn flush_vmid(&self) {}
}

/// What to do with a range flush above the page limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LargeRangePolicy {
    /// One range call per `limit_pages` (Linux mainline's
    /// `kvm_tlb_flush_vmid_range` loop). The seeds' baseline (the
    /// `baselines` feature only).
    #[cfg(feature = "baselines")]
    SplitCalls,
    /// One whole-VMID flush instead (the 2026 RFC's policy).
    WholeVmid,
}

/// How range invalidations are issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TlbPolicy {
    /// Largest range, in pages, that one range call may cover
    /// (`MAX_TLBI_RANGE_PAGES` = 2^21 on arm64).
    pub limit_pages: u64,
    /// What happens above the limit.
    pub large_range: LargeRangePolicy,
    /// log2 of the page size, to turn bytes into pages.
    pub page_shift: u32,
}

impl TlbPolicy {
    /// arm64's range limit: 2^21 pages (8 GiB with 4K pages).
    pub const DEFAULT_LIMIT_PAGES: u64 = 1 << 21;

    /// The optimised default: whole-VMID flush above 2^21 pages of 4 KiB.
    pub const fn new(page_shift: u32) -> Self {
        TlbPolicy {
            limit_pages: Self::DEFAULT_LIMIT_PAGES,
            large_range: LargeRangePolicy::WholeVmid,
            page_shift,
        }
    }

    /// Issues a flush of `[ipa, ipa + size)` on `tlb` under this policy and
    /// returns the number of backend calls made.
    pub fn flush_range(&self, tlb: &dyn TlbInvalidate, ipa: u64, size: u64) -> u64 {
        if size == 0 {
            return 0;
        }
        let pages = size.div_ceil(1 << self.page_shift);
        let limit = self.limit_pages.max(1);
        if pages <= limit {
            tlb.flush_range(ipa, size);
            return 1;
        }
        match self.large_range {
            LargeRangePolicy::WholeVmid => {
                tlb.flush_vmid();
                1
            }
            #[cfg(feature = "baselines")]
            LargeRangePolicy::SplitCalls => {
                let step = limit << self.page_shift;
                let end = ipa.saturating_add(size);
                let mut a = ipa;
                let mut calls = 0;
                while a < end {
                    let n = step.min(end - a);
                    tlb.flush_range(a, n);
                    a += n;
                    calls += 1;
                }
                calls
            }
        }
    }
}

/// Range invalidations gathered during an operation and issued once.
///
/// Ranges coalesce into their covering range (KVM flushes a whole memslot
/// range the same way). The flush happens in [`TlbBatch::finish`] or, if the
/// caller forgets, when the batch is dropped.
#[must_use = "a batch flushes when finished or dropped; keep it until the operation is done"]
pub struct TlbBatch<'a> {
    tlb: &'a dyn TlbInvalidate,
    policy: TlbPolicy,
    range: Option<(u64, u64)>,
    whole_vmid: bool,
    calls: u64,
}

impl<'a> TlbBatch<'a> {
    /// An empty batch for `tlb`.
    pub fn new(tlb: &'a dyn TlbInvalidate, policy: TlbPolicy) -> Self {
        TlbBatch {
            tlb,
            policy,
            range: None,
            whole_vmid: false,
            calls: 0,
        }
    }

    /// Makes the pending flush one whole-VMID flush, whatever was added
    /// (KVM flushes the whole VM after a dirty-ring reset).
    pub fn add_whole_vmid(&mut self) {
        self.whole_vmid = true;
    }

    /// Adds `[ipa, ipa + size)` to the batch.
    pub fn add(&mut self, ipa: u64, size: u64) {
        if size == 0 {
            return;
        }
        let end = ipa.saturating_add(size);
        self.range = Some(match self.range {
            None => (ipa, end),
            Some((s, e)) => (s.min(ipa), e.max(end)),
        });
    }

    /// Whether anything is pending.
    pub fn is_empty(&self) -> bool {
        self.range.is_none() && !self.whole_vmid
    }

    /// Issues the pending flush now; returns the number of backend calls
    /// made by this batch so far.
    pub fn flush(&mut self) -> u64 {
        if self.whole_vmid {
            self.whole_vmid = false;
            self.range = None;
            self.tlb.flush_vmid();
            self.calls += 1;
        } else if let Some((s, e)) = self.range.take() {
            self.calls += self.policy.flush_range(self.tlb, s, e - s);
        }
        self.calls
    }

    /// Flushes and returns the number of backend calls made.
    pub fn finish(mut self) -> u64 {
        self.flush()
    }
}

impl Drop for TlbBatch<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(feature = "std")]
pub use recorder::{TlbCall, TlbRecorder};

#[cfg(feature = "std")]
mod recorder {
    use super::TlbInvalidate;
    use std::sync::Mutex;

    /// One recorded invalidation.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum TlbCall {
        /// By IPA, broadcast.
        Ipa {
            /// Address.
            ipa: u64,
            /// Level hint.
            level: Option<u32>,
        },
        /// By IPA, this CPU only.
        IpaLocal {
            /// Address.
            ipa: u64,
            /// Level hint.
            level: Option<u32>,
        },
        /// A range.
        Range {
            /// Start.
            ipa: u64,
            /// Size in bytes.
            size: u64,
        },
        /// The whole VMID.
        Vmid,
    }

    impl TlbCall {
        /// Whether this call invalidates the translation of `ipa`, given the
        /// size of the entry it was issued for (by-IPA calls cover the whole
        /// entry at their level; `entry_size` is used when the hint is absent).
        pub fn covers(&self, ipa: u64, entry_size: u64) -> bool {
            match *self {
                TlbCall::Ipa { ipa: a, .. } | TlbCall::IpaLocal { ipa: a, .. } => {
                    let base = a & !(entry_size - 1);
                    ipa >= base && ipa < base + entry_size
                }
                TlbCall::Range { ipa: a, size } => ipa >= a && ipa - a < size,
                TlbCall::Vmid => true,
            }
        }
    }

    /// A backend that records every call, for tests. Its mutex is poisoned
    /// only by a panic while pushing or taking, which cannot happen short of
    /// running out of memory; its `unwrap`s propagate that panic.
    #[derive(Debug, Default)]
    pub struct TlbRecorder {
        calls: Mutex<Vec<TlbCall>>,
    }

    impl TlbRecorder {
        /// An empty recorder.
        pub fn new() -> Self {
            Self::default()
        }
        /// Takes the calls recorded so far.
        pub fn take(&self) -> Vec<TlbCall> {
            std::mem::take(&mut *self.calls.lock().unwrap())
        }
        /// Number of calls recorded so far.
        pub fn len(&self) -> usize {
            self.calls.lock().unwrap().len()
        }
        /// Whether nothing was recorded.
        pub fn is_empty(&self) -> bool {
            self.len() == 0
        }
        fn push(&self, c: TlbCall) {
            self.calls.lock().unwrap().push(c);
        }
    }

    impl TlbInvalidate for TlbRecorder {
        fn flush_ipa(&self, ipa: u64, level: Option<u32>) {
            self.push(TlbCall::Ipa { ipa, level });
        }
        fn flush_ipa_local(&self, ipa: u64, level: Option<u32>) {
            self.push(TlbCall::IpaLocal { ipa, level });
        }
        fn flush_range(&self, ipa: u64, size: u64) {
            self.push(TlbCall::Range { ipa, size });
        }
        fn flush_vmid(&self) {
            self.push(TlbCall::Vmid);
        }
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;

    #[test]
    fn small_ranges_are_one_call() {
        let r = TlbRecorder::new();
        let p = TlbPolicy::new(12);
        assert_eq!(p.flush_range(&r, 0x1000, 0x2000), 1);
        assert_eq!(
            r.take(),
            vec![TlbCall::Range {
                ipa: 0x1000,
                size: 0x2000
            }]
        );
    }

    #[test]
    fn large_ranges_split_or_become_one_vmid_flush() {
        let r = TlbRecorder::new();
        let split = TlbPolicy {
            large_range: LargeRangePolicy::SplitCalls,
            ..TlbPolicy::new(12)
        };
        // 64 GiB at 4K = 2^24 pages = 8 calls of 2^21 pages (8 GiB).
        assert_eq!(split.flush_range(&r, 0, 64 << 30), 8);
        let calls = r.take();
        assert_eq!(calls.len(), 8);
        assert!(calls
            .iter()
            .all(|c| matches!(c, TlbCall::Range { size, .. } if *size == 8 << 30)));
        let whole = TlbPolicy::new(12);
        assert_eq!(whole.flush_range(&r, 0, 64 << 30), 1);
        assert_eq!(r.take(), vec![TlbCall::Vmid]);
    }

    #[test]
    fn batch_coalesces_and_flushes_on_drop() {
        let r = TlbRecorder::new();
        {
            let mut b = TlbBatch::new(&r, TlbPolicy::new(12));
            b.add(0x5000, 0x1000);
            b.add(0x1000, 0x1000);
            b.add(0x3000, 0x1000);
            assert!(r.is_empty(), "nothing issued before the batch ends");
        }
        assert_eq!(
            r.take(),
            vec![TlbCall::Range {
                ipa: 0x1000,
                size: 0x5000
            }]
        );
        let b = TlbBatch::new(&r, TlbPolicy::new(12));
        assert_eq!(b.finish(), 0, "an empty batch issues nothing");
        assert!(r.is_empty());
    }
}
