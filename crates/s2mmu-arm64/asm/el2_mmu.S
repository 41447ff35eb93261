// The engine at EL2 (assembled with `--defsym EL2_ENGINE=1`, linked with
// the Rust library of el2/ by asm/hyp_el2.ld): EL2's own stage-1 MMU, the
// abort path that asks the engine first, and the command that hands the
// engine a command block. Without EL2_ENGINE nothing here is assembled.
//
// EL2's stage 1 is on before anything else runs: with it off, EL2's data
// accesses are Device-nGnRnE, where the engine's atomics (exclusives) are
// not guaranteed. One level-1 table (4 KiB granule, 39-bit VA, identity):
// 0-1 GiB Device-nGnRnE (the UART, the GIC), 1-8 GiB Normal write-back
// inner-shareable (RAM: the carve-out and the guest data).

.ifdef EL2_ENGINE
        .macro  el2_mmu_on
        // MAIR_EL2: attr0 Device-nGnRnE, attr1 Normal WB RW-allocate.
        mov     x0, #0xff00
        msr     mair_el2, x0
        // TCR_EL2: T0SZ 25, IRGN0/ORGN0 WB, SH0 inner, TG0 4K, PS 40 bits,
        // RES1 bits 31 and 23.
        ldr     x0, =(25 | (1 << 8) | (1 << 10) | (3 << 12) | (2 << 16) | (1 << 23) | (1 << 31))
        msr     tcr_el2, x0
        ldr     x0, =el2_l1
        msr     ttbr0_el2, x0
        tlbi    alle2
        dsb     ish
        isb
        // SCTLR_EL2: M, C, I and the RES1 bits.
        ldr     x0, =(0x30c50830 | 1 | (1 << 2) | (1 << 12))
        msr     sctlr_el2, x0
        isb
        .endm

        // The boot CPU, before the others start: the library's .bss is
        // zero (the ELF loader does not promise it for a NOLOAD section).
        .macro  el2_zero_bss
        ldr     x0, =__bss_start
        ldr     x1, =__bss_end
el2_bss_loop:
        cmp     x0, x1
        b.hs    el2_bss_done
        str     xzr, [x0], #8
        b       el2_bss_loop
el2_bss_done:
        .endm

        // A stage-2 abort (x28 the mailbox, x1 ESR_EL2, the guest's x0-x30
        // in the frame at sp): the engine answers it on this CPU. Handled:
        // counted, timed from the vector's entry, and the guest resumes
        // without an exit. Otherwise the outcome stays in MB_EL2_OUTCOME
        // for the host and the abort is posted (x1 = ESR_EL2 again); a
        // paced one (answered, a wait owed) has its wait in the mailbox
        // words the engine wrote (x4 = the mailbox). The
        // guest's FP/SIMD registers are saved around the call: Rust may
        // use them.
        .macro  el2_answer_abort
        sub     sp, sp, #528
        stp     q0, q1, [sp, #0]
        stp     q2, q3, [sp, #32]
        stp     q4, q5, [sp, #64]
        stp     q6, q7, [sp, #96]
        stp     q8, q9, [sp, #128]
        stp     q10, q11, [sp, #160]
        stp     q12, q13, [sp, #192]
        stp     q14, q15, [sp, #224]
        stp     q16, q17, [sp, #256]
        stp     q18, q19, [sp, #288]
        stp     q20, q21, [sp, #320]
        stp     q22, q23, [sp, #352]
        stp     q24, q25, [sp, #384]
        stp     q26, q27, [sp, #416]
        stp     q28, q29, [sp, #448]
        stp     q30, q31, [sp, #480]
        mrs     x9, fpsr
        mrs     x10, fpcr
        str     x9, [sp, #512]
        str     x10, [sp, #520]
        ldr     x0, [x28, #MB_ID]
        mrs     x2, far_el2
        mrs     x3, hpfar_el2
        mov     x4, x28
        bl      s2mmu_el2_abort
        ldr     x9, [sp, #512]
        ldr     x10, [sp, #520]
        msr     fpsr, x9
        msr     fpcr, x10
        ldp     q0, q1, [sp, #0]
        ldp     q2, q3, [sp, #32]
        ldp     q4, q5, [sp, #64]
        ldp     q6, q7, [sp, #96]
        ldp     q8, q9, [sp, #128]
        ldp     q10, q11, [sp, #160]
        ldp     q12, q13, [sp, #192]
        ldp     q14, q15, [sp, #224]
        ldp     q16, q17, [sp, #256]
        ldp     q18, q19, [sp, #288]
        ldp     q20, q21, [sp, #320]
        ldp     q22, q23, [sp, #352]
        ldp     q24, q25, [sp, #384]
        ldp     q26, q27, [sp, #416]
        ldp     q28, q29, [sp, #448]
        ldp     q30, q31, [sp, #480]
        add     sp, sp, #528
        str     x0, [x28, #MB_EL2_OUTCOME]
        mrs     x1, esr_el2
        cbnz    x0, el2_abort_to_host
        isb
        mrs     x3, cntpct_el0
        ldr     x4, [x28, #MB_T_ENTRY]
        sub     x3, x3, x4
        ldr     x4, [x28, #MB_EL2_TICKS]
        add     x4, x4, x3
        str     x4, [x28, #MB_EL2_TICKS]
        ldr     x4, [x28, #MB_EL2_FAULTS]
        add     x4, x4, #1
        str     x4, [x28, #MB_EL2_FAULTS]
        b       restore_guest
el2_abort_to_host:
        .endm

// EL2 command (on the service CPU): arg0, arg1 = VTCR_EL2, VTTBR_EL2 the
// engine's invalidations run under; arg2 the op code, args 3..8 its
// arguments. The engine writes its result words over args 2..5; x0 is the
// status (0 or a negative error code).
do_el2:
        ldr     x1, [x28, #MB_ARG0]
        msr     vtcr_el2, x1
        ldr     x1, [x28, #MB_ARG0 + 8]
        mrs     x2, vttbr_el2
        cmp     x1, x2
        b.eq    1f
        msr     vttbr_el2, x1
1:      isb
        mov     x0, x28
        bl      s2mmu_el2_command
        b       cmd_done

        .pushsection .data.el2pt, "aw"
        .balign 4096
el2_l1:
        .quad   0x0000000000000401      // 0-1 GiB: block, AF, attr0 Device
        .irp    gib, 1, 2, 3, 4, 5, 6, 7
        .quad   (\gib << 30) | 0x705    // block, AF, inner shareable, attr1 Normal
        .endr
        .fill   504, 8, 0
        .popsection
.endif
