//! The EL2 TLB backend: every engine invalidation becomes its instruction
//! sequence, executed on the CPU that runs the operation (a vCPU's fault
//! handler, or the CPU serving a host command), in the VMID context that
//! `VTTBR_EL2` holds.
//!
//! | engine call | sequence |
//! |---|---|
//! | `flush_ipa` (a leaf, its level known) | `DSB ISHST; TLBI IPAS2LE1IS, ipa+TTL; DSB ISH; TLBI VMALLE1IS; DSB ISH; ISB` |
//! | `flush_ipa` (level unknown) | the same with `IPAS2E1IS` |
//! | `flush_ipa_local` | `DSB NSHST; TLBI IPAS2LE1 / IPAS2E1; DSB NSH; TLBI VMALLE1; DSB NSH; ISB` |
//! | `flush_range`, FEAT_TLBIRANGE | `DSB ISHST; TLBI RIPAS2E1IS, ...; DSB ISH; TLBI VMALLE1IS; DSB ISH; ISB` |
//! | `flush_range` without it | as `flush_vmid` (KVM's `kvm_tlb_flush_vmid_range`) |
//! | `flush_vmid` | `DSB ISHST; TLBI VMALLS12E1IS; DSB ISH; ISB` |
//!
//! The engine passes a level only for a leaf it broke or changed (a table
//! entry is invalidated by range, `s2mmu::walk`), so the last-level form
//! is enough there: no cached table entry changed. The level goes into the
//! operand's TTL field where the CPU has FEAT_TTL.

use core::sync::atomic::{AtomicU64, Ordering};
use s2mmu::tlb::arm64::{ipa_operand, range_num, range_operand, range_pages, MAX_TLBI_RANGE_PAGES};
use s2mmu::TlbInvalidate;

pub mod cpu;

/// One instruction of a sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// `DSB ISHST`.
    DsbIshst,
    /// `DSB ISH`.
    DsbIsh,
    /// `DSB NSHST`.
    DsbNshst,
    /// `DSB NSH`.
    DsbNsh,
    /// `ISB`.
    Isb,
    /// `TLBI IPAS2E1IS, Xt`.
    Ipas2e1is(u64),
    /// `TLBI IPAS2LE1IS, Xt`: last level only.
    Ipas2le1is(u64),
    /// `TLBI IPAS2E1, Xt`: this CPU.
    Ipas2e1(u64),
    /// `TLBI IPAS2LE1, Xt`: this CPU, last level only.
    Ipas2le1(u64),
    /// `TLBI RIPAS2E1IS, Xt`: a range (FEAT_TLBIRANGE).
    Ripas2e1is(u64),
    /// `TLBI VMALLE1IS`: every stage-1 entry of the VMID.
    Vmalle1is,
    /// `TLBI VMALLE1`: the same, this CPU.
    Vmalle1,
    /// `TLBI VMALLS12E1IS`: every entry of the VMID, both stages.
    Vmalls12e1is,
}

/// Where the steps run: [`cpu::Cpu`] executes them on aarch64; tests
/// record them.
pub trait Exec: Send + Sync {
    /// Executes `step`.
    fn exec(&self, step: Step);
}

/// The CPU features that change the sequences.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TlbFeatures {
    /// FEAT_TLBIRANGE (`ID_AA64ISAR0_EL1.TLB` = 2): `RIPAS2E1IS` exists.
    pub range: bool,
    /// FEAT_TTL (`ID_AA64MMFR2_EL1.TTL` != 0): the level hint in operands.
    pub ttl: bool,
}

/// TLBI instructions issued so far, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TlbiCounts {
    /// `IPAS2LE1IS` and `IPAS2LE1`: a leaf, last level only.
    pub last_level: u64,
    /// `IPAS2E1IS` and `IPAS2E1`: every level.
    pub all_levels: u64,
    /// `RIPAS2E1IS`: ranges.
    pub range: u64,
    /// `VMALLS12E1IS`: the whole VMID.
    pub vmid: u64,
}

/// The EL2 backend ([module documentation](self)) for 4 KiB pages.
pub struct El2Tlb<E: Exec> {
    exec: E,
    features: TlbFeatures,
    sequences: AtomicU64,
    /// `TlbiCounts`' fields, in order.
    counts: [AtomicU64; 4],
}

/// The page shift of the stage 2 this backend serves (4 KiB granule).
const PAGE_SHIFT: u32 = 12;

impl<E: Exec> El2Tlb<E> {
    /// A backend executing on `exec` with `features` (read them with
    /// [`cpu::features`] on the CPU).
    pub fn new(exec: E, features: TlbFeatures) -> Self {
        El2Tlb {
            exec,
            features,
            sequences: AtomicU64::new(0),
            counts: [const { AtomicU64::new(0) }; 4],
        }
    }

    /// The features in use.
    pub fn features(&self) -> TlbFeatures {
        self.features
    }

    /// The executor.
    pub fn exec(&self) -> &E {
        &self.exec
    }

    /// Sequences issued so far (one per engine call).
    pub fn sequences(&self) -> u64 {
        self.sequences.load(Ordering::Relaxed)
    }

    /// The TLBIs issued so far, by kind.
    pub fn counts(&self) -> TlbiCounts {
        let c = |i: usize| self.counts[i].load(Ordering::Relaxed);
        TlbiCounts {
            last_level: c(0),
            all_levels: c(1),
            range: c(2),
            vmid: c(3),
        }
    }

    /// Counts `step` and executes it.
    fn emit(&self, step: Step) {
        let kind = match step {
            Step::Ipas2le1is(_) | Step::Ipas2le1(_) => Some(0),
            Step::Ipas2e1is(_) | Step::Ipas2e1(_) => Some(1),
            Step::Ripas2e1is(_) => Some(2),
            Step::Vmalls12e1is => Some(3),
            _ => None,
        };
        if let Some(k) = kind {
            self.counts[k].fetch_add(1, Ordering::Relaxed);
        }
        self.exec.exec(step);
    }

    fn run(&self, steps: &[Step]) {
        self.sequences.fetch_add(1, Ordering::Relaxed);
        for s in steps {
            self.emit(*s);
        }
    }

    fn operand(&self, ipa: u64, level: Option<u32>) -> u64 {
        ipa_operand(ipa, level, PAGE_SHIFT, self.features.ttl)
    }

    /// The range TLBIs covering `pages` pages from `start` (KVM's
    /// `__flush_s2_tlb_range_op`, without LPA2): largest scale first, a
    /// single page by `IPAS2E1IS`.
    fn range_steps(&self, mut start: u64, pages: u64) {
        let mut left = pages;
        while left > 0 {
            let mut chunk = left.min(MAX_TLBI_RANGE_PAGES);
            left -= chunk;
            let mut scale: i32 = 3;
            while chunk > 0 {
                if chunk == 1 || scale < 0 {
                    self.emit(Step::Ipas2e1is(self.operand(start, None)));
                    start += 1 << PAGE_SHIFT;
                    chunk -= 1;
                    continue;
                }
                let s = scale as u32;
                if let Some(num) = range_num(chunk, s) {
                    let op = range_operand(start, num, s, PAGE_SHIFT, false);
                    self.emit(Step::Ripas2e1is(op));
                    let n = range_pages(num, s);
                    start += n << PAGE_SHIFT;
                    chunk -= n;
                }
                scale -= 1;
            }
        }
    }
}

impl<E: Exec> TlbInvalidate for El2Tlb<E> {
    fn flush_ipa(&self, ipa: u64, level: Option<u32>) {
        let op = self.operand(ipa, level);
        let tlbi = match level {
            Some(_) => Step::Ipas2le1is(op),
            None => Step::Ipas2e1is(op),
        };
        self.run(&[
            Step::DsbIshst,
            tlbi,
            Step::DsbIsh,
            Step::Vmalle1is,
            Step::DsbIsh,
            Step::Isb,
        ]);
    }

    fn flush_ipa_local(&self, ipa: u64, level: Option<u32>) {
        let op = self.operand(ipa, level);
        let tlbi = match level {
            Some(_) => Step::Ipas2le1(op),
            None => Step::Ipas2e1(op),
        };
        self.run(&[
            Step::DsbNshst,
            tlbi,
            Step::DsbNsh,
            Step::Vmalle1,
            Step::DsbNsh,
            Step::Isb,
        ]);
    }

    fn flush_range(&self, ipa: u64, size: u64) {
        if size == 0 {
            return;
        }
        if !self.features.range {
            self.flush_vmid();
            return;
        }
        let start = ipa & !((1u64 << PAGE_SHIFT) - 1);
        let pages = ipa
            .saturating_add(size)
            .saturating_sub(start)
            .div_ceil(1 << PAGE_SHIFT);
        self.sequences.fetch_add(1, Ordering::Relaxed);
        self.emit(Step::DsbIshst);
        self.range_steps(start, pages);
        for s in [Step::DsbIsh, Step::Vmalle1is, Step::DsbIsh, Step::Isb] {
            self.emit(s);
        }
    }

    fn flush_vmid(&self) {
        self.run(&[Step::DsbIshst, Step::Vmalls12e1is, Step::DsbIsh, Step::Isb]);
    }
}

#[cfg(test)]
mod tests;
