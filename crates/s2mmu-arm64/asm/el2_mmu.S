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
        // q0-q31 to or from 512 bytes at sp: `stp` saves, `ldp` loads.
        .macro  fp_q0_q31 pair
        \pair   q0, q1, [sp, #0]
        \pair   q2, q3, [sp, #32]
        \pair   q4, q5, [sp, #64]
        \pair   q6, q7, [sp, #96]
        \pair   q8, q9, [sp, #128]
        \pair   q10, q11, [sp, #160]
        \pair   q12, q13, [sp, #192]
        \pair   q14, q15, [sp, #224]
        \pair   q16, q17, [sp, #256]
        \pair   q18, q19, [sp, #288]
        \pair   q20, q21, [sp, #320]
        \pair   q22, q23, [sp, #352]
        \pair   q24, q25, [sp, #384]
        \pair   q26, q27, [sp, #416]
        \pair   q28, q29, [sp, #448]
        \pair   q30, q31, [sp, #480]
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
        fp_q0_q31 stp
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
        fp_q0_q31 ldp
        add     sp, sp, #528
        str     x0, [x28, #MB_EL2_OUTCOME]
        mrs     x1, esr_el2
        cbnz    x0, el2_abort_to_host
        isb
        mrs     x3, cntpct_el0
        ldr     x4, [x28, #MB_T_ENTRY]
        sub     x3, x3, x4
        tally   MB_EL2_TICKS, MB_EL2_FAULTS
        b       restore_guest
el2_abort_to_host:
        .endm

// EL2 command (on the service CPU): arg0, arg1 = VTCR_EL2, VTTBR_EL2 the
// engine's invalidations run under; arg2 the op code, args 3..8 its
// arguments. The engine writes its result words over args 2..5; x0 is the
// status (0 or a negative error code).
do_el2:
        load_vtcr_vttbr
        isb
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
