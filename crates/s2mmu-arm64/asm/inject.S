// Exception injection into a Linux guest (included from hyp.S): the host
// answered an exit with ACT_INJECT instead of stopping the VM, as KVM
// injects an abort or an UNDEF (src/linux/machine/inject.rs computes the values).
//
// Mailbox: MB_REPLY_X0 = ESR_EL1, MB_REPLY_X0 + 8 = FAR_EL1, MB_NEW_ELR =
// the vector's offset from VBAR_EL1, MB_INJ_PSTATE = the new PSTATE less
// the bits that depend on SCTLR_EL1. The exit's ELR_EL2 and SPSR_EL2 are
// still the guest's (nothing is taken at EL2 while an exit waits).

        .subsection 2                   // after hyp.S's and state.S's code
        .balign 4
        .equ    ACT_INJECT,     5
        .equ    MB_INJ_PSTATE,  0x3f8

linux_inject:
        take_pair MB_REPLY_X0, esr_el1, far_el1
        mrs     x3, elr_el2
        msr     elr_el1, x3
        mrs     x3, spsr_el2
        msr     spsr_el1, x3
        // enter_exception64: PAN is set when SCTLR_EL1.SPAN (bit 23, RES1
        // without FEAT_PAN) is clear; SSBS takes SCTLR_EL1.DSSBS (bit 44,
        // RES0 without FEAT_SSBS).
        ldr     x3, [x28, #MB_INJ_PSTATE]
        mrs     x4, sctlr_el1
        tbnz    x4, #23, 1f
        orr     x3, x3, #(1 << 22)              // PAN
1:      tbz     x4, #44, 2f
        orr     x3, x3, #(1 << 12)              // SSBS
2:      msr     spsr_el2, x3
        mrs     x3, vbar_el1
        ldr     x4, [x28, #MB_NEW_ELR]
        add     x3, x3, x4
        str     x3, [x28, #MB_NEW_ELR]          // linux_resume loads it
        b       linux_resume
        .subsection 0
