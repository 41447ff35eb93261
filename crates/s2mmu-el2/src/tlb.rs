//! The EL2 TLB: the sink of the engine's arm64 backend
//! ([`s2mmu::tlb::arm64`]) that executes each instruction on the CPU that
//! runs the operation (a vCPU's fault handler, or the CPU serving a host
//! command), in the VMID context that `VTTBR_EL2` holds, and counts it.
//!
//! The sequences are the backend's, the same the host-side placement
//! executes: a leaf whose level the engine knows is invalidated at the
//! last level (`TLBI IPAS2LE1IS`, its level in the operand's TTL field
//! where the CPU has FEAT_TTL), anything else at every level
//! (`IPAS2E1IS`, `RIPAS2E1IS` with FEAT_TLBIRANGE, else `VMALLS12E1IS`),
//! each followed by the stage-1 `VMALLE1IS` and its barriers.
//!
//! [`El2Tlb::backend`] builds the backend ([`El2Tlbi`]) over a sink that
//! executes on [`cpu::Cpu`] (tests record instead).

use core::sync::atomic::{AtomicU64, Ordering};
use s2mmu::tlb::arm64::{Arm64Tlbi, Arm64TlbiFeatures, Insn, TlbiOp, TlbiSink};

pub mod cpu;

/// The engine's arm64 backend over EL2's sink: what the engine is given.
pub type El2Tlbi<S> = Arm64Tlbi<El2Tlb<S>>;

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

/// EL2's TLB sink ([module documentation](self)): counts each instruction
/// and executes it on `exec`.
pub struct El2Tlb<S: TlbiSink> {
    exec: S,
    sequences: AtomicU64,
    /// `TlbiCounts`' fields, in order.
    counts: [AtomicU64; 4],
}

/// The page shift of the stage 2 this backend serves (4 KiB granule).
const PAGE_SHIFT: u32 = 12;

impl<S: TlbiSink> El2Tlb<S> {
    /// A sink executing on `exec`.
    pub fn new(exec: S) -> Self {
        El2Tlb {
            exec,
            sequences: AtomicU64::new(0),
            counts: [const { AtomicU64::new(0) }; 4],
        }
    }

    /// The engine's backend for a 4 KiB-granule stage 2, executing on
    /// `exec` with `features` (read them with [`cpu::features`] on the CPU).
    pub fn backend(exec: S, features: Arm64TlbiFeatures) -> El2Tlbi<S> {
        Arm64Tlbi::new(El2Tlb::new(exec), PAGE_SHIFT, features)
    }

    /// The executor.
    pub fn exec(&self) -> &S {
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
}

impl<S: TlbiSink> TlbiSink for El2Tlb<S> {
    /// Counts `insn` and executes it.
    fn emit(&self, insn: Insn) {
        let kind = match insn {
            Insn::Tlbi { op, .. } => match op {
                TlbiOp::Ipas2le1is | TlbiOp::Ipas2le1 => Some(0),
                TlbiOp::Ipas2e1is | TlbiOp::Ipas2e1 => Some(1),
                TlbiOp::Ripas2e1is => Some(2),
                TlbiOp::Vmalls12e1is => Some(3),
                TlbiOp::Vmalle1is | TlbiOp::Vmalle1 => None,
            },
            Insn::Barrier(_) => None,
        };
        if let Some(k) = kind {
            self.counts[k].fetch_add(1, Ordering::Relaxed);
        }
        self.exec.emit(insn);
    }

    fn begin(&self) {
        self.sequences.fetch_add(1, Ordering::Relaxed);
        self.exec.begin();
    }

    fn end(&self) {
        self.exec.end();
    }
}

#[cfg(test)]
mod tests;
