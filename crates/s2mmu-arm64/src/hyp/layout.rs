//! The guest-physical layout the host and the EL2 stub agree on, and the
//! mailbox format. The assembly (`asm/hyp.S`, `asm/hyp.ld`) holds the same
//! numbers.
//!
//! ```text
//! 0x4000_0000  RAM base (QEMU virt); QEMU's device tree at its start
//! 0x4008_0000  EL2 stub text          (asm/hyp.ld)
//! 0x4010_0000  guest code, 64 KiB      mapped for the guest by the engine
//! 0x4020_0000  control block
//! 0x4020_1000  mailboxes, 8 KiB per CPU
//! 0x4024_0000  EL2 stacks, 32 KiB per CPU
//! 0x4030_0000  scratch (AT lists)       up to TABLES
//! 0x4100_0000  table arena              (the engine's MmOps)
//!              EL2 placement instead: the engine's code and data
//!              (asm/hyp_el2.ld), its heap at 0x4200_0000 (16 MiB) and
//!              table pool at 0x4300_0000 (64 MiB); 0x4000_0000 to DATA
//!              is EL2's carve-out
//! 0x6000_0000  guest data               (memslots' host memory)
//! ```

/// Where the `virt` machine's RAM starts.
pub const RAM_BASE: u64 = 0x4000_0000;
/// The guest code region (64 KiB aligned, so every granule can map it).
pub const GUEST_TEXT: u64 = 0x4010_0000;
/// Size of the guest code region.
pub const GUEST_TEXT_SIZE: u64 = 0x1_0000;
/// The control block.
pub const CTL: u64 = 0x4020_0000;
/// Boot CPU's "alive" word value.
pub const CTL_MAGIC: u64 = 0x7332_3275_6d6d_6d73;
/// Control block: number of CPUs the boot CPU starts.
pub const CTL_GO: u64 = 0x08;
/// Control block: the first non-zero PSCI error.
pub const CTL_PSCI_ERR: u64 = 0x10;
/// Control block: one "alive" word per CPU.
pub const CTL_ALIVE: u64 = 0x100;
/// First mailbox.
pub const MBOX0: u64 = 0x4020_1000;
/// Bytes per mailbox.
pub const MBOX_SIZE: u64 = 0x2000;
/// Most CPUs (the stub numbers CPUs by MPIDR Aff0 within one cluster).
pub const MAX_CPUS: usize = 8;
/// A CPU waiting for a command makes [`IDLE_SHORT_WAITS`] waits of
/// [`mb::IDLE_TICKS`] (20 µs), then doubles its wait after each one that
/// brought none, up to `IDLE_TICKS << IDLE_BACKOFF_SHIFT` (640 µs): a fixed
/// 20 µs kept every idle CPU waking QEMU tens of thousands of times a
/// second.
pub const IDLE_BACKOFF_SHIFT: u32 = 5;
/// The shortest idle waits a CPU makes before it backs off (a harvest's
/// commands come closer together than 64 times 20 µs).
pub const IDLE_SHORT_WAITS: u64 = 64;
/// A guest's exit waits for the host's answer as an idle CPU waits for a
/// command, with a shorter ramp and cap (an answer is usually a few µs
/// away, and the cap adds to a late answer's latency at worst):
/// [`EXIT_SHORT_WAITS`] waits of 20 µs, then doubling up to
/// `IDLE_TICKS << EXIT_BACKOFF_SHIFT` (320 µs). At a fixed 20 µs an answer
/// that came late (a host thread that napped, a loaded host) cost a QEMU
/// main-loop wake-up per 20 µs.
pub const EXIT_BACKOFF_SHIFT: u32 = 4;
/// The 20 µs waits for an answer before the stub backs off.
pub const EXIT_SHORT_WAITS: u64 = 4;
/// Scratch space for AT lists.
pub const SCRATCH: u64 = 0x4030_0000;
/// The table arena.
pub const TABLES: u64 = 0x4100_0000;
/// Guest data: the memory behind memslots.
pub const DATA: u64 = 0x6000_0000;

/// Mailbox fields (byte offsets).
pub mod mb {
    /// Host increments after writing a command.
    pub const CMD_SEQ: u64 = 0x000;
    /// The stub sets it to `CMD_SEQ` when the command is done.
    pub const DONE_SEQ: u64 = 0x008;
    /// The command.
    pub const CMD: u64 = 0x010;
    /// The command's status.
    pub const RET: u64 = 0x018;
    /// Twelve arguments.
    pub const ARG0: u64 = 0x020;
    /// The stub increments when it posts an exit.
    pub const EXIT_SEQ: u64 = 0x080;
    /// The host sets it to `EXIT_SEQ` when it has answered.
    pub const REPLY_SEQ: u64 = 0x088;
    /// What the exit is ([`super::EXIT_ABORT`], ...).
    pub const EXIT_KIND: u64 = 0x090;
    /// ESR_EL2 of the exit.
    pub const ESR: u64 = 0x098;
    /// FAR_EL2.
    pub const FAR: u64 = 0x0a0;
    /// HPFAR_EL2.
    pub const HPFAR: u64 = 0x0a8;
    /// ELR_EL2.
    pub const ELR: u64 = 0x0b0;
    /// The guest's x0..x2 at the exit.
    pub const GX0: u64 = 0x0b8;
    /// The answer: resume, resume with x0/x1, stop.
    pub const ACTION: u64 = 0x0d0;
    /// x0, x1 to resume with.
    pub const REPLY_X0: u64 = 0x0d8;
    /// Number of maintenance instructions in the answer.
    pub const REPLY_NINSN: u64 = 0x0e8;
    /// Exits answered with a resume.
    pub const STAT_EXITS: u64 = 0x0f0;
    /// Counter ticks from exit entry to ERET, summed.
    pub const STAT_TICKS: u64 = 0x0f8;
    /// Unknown instructions the stub was asked to execute (or 0xdead after
    /// an exception at EL2).
    pub const BAD_INSN: u64 = 0x110;
    /// Counter ticks of the shortest idle wait (20 µs), set by the stub at
    /// start.
    pub const IDLE_TICKS: u64 = 0x120;
    /// Idle waits this CPU has made (timer wake-ups while it waited for a
    /// command or for the host's answer).
    pub const IDLE_WAITS: u64 = 0x128;
    /// The value of the faulting access's register (ESR ISS.SRT): what an
    /// MMIO write stores.
    pub const MMIO_DATA: u64 = 0x130;
    /// The physical INTID of an [`super::EXIT_IRQ`] exit.
    pub const INTID: u64 = 0x138;
    /// ICH_LR0_EL2..ICH_LR3_EL2 at the exit; the host's values for
    /// [`super::ACT_LINUX`].
    pub const LR0: u64 = 0x140;
    /// ICH_HCR_EL2 for [`super::ACT_LINUX`].
    pub const ICH_HCR: u64 = 0x160;
    /// ELR_EL2 to resume at for [`super::ACT_LINUX`].
    pub const NEW_ELR: u64 = 0x168;
    /// CNTV_CTL_EL0 at the exit.
    pub const CNTV_CTL: u64 = 0x170;
    /// CNTV_CVAL_EL0 at the exit.
    pub const CNTV_CVAL: u64 = 0x178;
    /// ICH_MISR_EL2 at the exit.
    pub const ICH_MISR: u64 = 0x180;
    /// ICH_VMCR_EL2 at the exit.
    pub const ICH_VMCR: u64 = 0x188;
    /// SPSR_EL2 at the exit.
    pub const SPSR: u64 = 0x190;
    /// CNTPCT_EL0 when the stub picked the current command up (after
    /// its idle wait, if it was in one).
    pub const T_PICKUP: u64 = 0x198;
    /// CNTPCT_EL0 when the stub finished it, just before `DONE_SEQ`:
    /// `T_DONE - T_PICKUP` is the command's own time at EL2, without the
    /// wait for the pickup.
    pub const T_DONE: u64 = 0x1a0;
    /// CNTFRQ_EL0, set by the stub at start (counter ticks per second).
    pub const CNTFRQ: u64 = 0x1a8;
    /// The host's park: when above the idle cap (20 µs <<
    /// [`super::IDLE_BACKOFF_SHIFT`]), a CPU waiting for a command backs
    /// off to waits of this many counter ticks instead; 0 (the stub's
    /// start) is not parked. Set through [`crate::machine::Mailbox::park`].
    pub const PARK_TICKS: u64 = 0x1b0;
    /// Non-zero while the host thread serving this CPU's exits sleeps
    /// ([`crate::machine::Mailbox::sleep_until_exit`]): the stub rings its
    /// doorbell after posting an exit.
    pub const HOST_WAITING: u64 = 0x1b8;
    /// The byte the stub writes to ring (its CPU index plus one).
    pub const BELL_BYTE: u64 = 0x1c0;
    /// Doorbells the stub has rung.
    pub const BELLS: u64 = 0x1c8;
    /// Bell bytes from the host the stub has taken from its UART
    /// ([`crate::machine::Machine::ring_in`]).
    pub const BELLS_IN: u64 = 0x1d0;
    /// Kicks the stub took in its command loop, outside any guest.
    pub const KICKS_TAKEN: u64 = 0x1d8;
    /// What EL2's engine did with an abort the stub then posted (the EL2
    /// placement, `asm/el2_mmu.S`): 1 no slot, 2 ring full, 3 page
    /// missing, 4 anything else, 5 answered with a wait owed
    /// ([`EL2_THROTTLE_NS`], [`EL2_PACE_NS`]).
    pub const EL2_OUTCOME: u64 = 0x3c0;
    /// Stage-2 aborts answered at EL2 without an exit (EL2 placement).
    pub const EL2_FAULTS: u64 = 0x3c8;
    /// Their counter ticks, from the vector's entry to the `ERET`.
    pub const EL2_TICKS: u64 = 0x3d0;
    /// Stage-2 abort exits the host's engine answered (host placement:
    /// not MMIO, not an injected exception).
    pub const S2_EXITS: u64 = 0x3d8;
    /// Their counter ticks, from the vector's entry to the `ERET`.
    pub const S2_TICKS: u64 = 0x3e0;
    /// A paced abort's throttle owed, in nanoseconds (EL2 placement: the
    /// engine at EL2 writes it with outcome 5).
    pub const EL2_THROTTLE_NS: u64 = 0x3e8;
    /// A paced abort's lead over the pace, in nanoseconds.
    pub const EL2_PACE_NS: u64 = 0x3f0;
    /// The new PSTATE for [`super::ACT_INJECT`], less the bits the stub
    /// adds from SCTLR_EL1 (the last word before the reply's instructions,
    /// away from the fields other work adds after [`BELLS`]).
    pub const INJ_PSTATE: u64 = 0x3f8;
    /// Where the stub's stack starts (its top): the guest's x0..x30 lie in
    /// the frame just below it during an exit.
    pub const STACK_TOP: u64 = 0x108;
    /// The answer's instruction list.
    pub const REPLY_INSNS: u64 = 0x400;
    /// Capacity of the answer's list.
    pub const REPLY_CAP: usize = ((CMD_INSNS - REPLY_INSNS) / 16) as usize;
    /// A TLBI command's instruction list.
    pub const CMD_INSNS: u64 = 0x1000;
    /// Capacity of a TLBI command's list.
    pub const CMD_CAP: usize = ((super::MBOX_SIZE - CMD_INSNS) / 16) as usize;
}

/// Command: do nothing (a round trip).
pub const CMD_PING: u64 = 1;
/// Command: run guest code until the host stops it.
pub const CMD_RUN: u64 = 2;
/// Command: execute a list of maintenance instructions.
pub const CMD_TLBI: u64 = 3;
/// Command: translate a list of IPAs with AT S12E1R/W.
pub const CMD_AT: u64 = 4;
/// Command: run a Linux vCPU from its reset state (see `asm/hyp.S`).
pub const CMD_LINUX: u64 = 5;
/// Command: send the SGI in arg0 (an ICC_SGI1R_EL1 value) from EL2.
pub const CMD_KICK: u64 = 6;
/// Command: hand EL2's engine the `s2mmu_el2` command block in args
/// 2..8 (args 0, 1: VTCR_EL2, VTTBR_EL2); the EL2 placement's stub only.
pub const CMD_EL2: u64 = 0x30;
/// Command: route the host's bell (the UART's receive interrupt) to this
/// CPU.
pub const CMD_BELL_IN: u64 = 7;
/// Bytes of the stub's exception frame (x0..x30 at 8-byte steps).
pub const FRAME: u64 = 256;

/// Exit: a stage-2 abort (EC 0x24 or 0x20).
pub const EXIT_ABORT: u64 = 1;
/// Exit: HVC from the guest.
pub const EXIT_HVC: u64 = 2;
/// Exit: anything else.
pub const EXIT_OTHER: u64 = 3;
/// Exit: a physical interrupt taken from the guest (INTID in
/// [`mb::INTID`]).
pub const EXIT_IRQ: u64 = 4;

/// Answer: resume the guest.
pub const ACT_RESUME: u64 = 0;
/// Answer: resume with new x0 and x1.
pub const ACT_RESUME_X0: u64 = 1;
/// Answer: stop the guest; the RUN command completes.
pub const ACT_STOP: u64 = 2;
/// Answer: the host emulated the access (MMIO): a read gets x0 in its
/// register, and the instruction is skipped.
pub const ACT_MMIO: u64 = 3;
/// Answer: load the list registers, ICH_HCR_EL2 and ELR_EL2 from the
/// mailbox and the general registers from the frame, then resume.
pub const ACT_LINUX: u64 = 4;
/// Answer: as [`ACT_LINUX`], but deliver a synchronous exception to the
/// guest's EL1 first: ESR_EL1 and FAR_EL1 from the reply's x0 and x1,
/// ELR_EL1 and SPSR_EL1 from the guest's ELR_EL2 and SPSR_EL2, then
/// ELR_EL2 = VBAR_EL1 + [`mb::NEW_ELR`] (the vector's offset) and
/// SPSR_EL2 = [`mb::INJ_PSTATE`] with PAN (SCTLR_EL1.SPAN clear) and SSBS
/// (SCTLR_EL1.DSSBS set) added. See `linux::inject`.
pub const ACT_INJECT: u64 = 5;

/// Guest HVC x0: a pass is done, give me the next (memstress).
pub const HVC_PASS: u64 = 1;
/// Guest HVC x0: a probe's result.
pub const HVC_PROBE: u64 = 2;
/// Guest HVC x0: a page held another page's tag.
pub const HVC_BAD_TAG: u64 = 3;
