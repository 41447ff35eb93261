//! The host-to-EL2 command block: what the host writes, what EL2 answers.
//!
//! The host fills a [`Command`] (an [`Op`] code and up to six argument
//! words) in memory it shares with EL2 and traps to EL2 (an `HVC`); EL2
//! copies the block, checks every argument, acts, and writes `status` (0 or
//! a negative [`HypError`] code) and the result words. The layout is
//! `#[repr(C)]` and fixed: 4 + 4 + 6 * 8 + 4 * 8 = 88 bytes.
//!
//! | op | args | ret\[0\] |
//! |---|---|---|
//! | `VM_INIT` 1 | mode ([`LogMode`]), ring entries (ring only, else 0) | root table PA |
//! | `VM_DESTROY` 2 (every vCPU stopped) | - | - |
//! | `MEMSLOT_SET` 3 | slot, flags (bit 0 log, bit 1 read-only, bit 2 post-copy: 4 KiB backing pages only, set at creation), IPA, size (0 deletes), backing PA, backing page size | - |
//! | `LOG_SET` 4 | slot, on (0/1), mode (must be the VM's) | - |
//! | `GET_DIRTY` 5 | slot, bitmap PA, bitmap bytes | pages dirty |
//! | `CLEAR_DIRTY` 6 | slot, first page, pages, bitmap PA, bitmap bytes | pages protected |
//! | `RING_HARVEST` 7 | output PA, output bytes ([`RingEntry`] each) | entries |
//! | `RING_RESET` 8 | - | entries reset |
//! | `UNMAP_RANGE` 9 | backing PA, size | leaves unmapped |
//! | `COLLAPSE` 10 | slot | blocks collapsed |
//! | `COUNTERS` 11 | output PA, output bytes ([`Counters`]) | - |
//! | `PAGE_READY` 12 | slot (post-copy), page offset in the slot | pages mapped (1) |
//! | `REMAP_PAGE` 13 | a page of a slot's backing (as `MEMSLOT_SET` named it), new PA | leaves unmapped, the PA the page was at |
//! | `MEMSLOT_DELETE_LOGGED` 14 | slot (logging, bitmap modes), bitmap PA, bitmap bytes | pages dirty |
//! | `PACE` 15 | throttle in ns per page dirtied (at most 600 s), pace in pages a second per vCPU (at most 10^9); 0 turns each off | - |
//!
//! Every PA argument that EL2 writes to or reads from must lie inside the
//! shared area; backing PAs must lie in guest RAM and outside the carve-out.

/// A command block ([module documentation](self)).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Command {
    /// The operation ([`Op`] as `u32`).
    pub op: u32,
    /// EL2's answer: 0, or a negative [`HypError`] code.
    pub status: i32,
    /// The arguments, per operation.
    pub args: [u64; 6],
    /// The results, per operation (zero on error).
    pub ret: [u64; 4],
}

impl Command {
    /// A block for `op` with `args` (missing ones 0).
    pub fn new(op: Op, args: &[u64]) -> Self {
        let mut c = Command {
            op: op as u32,
            ..Command::default()
        };
        for (d, s) in c.args.iter_mut().zip(args) {
            *d = *s;
        }
        c
    }
}

/// The operations.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Creates the VM's stage 2 with a dirty-logging mode.
    VmInit = 1,
    /// Drops the VM's stage 2, its slots and tables.
    VmDestroy = 2,
    /// Creates, moves, changes the flags of, or deletes a memslot.
    MemslotSet = 3,
    /// Turns dirty logging on or off for a slot.
    LogSet = 4,
    /// Copies a slot's dirty bitmap into shared memory.
    GetDirty = 5,
    /// Protects the pages a bitmap in shared memory names.
    ClearDirty = 6,
    /// Copies every vCPU ring's harvested entries into shared memory.
    RingHarvest = 7,
    /// Re-protects the harvested ring entries.
    RingReset = 8,
    /// Unmaps whatever maps a range of backing memory (the MMU notifier).
    UnmapRange = 9,
    /// Stops logging on a slot and collapses its pages back into blocks.
    Collapse = 10,
    /// Copies EL2's counters into shared memory.
    Counters = 11,
    /// Post-copy: the host filled a page of a post-copy slot; EL2 maps it.
    PageReady = 12,
    /// Moves one page of a slot's backing to another page of RAM (the MMU
    /// notifier around a host page migration): EL2 unmaps it, holds its
    /// faults, copies it and from then on maps the new page.
    RemapPage = 13,
    /// Deletes a logging slot and copies its last dirty log into shared
    /// memory, the slot's mappings gone and its faults held before the log
    /// is read: no write between the host's last harvest and the delete
    /// goes unlogged.
    MemslotDeleteLogged = 14,
    /// Sets the brakes on the guest's dirtying: auto-converge's throttle
    /// and the dirty limit's pace, applied in EL2's write-fault path
    /// ([`crate::pace`]).
    Pace = 15,
}

impl Op {
    /// The operation with code `code`, if any.
    pub fn from_code(code: u32) -> Option<Op> {
        const ALL: [Op; 15] = [
            Op::VmInit,
            Op::VmDestroy,
            Op::MemslotSet,
            Op::LogSet,
            Op::GetDirty,
            Op::ClearDirty,
            Op::RingHarvest,
            Op::RingReset,
            Op::UnmapRange,
            Op::Collapse,
            Op::Counters,
            Op::PageReady,
            Op::RemapPage,
            Op::MemslotDeleteLogged,
            Op::Pace,
        ];
        ALL.into_iter().find(|o| *o as u32 == code)
    }
}

/// The dirty-logging modes a VM can run.
#[repr(u64)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LogMode {
    /// Write protection, a GET protects what it reports (`wp-get`, the
    /// engine's `DirtyMode::Bitmap` with `Protect::OnGet`).
    WpGet = 0,
    /// Write protection, manual protect (GET copies, CLEAR protects): the
    /// engine's `DirtyMode::WP` (`wp`, also called `manual`).
    Manual = 1,
    /// Write protection into per-vCPU rings.
    Ring = 2,
    /// Hardware dirty state (DBM), manual protect: the engine's
    /// `DirtyMode::HW` (`hw`).
    Hw = 3,
}

impl LogMode {
    /// The mode with code `code`, if any.
    pub fn from_code(code: u64) -> Option<LogMode> {
        [LogMode::WpGet, LogMode::Manual, LogMode::Ring, LogMode::Hw]
            .into_iter()
            .find(|m| *m as u64 == code)
    }
}

/// EL2's error codes (`status` is the negated value).
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HypError {
    /// The op code names no operation.
    UnknownOp = 1,
    /// An argument that must be zero, 0/1 or a known code is not.
    BadArgument = 2,
    /// A size is zero where it must not be, or not a whole number of pages.
    BadSize = 3,
    /// An address is not aligned as it must be.
    Misaligned = 4,
    /// An address plus a size wraps, or leaves the IPA space.
    Overflow = 5,
    /// The slot id is not below [`crate::MAX_SLOTS`].
    SlotOutOfRange = 6,
    /// The slot's guest range overlaps another slot's.
    SlotOverlap = 7,
    /// The slot's backing overlaps another slot's backing.
    BackingOverlap = 8,
    /// The backing (or a range to unmap) touches EL2's carve-out.
    CarveOut = 9,
    /// The backing is not guest RAM.
    NotRam = 10,
    /// A buffer is not inside the area shared with the host.
    OutsideShared = 11,
    /// A buffer is too small for what it must hold.
    TooSmall = 12,
    /// No VM exists.
    NoVm = 13,
    /// A VM exists already.
    VmExists = 14,
    /// The mode is not the VM's (or the operation is not for its mode).
    WrongMode = 15,
    /// No slot has this id.
    NoSuchSlot = 16,
    /// A slot's backing cannot change (delete it and create it again).
    BackingChanged = 17,
    /// The slot does not log.
    NotLogging = 18,
    /// EL2 ran out of table pages or heap.
    OutOfMemory = 19,
    /// The engine refused for another reason (its checks, a ring full).
    Engine = 20,
    /// A pace needs a clock, and EL2 has none (the counter's frequency,
    /// `CNTFRQ_EL0`, is not set).
    NoClock = 21,
}

impl HypError {
    /// Every error, in code order.
    pub const ALL: [HypError; 21] = [
        HypError::UnknownOp,
        HypError::BadArgument,
        HypError::BadSize,
        HypError::Misaligned,
        HypError::Overflow,
        HypError::SlotOutOfRange,
        HypError::SlotOverlap,
        HypError::BackingOverlap,
        HypError::CarveOut,
        HypError::NotRam,
        HypError::OutsideShared,
        HypError::TooSmall,
        HypError::NoVm,
        HypError::VmExists,
        HypError::WrongMode,
        HypError::NoSuchSlot,
        HypError::BackingChanged,
        HypError::NotLogging,
        HypError::OutOfMemory,
        HypError::Engine,
        HypError::NoClock,
    ];

    /// The `status` value: the negated code.
    pub const fn status(self) -> i32 {
        -(self as i32)
    }

    /// The error a `status` value names (`None` for 0 or an unknown code).
    pub fn from_status(status: i32) -> Option<HypError> {
        Self::ALL.into_iter().find(|e| e.status() == status)
    }
}

/// One harvested ring entry in shared memory (KVM's `kvm_dirty_gfn`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingEntry {
    /// The slot.
    pub slot: u32,
    /// Zero.
    pub pad: u32,
    /// The page's offset in the slot, in pages.
    pub offset: u64,
}

/// EL2's counters in shared memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Aborts answered at EL2 (mapped or marked, the guest resumed).
    pub aborts_handled: u64,
    /// Aborts refused: no slot, the carve-out among them.
    pub aborts_refused: u64,
    /// Aborts passed to the host (a full ring, an engine error).
    pub aborts_to_host: u64,
    /// Translation faults the engine saw (first touch).
    pub translation: u64,
    /// Permission faults the engine saw (write protection).
    pub permission: u64,
    /// Pages newly marked dirty by faults.
    pub dirtied: u64,
    /// Blocks collapsed back in place.
    pub collapsed: u64,
    /// Commands answered with 0.
    pub commands_ok: u64,
    /// Commands answered with an error.
    pub commands_refused: u64,
    /// Table pages in use.
    pub table_pages: u64,
    /// Aborts answered at EL2 and then passed to the host for the vCPU to
    /// wait out its throttle or pace ([`crate::AbortOutcome::Paced`]).
    pub paced_exits: u64,
    /// Pages dirtied by a vCPU ahead of its pace.
    pub paced_pages: u64,
    /// Nanoseconds of throttle handed to the host to wait.
    pub throttle_ns: u64,
    /// Nanoseconds of lead over the pace handed to the host to wait.
    pub pace_ns: u64,
}

impl Counters {
    /// The words `COUNTERS` writes, in field order.
    pub fn to_words(&self) -> [u64; 14] {
        [
            self.aborts_handled,
            self.aborts_refused,
            self.aborts_to_host,
            self.translation,
            self.permission,
            self.dirtied,
            self.collapsed,
            self.commands_ok,
            self.commands_refused,
            self.table_pages,
            self.paced_exits,
            self.paced_pages,
            self.throttle_ns,
            self.pace_ns,
        ]
    }

    /// The counters from the words `COUNTERS` wrote.
    pub fn from_words(w: &[u64; 14]) -> Counters {
        Counters {
            aborts_handled: w[0],
            aborts_refused: w[1],
            aborts_to_host: w[2],
            translation: w[3],
            permission: w[4],
            dirtied: w[5],
            collapsed: w[6],
            commands_ok: w[7],
            commands_refused: w[8],
            table_pages: w[9],
            paced_exits: w[10],
            paced_pages: w[11],
            throttle_ns: w[12],
            pace_ns: w[13],
        }
    }
}
