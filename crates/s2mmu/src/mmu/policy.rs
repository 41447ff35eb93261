//! The switchable policies of an [`Mmu`](super::Mmu): every seed's optimisation and
//! its baseline, one typed field each.

use crate::ops::SplitPolicy;
use crate::tlb::{LargeRangePolicy, TlbPolicy};

/// How faults take the MMU lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultPath {
    /// A write to a write-protected page is fixed under the read lock by
    /// compare-and-swap; only faults that allocate or split take the write
    /// lock.
    ReadLockFastPath,
    /// Every fault takes the write lock (the seeds' baseline, with the
    /// `baselines` feature only).
    #[cfg(feature = "baselines")]
    WriteLock,
}

/// The switchable policies of an [`Mmu`](super::Mmu). Every field is independent of
/// the others: a choice that only makes sense with another lives inside
/// it ([`DirtyMode`] carries its protection and block rule), so no
/// combination can be written that [`Mmu::new`](super::Mmu::new) would have to refuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmuPolicy {
    /// How faults take the lock.
    pub fault_path: FaultPath,
    /// Eager split when logging starts, with this chunk size in bytes, a
    /// multiple of the page size up to [`MAX_EAGER_SPLIT_CHUNK`] (the lock
    /// is dropped and the page cache topped up between chunks);
    /// `None` splits huge mappings on the first write fault instead.
    pub eager_split_chunk: Option<u64>,
    /// How the split walk moves.
    pub split_walk: SplitPolicy,
    /// What to do with range invalidations above the limit.
    pub tlb_large_range: LargeRangePolicy,
    /// The range limit in pages.
    pub tlb_limit_pages: u64,
    /// How dirty pages are tracked while a slot logs, with the choices
    /// that belong to that mode.
    pub dirty: DirtyMode,
    /// What happens to the page mappings of huge-page-backed regions when
    /// logging stops.
    pub huge_page_recovery: HugePageRecovery,
    /// vCPUs (by index) whose fault-path reads of the MMU lock go through
    /// a reader slot of their own while no writer is around ([`lock`](super::lock)),
    /// instead of the rwlock's shared reader count; 0 keeps KVM's plain
    /// rwlock for every reader. At most [`MAX_VCPUS`].
    pub reader_slots: usize,
}

/// When a bitmap mode write-protects (or, with hardware dirty state,
/// cleans) the pages it reports dirty.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protect {
    /// `KVM_GET_DIRTY_LOG` alone: a GET takes the bitmap and protects the
    /// pages it reports (no manual protect).
    OnGet,
    /// Manual protect (`KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2`): a GET only
    /// copies the bitmap; `KVM_CLEAR_DIRTY_LOG` protects.
    Manual {
        /// Bitmaps start all set and enabling logging protects nothing
        /// (`KVM_DIRTY_LOG_INITIALLY_SET`): the CLEARs protect lazily.
        initially_set: bool,
    },
}

impl Protect {
    /// Manual protect with bitmaps that start clear (the default).
    pub const MANUAL: Protect = Protect::Manual {
        initially_set: false,
    };

    /// [`Protect::MANUAL`] where `manual`, else [`Protect::OnGet`] (for a
    /// command-line switch or a test's loop over both).
    pub const fn manual_if(manual: bool) -> Protect {
        if manual {
            Protect::MANUAL
        } else {
            Protect::OnGet
        }
    }

    /// Whether CLEAR protects and GET only copies.
    pub const fn manual(self) -> bool {
        matches!(self, Protect::Manual { .. })
    }

    /// Whether bitmaps start all set.
    pub const fn initially_set(self) -> bool {
        matches!(
            self,
            Protect::Manual {
                initially_set: true
            }
        )
    }
}

/// How dirty pages are tracked while a slot logs: one value per mode,
/// each carrying the choices that exist for it only (the one dirty-mode
/// type of the workspace: the CLI parses it with [`DirtyMode::from_str`]).
/// The engine runs it as one strategy object ([`Mmu::new`](super::Mmu::new)).
///
/// Choices of one mode cannot be given to another: PML has no block rule,
/// rings no protection choice.
///
/// ```compile_fail,E0559
/// use s2mmu::mmu::{DirtyMode, HwDirtyBlocks, Protect};
/// let _ = DirtyMode::Pml { protect: Protect::MANUAL, blocks: HwDirtyBlocks::LogWholeBlocks };
/// ```
///
/// [`DirtyMode::from_str`]: core::str::FromStr::from_str
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DirtyMode {
    /// Write protection; the first write to a page after a harvest faults
    /// and marks the slot's bitmap (`KVM_GET_DIRTY_LOG`, and
    /// `KVM_CLEAR_DIRTY_LOG` with manual protect).
    Bitmap {
        /// When pages are protected again.
        protect: Protect,
    },
    /// Write protection; the fault pushes the page to the vCPU's ring of
    /// this many entries (`KVM_CAP_DIRTY_LOG_RING`: a power of two,
    /// 256..=65536). Rings are harvested and reset, never read as bitmaps.
    Ring {
        /// Entries per vCPU ring.
        entries: u32,
    },
    /// Hardware dirty state ([`crate::HwDirtyBits`]: arm64 FEAT_HAFDBS, DBM
    /// with VTCR_EL2.HD; x86 EPT accessed/dirty flags): a logged page is
    /// left tracked and clean instead of write-protected, the
    /// hardware records the first write in the leaf without a fault, and a
    /// GET scans the slot's leaves into its bitmap; protecting (CLEAR, or
    /// GET without manual protect) cleans them again. Needs a format with a
    /// hardware dirty state. The hypervisor must turn the hardware's
    /// updates on (arm64: VTCR_EL2.HA and HD; EPT: the EPTP's A/D flag).
    Hardware {
        /// When leaves are cleaned again.
        protect: Protect,
        /// What happens to huge mappings when logging starts.
        blocks: HwDirtyBlocks,
    },
    /// Hardware dirty state with x86 Page-Modification Logging ([`PmlLog`](super::PmlLog),
    /// Intel SDM 29.3.6): as [`DirtyMode::Hardware`] (logged leaves tracked
    /// and clean, no write fault, protection cleans the dirty flags of the
    /// pages harvested), but the CPU also appends each page whose dirty flag
    /// it sets to its vCPU's 512-entry log, and a GET flushes those logs
    /// into the slots' bitmaps instead of scanning the leaves. A full log
    /// exits to [`Mmu::flush_pml`](super::Mmu::flush_pml). Logs drain into bitmaps only. Huge
    /// mappings are always split first: PML logs the 4 KiB page written,
    /// not the block whose dirty flag the write set, so it has no block
    /// rule. On arm64 the nearest equivalent is FEAT_HDBSS (Armv9.5), which
    /// the simulated arm64 walker also runs as this mode.
    Pml {
        /// When leaves are cleaned again.
        protect: Protect,
    },
}

impl Default for DirtyMode {
    fn default() -> Self {
        DirtyMode::WP
    }
}

impl DirtyMode {
    /// Write protection into bitmaps, manual protect, bitmaps start clear.
    pub const WP: DirtyMode = DirtyMode::Bitmap {
        protect: Protect::MANUAL,
    };
    /// Hardware dirty state, manual protect, huge mappings split first.
    pub const HW: DirtyMode = DirtyMode::Hardware {
        protect: Protect::MANUAL,
        blocks: HwDirtyBlocks::SplitFirst,
    };
    /// Hardware dirty state, manual protect, huge mappings logged whole.
    pub const HW_BLOCKS: DirtyMode = DirtyMode::Hardware {
        protect: Protect::MANUAL,
        blocks: HwDirtyBlocks::LogWholeBlocks,
    };
    /// PML, manual protect.
    pub const PML: DirtyMode = DirtyMode::Pml {
        protect: Protect::MANUAL,
    };
    /// The ring size [`DirtyMode::from_str`] gives `ring` without one.
    ///
    /// [`DirtyMode::from_str`]: core::str::FromStr::from_str
    pub const DEFAULT_RING_ENTRIES: u32 = 4096;
    /// Every mode's name, as [`DirtyMode::name`] gives it and
    /// [`DirtyMode::from_str`] takes it.
    ///
    /// [`DirtyMode::from_str`]: core::str::FromStr::from_str
    pub const NAMES: [&'static str; 5] = ["wp", "ring", "hw", "hw-blocks", "pml"];

    /// The mode's short name (`wp`, `ring`, `hw`, `hw-blocks`, `pml`).
    pub const fn name(self) -> &'static str {
        match self {
            DirtyMode::Bitmap { .. } => "wp",
            DirtyMode::Ring { .. } => "ring",
            DirtyMode::Hardware {
                blocks: HwDirtyBlocks::LogWholeBlocks,
                ..
            } => "hw-blocks",
            DirtyMode::Hardware { .. } => "hw",
            DirtyMode::Pml { .. } => "pml",
        }
    }

    /// The mode in words, for reports (`bitmap`, `dirty ring`, `hardware
    /// dirty state`, `hardware dirty state, blocks logged whole`, `hardware
    /// dirty state with PML`): a report names a mode through this, not a
    /// `match` of its own, so a new mode needs no change there.
    pub const fn title(self) -> &'static str {
        match self {
            DirtyMode::Bitmap { .. } => "bitmap",
            DirtyMode::Ring { .. } => "dirty ring",
            DirtyMode::Hardware {
                blocks: HwDirtyBlocks::LogWholeBlocks,
                ..
            } => "hardware dirty state, blocks logged whole",
            DirtyMode::Hardware { .. } => "hardware dirty state",
            DirtyMode::Pml { .. } => "hardware dirty state with PML",
        }
    }

    /// The same mode protecting as `protect` says; a ring mode, which has
    /// no protection choice (its reset protects), is returned as it is.
    #[must_use]
    pub const fn with_protect(self, protect: Protect) -> Self {
        match self {
            DirtyMode::Bitmap { .. } => DirtyMode::Bitmap { protect },
            DirtyMode::Ring { entries } => DirtyMode::Ring { entries },
            DirtyMode::Hardware { blocks, .. } => DirtyMode::Hardware { protect, blocks },
            DirtyMode::Pml { .. } => DirtyMode::Pml { protect },
        }
    }

    /// The protection choice of a bitmap mode (`None` for rings).
    pub const fn protect(self) -> Option<Protect> {
        match self {
            DirtyMode::Bitmap { protect }
            | DirtyMode::Hardware { protect, .. }
            | DirtyMode::Pml { protect } => Some(protect),
            DirtyMode::Ring { .. } => None,
        }
    }

    /// Whether GET only copies and CLEAR protects (`false` for rings).
    pub const fn manual_protect(self) -> bool {
        match self.protect() {
            Some(p) => p.manual(),
            None => false,
        }
    }

    /// The ring size, for [`DirtyMode::Ring`].
    pub const fn ring_entries(self) -> Option<u32> {
        match self {
            DirtyMode::Ring { entries } => Some(entries),
            _ => None,
        }
    }

    /// Whether the hardware records writes in the leaves
    /// ([`DirtyMode::Hardware`], [`DirtyMode::Pml`]): for a VMM that must
    /// turn the hardware's updates on, and for reports. The engine asks
    /// its strategy object, not this.
    pub const fn hardware(self) -> bool {
        matches!(self, DirtyMode::Hardware { .. } | DirtyMode::Pml { .. })
    }

    /// Whether the hardware also logs the pages it dirties
    /// ([`DirtyMode::Pml`]).
    pub const fn pml(self) -> bool {
        matches!(self, DirtyMode::Pml { .. })
    }

    /// Whether slots keep bitmaps (every mode but rings).
    pub const fn bitmaps(self) -> bool {
        !matches!(self, DirtyMode::Ring { .. })
    }
}

/// The error of [`DirtyMode::from_str`]: the text named no mode.
///
/// [`DirtyMode::from_str`]: core::str::FromStr::from_str
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseDirtyModeError;

impl core::fmt::Display for ParseDirtyModeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "expected a dirty mode: wp, ring, ring:ENTRIES (a power of two, \
             256..=65536), hw, hw-blocks or pml"
        )
    }
}

impl core::str::FromStr for DirtyMode {
    type Err = ParseDirtyModeError;

    /// `wp` (also `bitmap`), `ring` ([`DirtyMode::DEFAULT_RING_ENTRIES`]),
    /// `ring:N`, `hw`, `hw-blocks`, `pml`; bitmap modes with manual
    /// protect and bitmaps that start clear ([`DirtyMode::with_protect`]
    /// changes that). The ring size is checked here for being a number
    /// only; [`Mmu::new`](super::Mmu::new) checks its range.
    fn from_str(s: &str) -> core::result::Result<Self, Self::Err> {
        Ok(match s {
            "wp" | "bitmap" => DirtyMode::WP,
            "ring" => DirtyMode::Ring {
                entries: DirtyMode::DEFAULT_RING_ENTRIES,
            },
            "hw" => DirtyMode::HW,
            "hw-blocks" => DirtyMode::HW_BLOCKS,
            "pml" => DirtyMode::PML,
            _ => match s.strip_prefix("ring:").map(str::parse) {
                Some(Ok(entries)) => DirtyMode::Ring { entries },
                _ => return Err(ParseDirtyModeError),
            },
        })
    }
}

/// What happens to huge mappings (blocks) of a slot that starts logging
/// with hardware dirty state: the trade-off between the split's cost and
/// the log's resolution.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HwDirtyBlocks {
    /// Split them into pages first (eager split, in the chunks
    /// [`MmuPolicy::eager_split_chunk`] says, 1 GiB if it says none), so
    /// the hardware dirties and the harvest reports single pages: what KVM
    /// does (x86 maps no huge page in a logged slot; the arm64 DBM series
    /// splits before it relies on DBM).
    #[default]
    SplitFirst,
    /// Leave them: a block is tracked and cleaned as one leaf, the
    /// hardware's first write to it dirties the whole block, and the
    /// harvest reports every page of it. No split when logging starts (nor
    /// on CLEAR with initially-set bitmaps), at the price of reporting (and
    /// a migration copying) up to a block's worth of pages per write.
    LogWholeBlocks,
}

/// What happens to the page mappings of a huge-page-backed region when
/// its slot stops logging.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HugePageRecovery {
    /// Left as pages (arm64 KVM today).
    Off,
    /// Unmapped, so later faults map blocks again (x86's huge-page
    /// recovery).
    #[default]
    Unmap,
    /// Collapsed back into blocks in place (KVM x86 since 6.13), so the
    /// guest takes no fault for its huge pages.
    Collapse,
}

/// The default eager-split chunk, 1 GiB: split, then drop the MMU lock and
/// top the page cache up, once per chunk (KVM's
/// `eager_split_chunk_size` default is a 2 MiB block's worth; arm64 uses
/// the chunk size userspace sets, QEMU 1 GiB).
pub const EAGER_SPLIT_CHUNK: u64 = 1 << 30;

/// The largest eager-split chunk [`Mmu::new`](super::Mmu::new) accepts, 1 GiB: a chunk's
/// split is done under one hold of the MMU write lock with the table pages
/// topped up for it first, so the chunk bounds both the lock hold and that
/// allocation (KVM arm64 accepts block sizes only, 1 GiB at most with 4 KiB
/// pages).
pub const MAX_EAGER_SPLIT_CHUNK: u64 = 1 << 30;

/// The most vCPUs an [`Mmu`](super::Mmu) may have ([`Mmu::new_vcpu`](super::Mmu::new_vcpu)) and the most
/// reader slots its lock may have ([`MmuPolicy::reader_slots`]): x86 KVM's
/// `KVM_MAX_VCPUS`.
pub const MAX_VCPUS: usize = 4096;

/// Bytes write-protected or cleared per hold of the MMU write lock (QEMU's
/// default clear chunk is the same size).
pub const LOCK_CHUNK: u64 = 1 << 30;

/// With hardware dirty state, a CLEAR cleans a last-level table's worth of
/// bitmap words in one masked walk when they hold more than this many runs
/// of set bits, and by a walk per run otherwise (`Mmu::with_sparse_clear_runs`,
/// with the `test-hooks` feature, changes it).
/// 1: `s2mmu harvest-perf --size 16G --sparse-clear-runs 0`, which times both
/// in one process, had the masked walk at about 1.1 times the walk per run
/// with one run per table (`--dirty-every 512`) and 0.6 to 0.8 times with
/// 2 to 8 (`--dirty-every 256`, `128`, `64`).
pub const SPARSE_CLEAR_RUNS: u32 = 1;

impl Default for MmuPolicy {
    fn default() -> Self {
        MmuPolicy {
            fault_path: FaultPath::ReadLockFastPath,
            eager_split_chunk: Some(EAGER_SPLIT_CHUNK),
            split_walk: SplitPolicy::SkipReturns,
            tlb_large_range: LargeRangePolicy::WholeVmid,
            tlb_limit_pages: TlbPolicy::DEFAULT_LIMIT_PAGES,
            dirty: DirtyMode::WP,
            huge_page_recovery: HugePageRecovery::Unmap,
            reader_slots: 256,
        }
    }
}

impl MmuPolicy {
    /// The baseline of every optimisation: write-lock faults, split on
    /// fault, full split walk, split TLB calls (with the `baselines`
    /// feature only).
    #[cfg(feature = "baselines")]
    pub fn baseline() -> Self {
        MmuPolicy {
            fault_path: FaultPath::WriteLock,
            eager_split_chunk: None,
            split_walk: SplitPolicy::FullWalk,
            tlb_large_range: LargeRangePolicy::SplitCalls,
            ..MmuPolicy::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::DirtyMode;

    #[test]
    fn every_named_mode_has_its_own_title() {
        let titles: alloc::vec::Vec<&str> = DirtyMode::NAMES
            .iter()
            .map(|n| {
                n.parse::<DirtyMode>()
                    .expect("a listed name parses")
                    .title()
            })
            .collect();
        for (i, t) in titles.iter().enumerate() {
            assert!(!t.is_empty(), "{}", DirtyMode::NAMES[i]);
            assert!(!titles[..i].contains(t), "{t} twice");
        }
    }
}
