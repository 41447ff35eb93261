//! The arm64 hook: the TLBI instructions (and barriers) a hypervisor issues
//! for each engine call, with their operand encodings.
//!
//! [`Arm64Tlbi`] implements [`TlbInvalidate`] by emitting [`Insn`]s to a
//! [`TlbiSink`]. A hypervisor running at EL2 plugs in a sink that executes
//! them (`tlbi <op>, <operand>`, `dsb ish`, `isb`, in the VMID context of the
//! VM); tests plug in [`InsnRecorder`]. The sequences are KVM's
//! (`hyp/nvhe/tlb.c`):
//!
//! | engine call | sequence |
//! |---|---|
//! | [`TlbInvalidate::flush_ipa`], a leaf at a known level | `DSB ISHST; TLBI IPAS2LE1IS, ipa+TTL; DSB ISH; TLBI VMALLE1IS; DSB ISH; ISB` |
//! | [`TlbInvalidate::flush_ipa`], level unknown | the same with `IPAS2E1IS` |
//! | [`TlbInvalidate::flush_ipa_local`] | `DSB NSHST; TLBI IPAS2LE1 / IPAS2E1, ipa; DSB NSH; TLBI VMALLE1; DSB NSH; ISB` |
//! | [`TlbInvalidate::flush_range`] | `DSB ISHST; TLBI RIPAS2E1IS, range...; DSB ISH; TLBI VMALLE1IS; DSB ISH; ISB` |
//! | [`TlbInvalidate::flush_vmid`] | `DSB ISHST; TLBI VMALLS12E1IS; DSB ISH; ISB` |
//!
//! Every address-based invalidation is a *stage-2 by IPA* one. A stage-1
//! by-VA invalidation (`TLBI VAE1IS`) would leave the stage-2 (and combined)
//! entries in place; the only stage-1 operation is `VMALLE1IS`, all stage-1
//! entries of the VMID, issued after the stage-2 invalidation has completed
//! (a `DSB`), because a combined stage-1+2 entry could otherwise be refilled
//! from the old stage-2 entry (the ordering rule in KVM's source).
//!
//! A level passed with an IPA names the leaf (page or block) that changed,
//! and no table entry above it changed ([`TlbInvalidate::flush_ipa`]'s
//! contract): the last-level form (`IPAS2LE1IS`) is enough and leaves the
//! cached table entries of the walk in place; the level goes into the
//! operand's TTL field where the CPU has FEAT_TTL. KVM passes the level as
//! the TTL hint of the every-level form (`__kvm_tlb_flush_vmid_ipa`); a
//! changed table entry is invalidated by range here, every level, as it is
//! there. Without a level the every-level form is used.
//!
//! Without FEAT_TLBIRANGE a range flush is a whole-VMID flush, as
//! `kvm_tlb_flush_vmid_range` does.

use super::TlbInvalidate;
pub use crate::tlbi::{Barrier, Insn, TlbiOp, TlbiScope};

/// Where a hypervisor executes the instructions (in the VM's VMID context:
/// `VTTBR_EL2` holds its VMID while a sequence runs).
pub trait TlbiSink: Send + Sync {
    /// Executes `insn`.
    fn emit(&self, insn: Insn);
    /// Called once before and once after each sequence: a hypervisor
    /// switches to the VM's VMID and back here (KVM's
    /// `enter_vmid_context`/`exit_vmid_context`, the per-call fixed cost).
    fn begin(&self) {}
    /// See [`TlbiSink::begin`].
    fn end(&self) {}
}

/// A shared sink (the hypervisor keeps a handle to read its counters or
/// switch its VMID context while the engine owns the backend).
impl<T: TlbiSink + ?Sized> TlbiSink for alloc::sync::Arc<T> {
    fn emit(&self, insn: Insn) {
        (**self).emit(insn)
    }
    fn begin(&self) {
        (**self).begin()
    }
    fn end(&self) {
        (**self).end()
    }
}

/// Largest number of pages one range TLBI covers
/// (`MAX_TLBI_RANGE_PAGES = __TLBI_RANGE_PAGES(31, 3)` = 2^21).
pub const MAX_TLBI_RANGE_PAGES: u64 = range_pages(31, 3);

/// `__TLBI_RANGE_PAGES(num, scale)`: pages covered by one range TLBI.
pub const fn range_pages(num: u64, scale: u32) -> u64 {
    (num + 1) << (5 * scale + 1)
}

/// `__TLBI_RANGE_NUM(pages, scale)`: the NUM field covering as much of
/// `pages` as possible at `scale`, or `None` if none fits.
pub const fn range_num(pages: u64, scale: u32) -> Option<u64> {
    let max = range_pages(31, scale);
    let p = if pages < max { pages } else { max };
    let n = p >> (5 * scale + 1);
    if n == 0 {
        None
    } else {
        Some(n - 1)
    }
}

/// The TG field for a page size: 4K = 1, 16K = 2, 64K = 3.
pub const fn translation_granule(page_shift: u32) -> u64 {
    match page_shift {
        12 => 1,
        14 => 2,
        16 => 3,
        _ => 0,
    }
}

/// Features of the CPU that change the encodings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Arm64TlbiFeatures {
    /// FEAT_TLBIRANGE: range TLBIs exist.
    pub range: bool,
    /// FEAT_TTL: the level hint in operands.
    pub ttl: bool,
    /// LPA2 (52-bit addresses with 4K/16K): range base in 64 KiB units.
    pub lpa2: bool,
}

impl Default for Arm64TlbiFeatures {
    fn default() -> Self {
        Arm64TlbiFeatures {
            range: true,
            ttl: true,
            lpa2: false,
        }
    }
}

/// `__TLBI_VADDR` for an IPA operation: `ipa >> 12` in bits \[43:0\], and the
/// TTL hint `(TG << 2) | level` in bits \[47:44\] when known.
pub fn ipa_operand(ipa: u64, level: Option<u32>, page_shift: u32, ttl: bool) -> u64 {
    let mut op = (ipa >> 12) & ((1 << 44) - 1);
    if let Some(l) = level.filter(|&l| ttl && l <= 3) {
        let tg = translation_granule(page_shift);
        op |= ((tg << 2) | u64::from(l)) << 44;
    }
    op
}

/// A range operand: BADDR \[36:0\] (page number, or 64 KiB number with LPA2),
/// TTL \[38:37\] (0: unknown), NUM \[43:39\], SCALE \[45:44\], TG \[47:46\].
pub fn range_operand(start: u64, num: u64, scale: u32, page_shift: u32, lpa2: bool) -> u64 {
    let baddr = if lpa2 {
        start >> 16
    } else {
        start >> page_shift
    } & ((1 << 37) - 1);
    baddr | (num & 0x1f) << 39 | u64::from(scale & 3) << 44 | translation_granule(page_shift) << 46
}

/// Decodes a range operand into the byte range it covers.
pub fn decode_range(operand: u64, page_shift: u32, lpa2: bool) -> (u64, u64) {
    let baddr = operand & ((1 << 37) - 1);
    let num = (operand >> 39) & 0x1f;
    let scale = ((operand >> 44) & 3) as u32;
    let start = if lpa2 {
        baddr << 16
    } else {
        baddr << page_shift
    };
    (start, range_pages(num, scale) << page_shift)
}

/// The arm64 backend: engine calls become TLBI sequences on a sink.
pub struct Arm64Tlbi<S: TlbiSink> {
    sink: S,
    page_shift: u32,
    features: Arm64TlbiFeatures,
}

impl<S: TlbiSink> Arm64Tlbi<S> {
    /// A backend for `2^page_shift`-byte pages emitting to `sink`.
    pub fn new(sink: S, page_shift: u32, features: Arm64TlbiFeatures) -> Self {
        Arm64Tlbi {
            sink,
            page_shift,
            features,
        }
    }

    /// The sink.
    pub fn sink(&self) -> &S {
        &self.sink
    }

    /// The operand of a by-IPA TLBI: the level hint only with FEAT_TTL.
    fn ipa_operand(&self, ipa: u64, level: Option<u32>) -> u64 {
        ipa_operand(ipa, level, self.page_shift, self.features.ttl)
    }

    fn tlbi(&self, op: TlbiOp, operand: u64) {
        crate::bbm::sequence_insn(Insn::Tlbi { op, operand });
        self.sink.emit(Insn::Tlbi { op, operand });
    }

    fn barrier(&self, b: Barrier) {
        crate::bbm::sequence_insn(Insn::Barrier(b));
        self.sink.emit(Insn::Barrier(b));
    }

    /// Ends a sequence: the monitor checks its barriers, then the sink
    /// runs it.
    fn end(&self) {
        crate::bbm::sequence_end();
        self.sink.end();
    }

    /// `__flush_s2_tlb_range_op(ipas2e1is, start, pages, PAGE_SIZE, unknown
    /// level)`, in pieces of at most [`MAX_TLBI_RANGE_PAGES`].
    fn range_ops(&self, mut start: u64, mut pages: u64) {
        let shift = self.page_shift;
        while pages > 0 {
            let mut left = pages.min(MAX_TLBI_RANGE_PAGES);
            pages -= left;
            let mut scale: i32 = 3;
            while left > 0 {
                let unaligned = self.features.lpa2 && start & 0xffff != 0;
                if !self.features.range || left == 1 || unaligned || scale < 0 {
                    self.tlbi(TlbiOp::Ipas2e1is, self.ipa_operand(start, None));
                    start += 1 << shift;
                    left -= 1;
                    continue;
                }
                let s = scale as u32;
                if let Some(num) = range_num(left, s) {
                    self.tlbi(
                        TlbiOp::Ripas2e1is,
                        range_operand(start, num, s, shift, self.features.lpa2),
                    );
                    let n = range_pages(num, s);
                    start += n << shift;
                    left -= n;
                }
                scale -= 1;
            }
        }
    }
}

impl<S: TlbiSink> TlbInvalidate for Arm64Tlbi<S> {
    fn flush_ipa(&self, ipa: u64, level: Option<u32>) {
        self.sink.begin();
        self.barrier(Barrier::DsbIshst);
        let op = match level {
            Some(_) => TlbiOp::Ipas2le1is,
            None => TlbiOp::Ipas2e1is,
        };
        self.tlbi(op, self.ipa_operand(ipa, level));
        self.barrier(Barrier::DsbIsh);
        self.tlbi(TlbiOp::Vmalle1is, 0);
        self.barrier(Barrier::DsbIsh);
        self.barrier(Barrier::Isb);
        self.end();
    }

    fn flush_ipa_local(&self, ipa: u64, level: Option<u32>) {
        self.sink.begin();
        self.barrier(Barrier::DsbNshst);
        let op = match level {
            Some(_) => TlbiOp::Ipas2le1,
            None => TlbiOp::Ipas2e1,
        };
        self.tlbi(op, self.ipa_operand(ipa, level));
        self.barrier(Barrier::DsbNsh);
        self.tlbi(TlbiOp::Vmalle1, 0);
        self.barrier(Barrier::DsbNsh);
        self.barrier(Barrier::Isb);
        self.end();
    }

    fn flush_range(&self, ipa: u64, size: u64) {
        if size == 0 {
            return;
        }
        if !self.features.range {
            self.flush_vmid();
            return;
        }
        let shift = self.page_shift;
        let start = ipa & !((1u64 << shift) - 1);
        let end = ipa.saturating_add(size);
        let pages = (end - start).div_ceil(1 << shift);
        self.sink.begin();
        self.barrier(Barrier::DsbIshst);
        self.range_ops(start, pages);
        self.barrier(Barrier::DsbIsh);
        self.tlbi(TlbiOp::Vmalle1is, 0);
        self.barrier(Barrier::DsbIsh);
        self.barrier(Barrier::Isb);
        self.end();
    }

    fn flush_vmid(&self) {
        self.sink.begin();
        self.barrier(Barrier::DsbIshst);
        self.tlbi(TlbiOp::Vmalls12e1is, 0);
        self.barrier(Barrier::DsbIsh);
        self.barrier(Barrier::Isb);
        self.end();
    }
}

#[cfg(feature = "std")]
pub use recorder::InsnRecorder;

#[cfg(feature = "std")]
mod recorder {
    use super::{Insn, TlbiSink};
    use std::sync::Mutex;

    /// A sink that records the instructions, for tests. Each sequence is
    /// one entry (one hypervisor call).
    #[derive(Debug, Default)]
    pub struct InsnRecorder {
        seqs: Mutex<Vec<Vec<Insn>>>,
    }

    impl InsnRecorder {
        /// An empty recorder.
        pub fn new() -> Self {
            Self::default()
        }

        /// Takes the sequences recorded so far.
        pub fn take(&self) -> Vec<Vec<Insn>> {
            std::mem::take(&mut *self.seqs.lock().unwrap_or_else(|e| e.into_inner()))
        }
    }

    impl TlbiSink for InsnRecorder {
        fn begin(&self) {
            self.seqs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Vec::new());
        }
        fn emit(&self, insn: Insn) {
            let mut s = self.seqs.lock().unwrap_or_else(|e| e.into_inner());
            if s.is_empty() {
                s.push(Vec::new());
            }
            if let Some(last) = s.last_mut() {
                last.push(insn);
            }
        }
    }
}

#[cfg(all(test, feature = "std"))]
mod tests;
