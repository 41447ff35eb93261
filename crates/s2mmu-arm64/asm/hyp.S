// s2mmu's EL2 stub for QEMU's `virt` machine (aarch64, virtualization=on).
//
// It is the hypervisor half of the nVHE split: the engine runs on the host,
// writes the stage-2 tables into guest RAM, and decides everything; this
// program only does what needs an arm64 CPU at EL2:
//   - load VTCR_EL2 / VTTBR_EL2 / HCR_EL2 and run guest code at EL1;
//   - report each exit from the guest (stage-2 abort, HVC, anything else)
//     to the engine through its CPU's mailbox, wait for the answer, execute
//     the TLB maintenance the answer lists, then resume or stop the guest;
//   - execute TLB maintenance the engine queues from a host thread
//     (the design's kvm_call_hyp);
//   - translate IPAs with AT S12E1R/W, so the host can compare what the
//     architecture's walker finds with what the engine's `translate` says.
//
// Every CPU runs the same command loop on its own mailbox. The layout of
// the control block and of a mailbox is mirrored in src/hyp/layout.rs.

        .arch   armv8.4-a

        .equ    CTL,            0x40200000
        .equ    MBOX0,          0x40201000
        .equ    MBOX_SZ,        0x2000
        .equ    STACK0,         0x40240000
        .equ    STACK_SZ,       0x8000
        .equ    CTL_GO,         0x08
        .equ    CTL_PSCI_ERR,   0x10
        .equ    CTL_ALIVE,      0x100

        // mailbox fields
        .equ    MB_CMD_SEQ,     0x000
        .equ    MB_DONE_SEQ,    0x008
        .equ    MB_CMD,         0x010
        .equ    MB_RET,         0x018
        .equ    MB_ARG0,        0x020
        .equ    MB_ARG4,        0x040
        .equ    MB_ARG8,        0x060
        .equ    MB_EXIT_SEQ,    0x080
        .equ    MB_REPLY_SEQ,   0x088
        .equ    MB_EXIT_KIND,   0x090
        .equ    MB_ESR,         0x098
        .equ    MB_FAR,         0x0a0
        .equ    MB_HPFAR,       0x0a8
        .equ    MB_ELR,         0x0b0
        .equ    MB_GX0,         0x0b8
        .equ    MB_GX2,         0x0c8
        .equ    MB_ACTION,      0x0d0
        .equ    MB_REPLY_X0,    0x0d8
        .equ    MB_REPLY_NINSN, 0x0e8
        .equ    MB_STAT_EXITS,  0x0f0
        .equ    MB_STAT_TICKS,  0x0f8
        .equ    MB_T_ENTRY,     0x100
        .equ    MB_STACK_TOP,   0x108
        .equ    MB_BAD_INSN,    0x110
        .equ    MB_ID,          0x118
        .equ    MB_IDLE_TICKS,  0x120
        .equ    MB_IDLE_WAITS,  0x128
        .equ    MB_MMIO_DATA,   0x130
        .equ    MB_INTID,       0x138
        .equ    MB_LR0,         0x140
        .equ    MB_ICH_HCR,     0x160
        .equ    MB_NEW_ELR,     0x168
        .equ    MB_CNTV_CTL,    0x170
        .equ    MB_CNTV_CVAL,   0x178
        .equ    MB_ICH_MISR,    0x180
        .equ    MB_ICH_VMCR,    0x188
        .equ    MB_SPSR,        0x190
        .equ    MB_T_PICKUP,    0x198
        .equ    MB_T_DONE,      0x1a0
        .equ    MB_CNTFRQ,      0x1a8
        .equ    MB_PARK_TICKS,  0x1b0
        .equ    MB_HOST_WAITING, 0x1b8
        .equ    MB_BELL_BYTE,   0x1c0
        .equ    MB_BELLS,       0x1c8
        .equ    MB_BELLS_IN,    0x1d0
        .equ    MB_KICKS_TAKEN, 0x1d8
        .equ    MB_EL2_OUTCOME, 0x3c0
        .equ    MB_EL2_FAULTS,  0x3c8
        .equ    MB_EL2_TICKS,   0x3d0
        .equ    MB_S2_EXITS,    0x3d8
        .equ    MB_S2_TICKS,    0x3e0
        .equ    MB_REPLY_INSNS, 0x400
        .equ    MB_CMD_INSNS,   0x1000

        .equ    CMD_PING,       1
        .equ    CMD_RUN,        2
        .equ    CMD_TLBI,       3
        .equ    CMD_AT,         4
        .equ    CMD_LINUX,      5
        .equ    CMD_KICK,       6
        .equ    CMD_BELL_IN,    7
        .equ    CMD_EL2,        0x30

        .equ    EXIT_ABORT,     1
        .equ    EXIT_HVC,       2
        .equ    EXIT_OTHER,     3
        .equ    EXIT_IRQ,       4

        .equ    ACT_RESUME,     0
        .equ    ACT_RESUME_X0,  1
        .equ    ACT_STOP,       2
        .equ    ACT_MMIO,       3
        .equ    ACT_LINUX,      4

        .equ    FRAME,          256

        // GICv3 of the virt machine (distributor, redistributors 128 KiB
        // apart), and the PPIs this program enables at EL2: the kick SGI,
        // the maintenance interrupt, the EL2 physical timer (idle waits)
        // and the EL1 virtual timer (a Linux guest's tick).
        .equ    GICD,           0x08000000
        .equ    GICR0,          0x080a0000
        .equ    GICR_STRIDE,    0x20000
        .equ    KICK_SGI,       15
        .equ    MAINT_INTID,    25
        .equ    TIMER_HYP_INTID, 26
        .equ    VTIMER_INTID,   27
        .equ    PPI_ENABLE,     (1 << KICK_SGI) | (1 << MAINT_INTID) | (1 << TIMER_HYP_INTID) | (1 << VTIMER_INTID)
        .equ    SPIN_BEFORE_IDLE, 2048
        // QEMU virt's PL011 UART0: the stub's only way out to the host
        // (the doorbell's byte, the panic message), written at EL2 with
        // the MMU off. No stage-2 table maps it: a guest cannot reach it.
        // QEMU starts without -semihosting, so a guest's HLT #0xf000 is
        // an UNDEF, not a host file or console call.
        .equ    UART0,          0x09000000
        .equ    UART_FR,        0x18            // flags: RXFE bit 4, TXFF bit 5
        .equ    UART_IMSC,      0x38            // interrupt mask set/clear
        .equ    UART_RXIM,      0x10            // the receive interrupt
        // The PL011's interrupt on virt: SPI 1. The host's bell into the
        // stub (machine.rs `ring_in`) is a byte on QEMU's stdin, which
        // the UART receives; routed to one CPU (CMD_BELL_IN), its
        // interrupt ends that CPU's idle WFI at once.
        .equ    UART_INTID,     33
        .equ    UART_CR,        0x30
        .equ    UART_CR_ON,     0x101           // UARTEN | TXE
        .equ    UART_CR_ON_RX,  0x301           // UARTEN | TXE | RXE
        // A CPU with no command waits IDLE_SHORT_WAITS times 20 us (a
        // harvest's commands come closer together than that), then doubles
        // its wait after each one that brought none, up to 20 us <<
        // IDLE_BACKOFF_SHIFT (640 us): at a fixed 20 us every idle CPU (the
        // service CPU, a destination's CPUs before the resume) woke QEMU's
        // timer thread and its own thread tens of thousands of times a
        // second, about a core in all, taken from the migration's threads.
        // A command now waits up to 640 us longer to be picked up after a
        // long idle.
        .equ    IDLE_SHORT_WAITS, 64
        .equ    IDLE_BACKOFF_SHIFT, 5
        // A guest's exit waits for the host's answer the same way, with a
        // shorter ramp and cap (an exit's answer is usually a few us
        // away, and the cap is added to an answer's latency at worst):
        // EXIT_SHORT_WAITS of 20 us, then up to 20 us << EXIT_BACKOFF_SHIFT
        // (320 us). Mirrored in src/hyp/layout.rs.
        .equ    EXIT_SHORT_WAITS, 4
        .equ    EXIT_BACKOFF_SHIFT, 4

        .include "el2_macros.S"

        // Adds x3 (ticks) to the mailbox's `ticks` and one to its `count`.
        // Clobbers x4.
        .macro  tally ticks, count
        ldr     x4, [x28, #\ticks]
        add     x4, x4, x3
        str     x4, [x28, #\ticks]
        ldr     x4, [x28, #\count]
        add     x4, x4, #1
        str     x4, [x28, #\count]
        .endm

        // System registers \a and \b to the mailbox's 16 bytes at \off.
        // Clobbers x4 and x5 (left holding them).
        .macro  post_pair a, b, off
        mrs     x4, \a
        mrs     x5, \b
        stp     x4, x5, [x28, #\off]
        .endm

        // System registers \a and \b from the mailbox's 16 bytes at \off.
        // Clobbers x3 and x4.
        .macro  take_pair off, a, b
        ldp     x3, x4, [x28, #\off]
        msr     \a, x3
        msr     \b, x4
        .endm

        // A guest's first ERET, from the mailbox: ELR_EL2 the entry (arg 3),
        // SPSR_EL2 EL1h with DAIF masked, x0..x3 from args 4..7.
        .macro  guest_entry
        ldr     x1, [x28, #MB_ARG0 + 24]
        msr     elr_el2, x1
        mov     x1, #0x3c5
        msr     spsr_el2, x1
        ldp     x0, x1, [x28, #MB_ARG4]
        ldp     x2, x3, [x28, #MB_ARG4 + 16]
        .endm

        // The host's answer to a Linux vCPU's exit, from the mailbox: the
        // list registers and ICH_HCR_EL2. Clobbers x3 and x4.
        .macro  load_list_regs
        take_pair MB_LR0, ich_lr0_el2, ich_lr1_el2
        take_pair MB_LR0+16, ich_lr2_el2, ich_lr3_el2
        ldr     x3, [x28, #MB_ICH_HCR]
        msr     ich_hcr_el2, x3
        .endm

        // VTCR_EL2 and VTTBR_EL2 from the mailbox's args 0 and 1; VTTBR is
        // written only when it changes (QEMU drops its TLB on a change).
        // Clobbers x1 and x2.
        .macro  load_vtcr_vttbr
        ldr     x1, [x28, #MB_ARG0]
        msr     vtcr_el2, x1
        ldr     x1, [x28, #MB_ARG0 + 8]
        mrs     x2, vttbr_el2
        cmp     x1, x2
        b.eq    1f
        msr     vttbr_el2, x1
1:
        .endm

        // A vector entry from the guest: x0-x30 into a frame on EL2's
        // stack, then on to `target`.
        .macro  save_guest target
        sub     sp, sp, #FRAME
        stp     x0, x1, [sp, #0]
        frame_x2_x30 stp, str, sp
        b       \target
        .endm

        .section .text.hyp, "ax"
        .include "asm/state.S"          // migration: vCPU state save/restore
        .include "asm/inject.S"         // exceptions injected into the guest
        .include "asm/el2_mmu.S"        // the engine at EL2 (EL2_ENGINE)
        .global _start
_start:
        // Every CPU enters here: the boot CPU from the loader, the others
        // from PSCI CPU_ON. The CPU index comes from MPIDR (virt: Aff0 is
        // the index within a cluster of 8, Aff1 the cluster).
.ifdef EL2_ENGINE
        // The engine runs here (Rust, its atomics and spin locks): EL2's
        // stage-1 MMU on before anything else, as asm/el2_mmu.S says.
        el2_stage1_on el2_l1
.endif
        mrs     x0, mpidr_el1
        and     x1, x0, #0xff
        ubfx    x0, x0, #8, #8
        add     x19, x1, x0, lsl #3
        ldr     x1, =STACK0
        add     x2, x19, #1
        mov     x3, #STACK_SZ
        madd    x1, x2, x3, x1
        mov     sp, x1
        ldr     x28, =MBOX0
        mov     x3, #MBOX_SZ
        madd    x28, x19, x3, x28
        msr     tpidr_el2, x28
        str     x1, [x28, #MB_STACK_TOP]
        str     x19, [x28, #MB_ID]
        add     x2, x19, #1
        str     x2, [x28, #MB_BELL_BYTE]        // the doorbell's byte
        adr     x1, vectors
        msr     vbar_el2, x1
        // CPTR_EL2: RES1 bits only, so FP/SIMD is not trapped (QEMU runs
        // with SVE and SME off).
        mov     x1, #0x33ff
        msr     cptr_el2, x1
        // A guest reads this CPU's MIDR and MPIDR (vCPU n is CPU n).
        mrs     x1, midr_el1
        msr     vpidr_el2, x1
        mrs     x1, mpidr_el1
        msr     vmpidr_el2, x1
        // EL1 may read the physical counter; no virtual offset.
        mov     x1, #3
        msr     cnthctl_el2, x1
        msr     cntvoff_el2, xzr
        // The GIC forwards the EL2 timer's interrupt to this CPU, so WFI
        // can sleep until the timer fires (at EL2 the interrupt stays
        // masked in PSTATE and only ends the WFI); the kick, maintenance
        // and virtual timer interrupts are taken from a running guest.
        ldr     x1, =GICD
        mov     w2, #0x13
        str     w2, [x1]                        // GICD_CTLR: ARE, Grp0, Grp1
        ldr     x1, =GICR0
        mov     x2, #GICR_STRIDE
        madd    x1, x19, x2, x1
        ldr     w2, [x1, #0x14]                 // GICR_WAKER
        bic     w2, w2, #2                      // ProcessorSleep = 0
        str     w2, [x1, #0x14]
1:      ldr     w2, [x1, #0x14]
        tbnz    w2, #2, 1b                      // until ChildrenAsleep = 0
        add     x1, x1, #0x10000                // SGI frame
        mov     w2, #-1
        str     w2, [x1, #0x80]                 // GICR_IGROUPR0: group 1
        ldr     w2, =PPI_ENABLE
        str     w2, [x1, #0x100]                // GICR_ISENABLER0
        mov     x2, #0xf
        msr     icc_sre_el2, x2                 // SRE, DFB, DIB, EL1 Enable
        isb
        mov     x2, #0xf0
        msr     icc_pmr_el1, x2
        mov     x2, #1
        msr     icc_igrpen1_el1, x2
        // Ticks in 20 us, for idle waits.
        mrs     x1, cntfrq_el0
        str     x1, [x28, #MB_CNTFRQ]
        mov     x2, #50000
        udiv    x1, x1, x2
        str     x1, [x28, #MB_IDLE_TICKS]
        isb
        cbnz    x19, cpu_ready

        // Boot CPU: say we are alive, wait for the host to say how many
        // CPUs to start, start the others through PSCI (SMC conduit with
        // virtualization=on and no EL3).
        ldr     x1, =UART0
        mov     w2, #UART_CR_ON
        str     w2, [x1, #UART_CR]
.ifdef EL2_ENGINE
        zero_bss
.endif
        ldr     x21, =CTL
        ldr     x2, =0x733232756d6d6d73
        str     x2, [x21]
1:      ldr     x22, [x21, #CTL_GO]
        cbz     x22, 1b
        mov     x20, #1
2:      cmp     x20, x22
        b.ge    cpu_ready
        and     x1, x20, #7
        lsr     x2, x20, #3
        orr     x1, x1, x2, lsl #8
        ldr     x0, =0xc4000003
        adr     x2, _start
        mov     x3, x20
        smc     #0
        cbz     x0, 3f
        str     x0, [x21, #CTL_PSCI_ERR]
3:      add     x20, x20, #1
        b       2b

cpu_ready:
        ldr     x1, =CTL + CTL_ALIVE
        mov     x2, #1
        str     x2, [x1, x19, lsl #3]

// The command loop: wait until cmd_seq moves past done_seq, run the command,
// publish its result and done_seq.
cmd_loop:
        mrs     x28, tpidr_el2
        ldr     x1, [x28, #MB_STACK_TOP]
        mov     sp, x1
        add     x26, x28, #MB_CMD_SEQ
        mov     x25, #SPIN_BEFORE_IDLE
        ldr     x24, [x28, #MB_IDLE_TICKS]      // the short idle wait: 20 us
        mov     x23, #IDLE_SHORT_WAITS
1:      ldar    x27, [x26]
        ldr     x2, [x28, #MB_DONE_SEQ]
        cmp     x27, x2
        b.ne    2f
        subs    x25, x25, #1
        b.hi    1b
        mov     x9, x24
        bl      idle_wait_ticks
        // A kick that reached this CPU outside its guest (a pause's, sent
        // while the vCPU was in an exit it then left for this loop; a
        // restore's, to end a park) has nothing left to stop: taken here,
        // so that its pending SGI does not end every WFI of this loop at
        // once (a busy loop of this CPU's QEMU thread until the next
        // guest entry, for ever on a paused source). Equal priorities: the
        // lowest INTID is the highest pending, so the acknowledge returns
        // the kick; anything else it might return is level-triggered and
        // pends again after the EOI.
        mrs     x9, icc_hppir1_el1
        cmp     x9, #KICK_SGI
        b.ne    3f
        mrs     x9, icc_iar1_el1
        msr     icc_eoir1_el1, x9
        isb
        ldr     x9, [x28, #MB_KICKS_TAKEN]
        add     x9, x9, #1
        str     x9, [x28, #MB_KICKS_TAKEN]
3:      mov     x25, #1
        subs    x23, x23, #1
        b.hi    1b                              // still the short waits
        mov     x23, #1
        ldr     x9, [x28, #MB_IDLE_TICKS]
        lsl     x9, x9, #IDLE_BACKOFF_SHIFT
        // Parked: the host set MB_PARK_TICKS above the cap (a blank
        // destination's CPUs, with nothing to do until the resume), so the
        // waits grow to it; read after every wait, so a cleared value
        // brings the cap back after the wait in progress.
        ldr     x10, [x28, #MB_PARK_TICKS]
        cmp     x10, x9
        csel    x9, x10, x9, hi
        lsl     x24, x24, #1
        cmp     x24, x9
        csel    x24, x24, x9, lo                // double it, up to the cap
        mov     x25, #1
        b       1b
        // Picked up: stamp the physical counter (no offset, whatever a
        // Linux vCPU set CNTVOFF to), so the host can tell the command's
        // own time from the wait before the pickup.
2:      isb
        mrs     x4, cntpct_el0
        str     x4, [x28, #MB_T_PICKUP]
        ldr     x3, [x28, #MB_CMD]
        cmp     x3, #CMD_RUN
        b.eq    do_run
        cmp     x3, #CMD_TLBI
        b.eq    do_tlbi
        cmp     x3, #CMD_AT
        b.eq    do_at
        cmp     x3, #CMD_PING
        b.eq    cmd_ping
        cmp     x3, #CMD_LINUX
        b.eq    do_linux
        cmp     x3, #CMD_KICK
        b.eq    do_kick
        cmp     x3, #CMD_STATE
        b.eq    do_state
        cmp     x3, #CMD_BELL_IN
        b.eq    do_bell_in
.ifdef EL2_ENGINE
        cmp     x3, #CMD_EL2
        b.eq    do_el2
.endif
        mov     x0, #-1
        b       cmd_done
cmd_ping:
        // The answer is the counter frequency, for the host's tick maths.
        mrs     x0, cntfrq_el0
cmd_done:
        // x0: the command's status.
        mrs     x28, tpidr_el2
        str     x0, [x28, #MB_RET]
        isb
        mrs     x1, cntpct_el0
        str     x1, [x28, #MB_T_DONE]
        ldr     x27, [x28, #MB_CMD_SEQ]
        add     x1, x28, #MB_DONE_SEQ
        stlr    x27, [x1]
        b       cmd_loop

// Load the VM's stage-2 context: args 0..2 = VTCR_EL2, VTTBR_EL2, HCR_EL2.
// VTTBR is written only when it changes (QEMU drops its TLB on a change).
load_vm:
        load_vtcr_vttbr
        ldr     x1, [x28, #MB_ARG0 + 16]
        msr     hcr_el2, x1
        // Guest stage 1 off (M = 0), RES1 bits set.
        ldr     x1, =0x30d00800
        msr     sctlr_el1, x1
        isb
        ret

// RUN: arg3 = guest entry, args 4..11 = guest x0..x7.
do_run:
        bl      load_vm
        guest_entry
        ldp     x4, x5, [x28, #MB_ARG8]
        ldp     x6, x7, [x28, #MB_ARG8 + 16]
        mov     x8, xzr
        mov     x28, xzr
        isb
        eret

// LINUX: a vCPU of a Linux guest from its reset state. Args 0..2 as RUN,
// arg3 = entry, args 4..7 = x0..x3, arg8 = ICH_HCR_EL2, arg9 =
// CNTVOFF_EL2, arg10 = CNTHCTL_EL2. The guest's EL1 state stays in this
// CPU between exits (vCPU n is CPU n); the list registers start empty.
do_linux:
        bl      load_vm
        ldr     x1, [x28, #MB_ARG8]
        msr     ich_hcr_el2, x1
        ldr     x1, [x28, #MB_ARG8 + 8]
        msr     cntvoff_el2, x1
        ldr     x1, [x28, #MB_ARG8 + 16]
        msr     cnthctl_el2, x1
        msr     ich_lr0_el2, xzr
        msr     ich_lr1_el2, xzr
        msr     ich_lr2_el2, xzr
        msr     ich_lr3_el2, xzr
        msr     cntv_ctl_el0, xzr
        guest_entry
        .irp    r, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30
        mov     x\r, xzr
        .endr
        isb
        eret

// KICK: arg0 = an ICC_SGI1R_EL1 value; sends that SGI at EL2 (another
// CPU takes it as an IRQ and exits from its guest).
do_kick:
        ldr     x1, [x28, #MB_ARG0]
        msr     icc_sgi1r_el1, x1
        isb
        mov     x0, #0
        b       cmd_done

// BELL_IN: routes the UART's receive interrupt (the host's bell, a byte
// on QEMU's stdin) to this CPU and enables it, so that the host can end
// this CPU's idle wait (a parked service CPU's 5 ms) at once. The
// interrupt stays masked in PSTATE at EL2: it only ends the WFI, and
// idle_wait_ticks drains the bytes (those that came before too: the line
// rises once the mask is set). GICD_IROUTER<n> takes this CPU's
// affinity (Aff2.Aff1.Aff0, routing mode 0: this PE only).
do_bell_in:
        ldr     x1, =UART0
        mrs     x2, mpidr_el1
        ldr     x3, =0xffffff
        and     x2, x2, x3
        ldr     x4, =GICD
        add     x5, x4, #0x6000
        str     x2, [x5, #8 * UART_INTID]       // GICD_IROUTER33
        ldr     w6, [x4, #0x84]                 // GICD_IGROUPR1: group 1
        orr     w6, w6, #(1 << (UART_INTID - 32))
        str     w6, [x4, #0x84]
        mov     w6, #(1 << (UART_INTID - 32))
        str     w6, [x4, #0x104]                // GICD_ISENABLER1
        mov     w2, #UART_RXIM
        str     w2, [x1, #UART_IMSC]
        mov     w2, #UART_CR_ON_RX
        str     w2, [x1, #UART_CR]
        mov     x0, #0
        b       cmd_done

// TLBI: arg0 = number of instructions at MB_CMD_INSNS, args 1..2 = VTCR,
// VTTBR (the VMID the maintenance applies to).
do_tlbi:
        ldr     x1, [x28, #MB_ARG0 + 8]
        msr     vtcr_el2, x1
        ldr     x1, [x28, #MB_ARG0 + 16]
        mrs     x2, vttbr_el2
        cmp     x1, x2
        b.eq    1f
        msr     vttbr_el2, x1
1:      isb
        add     x0, x28, #MB_CMD_INSNS
        ldr     x1, [x28, #MB_ARG0]
        bl      exec_insns
        mov     x0, #0
        b       cmd_done

// AT: args 0..2 = VTCR, VTTBR, HCR; arg3 = IPA list, arg4 = count,
// arg5 = output list (PAR_EL1 for each IPA), arg6 = 1 for a write check.
do_at:
        bl      load_vm
        ldr     x3, [x28, #MB_ARG0 + 24]
        ldr     x4, [x28, #MB_ARG4]
        ldr     x5, [x28, #MB_ARG4 + 8]
        ldr     x6, [x28, #MB_ARG4 + 16]
        cbz     x4, 9f
1:      ldr     x7, [x3], #8
        cbnz    x6, 2f
        at      s12e1r, x7
        b       3f
2:      at      s12e1w, x7
3:      isb
        mrs     x8, par_el1
        str     x8, [x5], #8
        subs    x4, x4, #1
        b.ne    1b
9:      mov     x0, #0
        b       cmd_done

// Sleeps until the EL2 physical timer fires, about 20 us from now, so a
// CPU that waits for the host gives its host thread back to QEMU's other
// CPUs (idle_wait_ticks: x9 ticks from now). Clobbers x9, x10.
idle_wait:
        ldr     x9, [x28, #MB_IDLE_TICKS]
idle_wait_ticks:
        msr     cnthp_tval_el2, x9
        mov     x10, #1
        msr     cnthp_ctl_el2, x10              // enable, not masked
        isb
        wfi
        msr     cnthp_ctl_el2, xzr              // the line drops again
        isb
        ldr     x9, [x28, #MB_IDLE_WAITS]
        add     x9, x9, #1
        str     x9, [x28, #MB_IDLE_WAITS]
        // The host's bell (only the CPU BELL_IN routed it to sees it):
        // take its bytes, so that the UART's interrupt drops and the next
        // WFI sleeps again.
        mrs     x9, icc_hppir1_el1
        cmp     x9, #UART_INTID
        b.ne    3f
        ldr     x9, =UART0
2:      ldr     w10, [x9, #UART_FR]
        tbnz    w10, #4, 3f                     // RXFE: empty
        ldr     w10, [x9]                       // UARTDR
        ldr     x10, [x28, #MB_BELLS_IN]
        add     x10, x10, #1
        str     x10, [x28, #MB_BELLS_IN]
        b       2b
3:      ret

// Executes x1 maintenance instructions from the list at x0: pairs of
// (op, operand) u64s. Clobbers x0..x3.
exec_insns:
        cbz     x1, 9f
1:      ldp     x2, x3, [x0], #16
        cmp     x2, #1
        b.ne    2f
        dsb     ishst
        b       8f
2:      cmp     x2, #2
        b.ne    3f
        dsb     ish
        b       8f
3:      cmp     x2, #3
        b.ne    4f
        dsb     nshst
        b       8f
4:      cmp     x2, #4
        b.ne    5f
        dsb     nsh
        b       8f
5:      cmp     x2, #5
        b.ne    10f
        isb
        b       8f
10:     cmp     x2, #0x10
        b.ne    11f
        tlbi    ipas2e1is, x3
        b       8f
11:     cmp     x2, #0x11
        b.ne    12f
        tlbi    ipas2e1, x3
        b       8f
12:     cmp     x2, #0x12
        b.ne    13f
        tlbi    ripas2e1is, x3
        b       8f
13:     cmp     x2, #0x13
        b.ne    14f
        tlbi    vmalle1is
        b       8f
14:     cmp     x2, #0x14
        b.ne    15f
        tlbi    vmalle1
        b       8f
15:     cmp     x2, #0x15
        b.ne    18f
        tlbi    vmalls12e1is
        b       8f
18:     cmp     x2, #0x16
        b.ne    19f
        tlbi    ipas2le1is, x3
        b       8f
19:     cmp     x2, #0x17
        b.ne    17f
        tlbi    ipas2le1, x3
        b       8f
17:     cmp     x2, #0x20                       // a kick: SGI x3 at EL2
        b.ne    16f
        msr     icc_sgi1r_el1, x3
        isb
        b       8f
16:     // Unknown: count it; the host checks the counter.
        mrs     x2, tpidr_el2
        ldr     x3, [x2, #MB_BAD_INSN]
        add     x3, x3, #1
        str     x3, [x2, #MB_BAD_INSN]
8:      subs    x1, x1, #1
        b.ne    1b
9:      ret

// An exit from the guest: post it, wait for the engine's answer, execute
// the maintenance it lists, then resume (optionally with new x0/x1) or stop.
lower_sync:
        mrs     x28, tpidr_el2
        mrs     x0, cntpct_el0
        str     x0, [x28, #MB_T_ENTRY]
        mrs     x1, esr_el2
        lsr     x2, x1, #26
        mov     x3, #EXIT_ABORT
        cmp     x2, #0x24
        b.eq    el2_abort
        cmp     x2, #0x20
        b.eq    el2_abort
        mov     x3, #EXIT_HVC
        cmp     x2, #0x16
        b.eq    1f
        mov     x3, #EXIT_OTHER
1:
        b       post_exit
// A stage-2 abort: with the engine at EL2 it answers first (asm/el2_mmu.S);
// what it leaves to the host is posted as an exit.
el2_abort:
.ifdef EL2_ENGINE
        el2_answer_abort
.endif
        mov     x3, #EXIT_ABORT
// Posts exit kind x3 with syndrome x1, waits for the answer.
post_exit:
        str     x3, [x28, #MB_EXIT_KIND]
        str     x1, [x28, #MB_ESR]
        post_pair ich_lr0_el2, ich_lr1_el2, MB_LR0
        post_pair ich_lr2_el2, ich_lr3_el2, MB_LR0+16
        post_pair cntv_ctl_el0, cntv_cval_el0, MB_CNTV_CTL
        // Mask the guest's virtual timer at its source while this exit
        // waits (restored from MB_CNTV_CTL at the answer): a timer that
        // fires meanwhile would keep its interrupt pending, and with it
        // pending every WFI of the wait below returns at once, a busy
        // loop on this CPU's QEMU thread for as long as the answer takes.
        orr     x4, x4, #2                      // IMASK
        msr     cntv_ctl_el0, x4
        post_pair ich_misr_el2, ich_vmcr_el2, MB_ICH_MISR
        mrs     x4, spsr_el2
        str     x4, [x28, #MB_SPSR]
        mrs     x4, far_el2
        str     x4, [x28, #MB_FAR]
        mrs     x4, hpfar_el2
        str     x4, [x28, #MB_HPFAR]
        mrs     x4, elr_el2
        str     x4, [x28, #MB_ELR]
        ldp     x4, x5, [sp, #0]
        stp     x4, x5, [x28, #MB_GX0]
        ldr     x4, [sp, #16]
        str     x4, [x28, #MB_GX2]
        // For an MMIO write the host needs Rt's value (ESR ISS.SRT; x31
        // is XZR here).
        ubfx    x4, x1, #16, #5
        mov     x5, xzr
        cmp     x4, #31
        b.eq    5f
        ldr     x5, [sp, x4, lsl #3]
5:      str     x5, [x28, #MB_MMIO_DATA]
        ldr     x6, [x28, #MB_EXIT_SEQ]
        add     x6, x6, #1
        add     x7, x28, #MB_EXIT_SEQ
        stlr    x6, [x7]
        // The host thread sleeps (MB_HOST_WAITING): ring its doorbell, one
        // byte to the UART, which this CPU's QEMU thread writes to a pipe
        // the host reads (x4, Rt's number, is live). The DMB
        // orders the exit's store before the flag's load (the host stores
        // the flag, fences, then reads EXIT_SEQ): one side sees the other.
        dmb     ish
        ldr     x8, [x28, #MB_HOST_WAITING]
        cbz     x8, 6f
        ldr     x8, [x28, #MB_BELLS]
        add     x8, x8, #1
        str     x8, [x28, #MB_BELLS]
        ldr     x1, =UART0
7:      ldr     w0, [x1, #UART_FR]
        tbnz    w0, #5, 7b                      // TX FIFO full
        ldr     x0, [x28, #MB_BELL_BYTE]
        str     w0, [x1]                        // UARTDR
6:
        // Wait for the answer: spin, then EXIT_SHORT_WAITS waits of 20 us,
        // then double the wait after each one that brought none, up to
        // 20 us << EXIT_BACKOFF_SHIFT. Each wait is a QEMU timer, which
        // QEMU's main loop arms and fires; a host thread that answers late
        // (it naps while its guest is idle, or a loaded host runs it late)
        // cost one main-loop wake-up per 20 us at a fixed wait.
        add     x7, x28, #MB_REPLY_SEQ
        mov     x5, #SPIN_BEFORE_IDLE
        ldr     x11, [x28, #MB_IDLE_TICKS]
        mov     x12, #EXIT_SHORT_WAITS
2:      ldar    x8, [x7]
        cmp     x8, x6
        b.eq    3f
        subs    x5, x5, #1
        b.hi    2b
        mov     x9, x11
        bl      idle_wait_ticks
        mov     x5, #1
        subs    x12, x12, #1
        b.hi    2b                              // still the short waits
        mov     x12, #1
        ldr     x9, [x28, #MB_IDLE_TICKS]
        lsl     x9, x9, #EXIT_BACKOFF_SHIFT
        lsl     x11, x11, #1
        cmp     x11, x9
        csel    x11, x11, x9, lo                // double it, up to the cap
        b       2b
3:      ldr     x0, [x28, #MB_CNTV_CTL]         // the guest's timer as it was
        msr     cntv_ctl_el0, x0
        isb
        add     x0, x28, #MB_REPLY_INSNS
        ldr     x1, [x28, #MB_REPLY_NINSN]
        bl      exec_insns
        ldr     x2, [x28, #MB_ACTION]
        cmp     x2, #ACT_STOP
        b.eq    run_stopped
        cmp     x2, #ACT_MMIO
        b.eq    mmio_done
        cmp     x2, #ACT_LINUX
        b.eq    linux_resume
        cmp     x2, #ACT_SAVE
        b.eq    linux_save
        cmp     x2, #ACT_INJECT
        b.eq    linux_inject
        cmp     x2, #ACT_RESUME_X0
        b.ne    4f
        ldp     x3, x4, [x28, #MB_REPLY_X0]
        stp     x3, x4, [sp, #0]
4:      mrs     x3, cntpct_el0
        ldr     x4, [x28, #MB_T_ENTRY]
        sub     x3, x3, x4
        tally   MB_STAT_TICKS, MB_STAT_EXITS
        // A stage-2 abort the engine answered (not an emulated MMIO
        // access, not an injected exception): its round trip on its own,
        // the fault cost the placements are compared by.
        ldr     x4, [x28, #MB_EXIT_KIND]
        cmp     x4, #EXIT_ABORT
        b.ne    restore_guest
        cmp     x2, #ACT_MMIO
        b.eq    restore_guest
        cmp     x2, #ACT_INJECT
        b.eq    restore_guest
        tally   MB_S2_TICKS, MB_S2_EXITS
restore_guest:
        ldp     x0, x1, [sp, #0]
        frame_x2_x30 ldp, ldr, sp
        add     sp, sp, #FRAME
        eret

run_stopped:
        mov     x0, #0
        b       cmd_done

// The host answered a Linux vCPU's exit: its list registers, ICH_HCR_EL2
// and the return address from the mailbox; general registers from the
// frame (the host edits them there).
linux_resume:
        load_list_regs
        ldr     x3, [x28, #MB_NEW_ELR]
        msr     elr_el2, x3
        isb
        b       4b

// A physical interrupt taken from the guest (HCR_EL2.IMO). Acknowledge
// it; the virtual timer's is masked at its source (CNTV_CTL.IMASK, which
// the guest clears when it programs the next event) so that the host can
// inject virtual INTID 27; then complete it and exit to the host, which
// answers with the list registers. Spurious INTIDs resume the guest.
lower_irq:
        mrs     x28, tpidr_el2
        mrs     x0, cntpct_el0
        str     x0, [x28, #MB_T_ENTRY]
        mrs     x1, icc_iar1_el1
        cmp     x1, #1020
        b.hs    restore_guest
        cmp     x1, #VTIMER_INTID
        b.ne    1f
        mrs     x2, cntv_ctl_el0
        orr     x2, x2, #2
        msr     cntv_ctl_el0, x2
        isb
1:      msr     icc_eoir1_el1, x1
        isb
        str     x1, [x28, #MB_INTID]
        mov     x3, #EXIT_IRQ
        mov     x1, xzr
        b       post_exit

// The host emulated the access (MMIO): a read's value goes to Rt, and the
// instruction is skipped.
mmio_done:
        ldr     x3, [x28, #MB_ESR]
        tbnz    x3, #6, 2f                      // WnR: a write
        ubfx    x4, x3, #16, #5                 // SRT
        cmp     x4, #31
        b.eq    2f
        ldr     x5, [x28, #MB_REPLY_X0]
        str     x5, [sp, x4, lsl #3]
2:      mrs     x4, elr_el2
        add     x4, x4, #4
        msr     elr_el2, x4
        b       4b

// Anything taken from EL2 itself is a bug of this program: report it on
// the console (the UART) and stop.
        .global hyp_panic
hyp_panic:
        mrs     x28, tpidr_el2
        mrs     x1, esr_el2
        str     x1, [x28, #MB_ESR]
        mrs     x1, elr_el2
        str     x1, [x28, #MB_ELR]
        mov     x1, #0xdead
        str     x1, [x28, #MB_BAD_INSN]
        adr     x2, panic_msg
        ldr     x1, =UART0
2:      ldrb    w3, [x2], #1
        cbz     w3, 1f
3:      ldr     w0, [x1, #UART_FR]
        tbnz    w0, #5, 3b                      // TX FIFO full
        str     w3, [x1]                        // UARTDR
        b       2b
1:      b       1b

panic_msg:
        .asciz  "s2mmu-hyp: exception taken at EL2\n"

        .balign 2048
vectors:
        // Current EL with SP0, then SPx: never expected.
        .rept   8
        b       hyp_panic
        .balign 128
        .endr
        // Lower EL, AArch64: synchronous.
        save_guest lower_sync
        .balign 128
        // Lower EL, AArch64: IRQ.
        save_guest lower_irq
        .balign 128
        // Lower EL FIQ, SError and the AArch32 entries: impossible here.
        .rept   6
        b       hyp_panic
        .balign 128
        .endr
        .ltorg

// ---------------------------------------------------------------------
// Guest code, run at EL1 with stage 1 off (its addresses are IPAs). It is
// reached through a stage-2 mapping the engine makes like any other.
        .section .text.guest, "ax"
        .global guest_memstress
        .global guest_probe

// The memstress pattern. x0 = region base IPA, x1 = pages, x2 = page size,
// x3 = vCPU index, x4 = 0 sequential / 1 random, x5 = random seed (non-zero),
// x6 = writes per pass in random mode, x7 = 1 to verify each page's tag
// (word 1 holds the page's own IPA, written by the host) before writing.
// Each pass writes its stamp (vCPU << 48 | pass) to word 0 of the pages it
// visits: the record of what the guest wrote. Between passes it asks the
// host for the next pass with HVC (x0 = 1, x1 = pass done, x2 = counter
// ticks the pass took); the host answers with the pass number in x0.
guest_memstress:
        mov     x19, x0
        mov     x20, x1
        mov     x21, x2
        mov     x22, x3
        mov     x23, x4
        mov     x24, x5
        mov     x25, x6
        mov     x18, x7
        mov     x1, #0
        mov     x2, #0
1:      mov     x0, #1
        hvc     #0
        mov     x26, x0
        orr     x27, x26, x22, lsl #48
        mrs     x17, cntvct_el0
        cbnz    x23, 4f
        mov     x9, x19
        mov     x10, x20
        cbz     x10, 6f
2:      cbz     x18, 3f
        ldr     x12, [x9, #8]
        cmp     x12, x9
        b.ne    bad_tag
3:      str     x27, [x9]
        add     x9, x9, x21
        subs    x10, x10, #1
        b.ne    2b
        b       6f
4:      mov     x10, x25
        cbz     x10, 6f
5:      eor     x24, x24, x24, lsl #13
        eor     x24, x24, x24, lsr #7
        eor     x24, x24, x24, lsl #17
        udiv    x12, x24, x20
        msub    x13, x12, x20, x24
        madd    x9, x13, x21, x19
        cbz     x18, 7f
        ldr     x12, [x9, #8]
        cmp     x12, x9
        b.ne    bad_tag
7:      str     x27, [x9]
        subs    x10, x10, #1
        b.ne    5b
6:      mrs     x2, cntvct_el0
        sub     x2, x2, x17
        mov     x1, x26
        b       1b

bad_tag:
        // A page whose content is not its own: a wrong or torn translation.
        mov     x0, #3
        mov     x1, x9
        mov     x2, x12
        hvc     #0
        b       bad_tag

// One access: x0 = 0 read / 1 write, x1 = IPA, x2 = value to write.
// Reports with HVC: x0 = 2, x1 = the value read (or written).
guest_probe:
        cbz     x0, 1f
        str     x2, [x1]
        mov     x1, x2
        b       2f
1:      ldr     x1, [x1]
2:      mov     x0, #2
        hvc     #0
        b       2b

// Arms the virtual timer to fire at once (CVAL 0, enabled, not masked;
// the guest runs with interrupts masked, so it never takes it), then
// reports with HVC (x0 = 2) again and again: the host answers while the
// timer's line would be up.
        .global guest_timer_probe
guest_timer_probe:
        msr     cntv_cval_el0, xzr
        mov     x1, #1
        msr     cntv_ctl_el0, x1
        isb
1:      mov     x0, #2
        hvc     #0
        b       1b

// A guest with its own stage 1 on (tlbi operand checks, src/walk_cache.rs).
// x0 = TTBR0_EL1 (the IPA of its stage-1 root table), x1 = VA to read,
// x2 = TCR_EL1, x3 = MAIR_EL1, x4 = SCTLR_EL1 with M set. Reads the VA and
// reports with HVC (x0 = 2, x1 = the value) again and again: the host
// changes stage 2 between two reads. The host runs it with HCR_EL2.DC
// clear (DC makes stage 1 behave as off). An exception at EL1 (a stage-1
// fault) is reported with HVC x0 = 5, x1 = ESR_EL1, x2 = FAR_EL1, x3 =
// ELR_EL1, x4 = SPSR_EL1, x5 = the vector's address, x6 = DAIF.
        .global guest_s1_probe
guest_s1_probe:
        adr     x5, guest_el1_vectors
        msr     vbar_el1, x5
        msr     mair_el1, x3
        msr     tcr_el1, x2
        msr     ttbr0_el1, x0
        isb
        msr     sctlr_el1, x4
        isb
        mov     x6, x1
1:      ldr     x1, [x6]
        mov     x0, #2
        hvc     #0
        b       1b

// Semihosting from EL1, which must not reach the host: x0 = the
// operation (4 SYS_WRITE0, 1 SYS_OPEN, ...), x1 = its parameter (an IPA,
// read once first so the engine maps its page). If the HLT came back as a
// call it reports HVC x0 = 2, x1 = the call's result; its UNDEF is
// reported by the vectors below (HVC x0 = 5, x1 = ESR_EL1).
        .global guest_semihost_probe
guest_semihost_probe:
        adr     x5, guest_el1_vectors
        msr     vbar_el1, x5
        ldr     x5, [x1]
        isb
        hlt     #0xf000
        mov     x1, x0
1:      mov     x0, #2
        hvc     #0
        b       1b

        .balign 2048
guest_el1_vectors:
        .rept   16
        mov     x0, #5
        mrs     x1, esr_el1
        mrs     x2, far_el1
        mrs     x3, elr_el1                     // and, for tests/el1/inject.rs,
        mrs     x4, spsr_el1                    // where it came from, which
        adr     x5, .                           // vector, and the handler's
        mrs     x6, daif                        // interrupt masks
        hvc     #0
        b       .
        .balign 128
        .endr
