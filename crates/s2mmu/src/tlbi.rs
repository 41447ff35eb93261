//! The arm64 TLB maintenance instructions as values: the TLBI operations,
//! the barriers between them and one instruction of a sequence. The arm64
//! backend ([`crate::tlb::arm64`], which re-exports them) emits them; the
//! break-before-make monitor ([`crate::bbm`]) checks a sequence's barriers
//! from them.

/// A TLBI operation the arm64 backend emits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TlbiOp {
    /// Stage-2 by IPA, Inner Shareable (all CPUs).
    Ipas2e1is,
    /// Stage-2 by IPA, this CPU only.
    Ipas2e1,
    /// Stage-2 by IPA, last level only, Inner Shareable: the leaf (page or
    /// block) entry, not the table entries above it. Enough when only a
    /// leaf changed.
    Ipas2le1is,
    /// Stage-2 by IPA, last level only, this CPU only.
    Ipas2le1,
    /// Stage-2 by IPA range, Inner Shareable (FEAT_TLBIRANGE).
    Ripas2e1is,
    /// All stage-1 entries of the current VMID, Inner Shareable.
    Vmalle1is,
    /// All stage-1 entries of the current VMID, this CPU only.
    Vmalle1,
    /// All stage-1 and stage-2 entries of the current VMID, Inner Shareable.
    Vmalls12e1is,
}

/// What an operation invalidates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TlbiScope {
    /// Stage-2 entries of one IPA or of an IPA range.
    Stage2ByIpa,
    /// Every stage-1 entry of the VMID (the combined entries an IPA
    /// invalidation cannot find, since their VA is unknown).
    Stage1WholeVmid,
    /// Every entry of the VMID, both stages.
    WholeVmid,
}

impl TlbiOp {
    /// What the operation invalidates.
    pub const fn scope(self) -> TlbiScope {
        match self {
            TlbiOp::Ipas2e1is
            | TlbiOp::Ipas2e1
            | TlbiOp::Ipas2le1is
            | TlbiOp::Ipas2le1
            | TlbiOp::Ripas2e1is => TlbiScope::Stage2ByIpa,
            TlbiOp::Vmalle1is | TlbiOp::Vmalle1 => TlbiScope::Stage1WholeVmid,
            TlbiOp::Vmalls12e1is => TlbiScope::WholeVmid,
        }
    }

    /// Whether it is broadcast to every CPU of the Inner Shareable domain.
    pub const fn broadcast(self) -> bool {
        !matches!(self, TlbiOp::Ipas2e1 | TlbiOp::Ipas2le1 | TlbiOp::Vmalle1)
    }

    /// Whether it invalidates last-level (leaf) entries only, leaving
    /// cached table entries in place.
    pub const fn last_level(self) -> bool {
        matches!(self, TlbiOp::Ipas2le1is | TlbiOp::Ipas2le1)
    }

    /// The assembler mnemonic.
    pub const fn mnemonic(self) -> &'static str {
        match self {
            TlbiOp::Ipas2e1is => "ipas2e1is",
            TlbiOp::Ipas2e1 => "ipas2e1",
            TlbiOp::Ipas2le1is => "ipas2le1is",
            TlbiOp::Ipas2le1 => "ipas2le1",
            TlbiOp::Ripas2e1is => "ripas2e1is",
            TlbiOp::Vmalle1is => "vmalle1is",
            TlbiOp::Vmalle1 => "vmalle1",
            TlbiOp::Vmalls12e1is => "vmalls12e1is",
        }
    }
}

/// A barrier between TLBIs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Barrier {
    /// `DSB ISHST`: table stores visible to every walker before the TLBI.
    DsbIshst,
    /// `DSB ISH`: broadcast TLBIs complete on every CPU.
    DsbIsh,
    /// `DSB NSHST`.
    DsbNshst,
    /// `DSB NSH`: local TLBIs complete.
    DsbNsh,
    /// `ISB`.
    Isb,
}

/// One instruction of an invalidation sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Insn {
    /// `TLBI <op>, <operand>` (operand 0 for the VMALL ops).
    Tlbi {
        /// The operation.
        op: TlbiOp,
        /// The `Xt` operand, encoded as the architecture defines it.
        operand: u64,
    },
    /// A barrier.
    Barrier(Barrier),
}
