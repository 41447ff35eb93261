// A Linux vCPU's whole state in and out of the CPU, for migration and
// snapshots (included from hyp.S). The state area is the vCPU mailbox's
// command-instruction page (MB_CMD_INSNS): host-queued TLB maintenance
// goes to the service CPU's mailbox, never to a vCPU's.
//
// Area layout (mirrored in src/linux/machine/state/vcpu_state.rs):
//   0x000  x0..x30            0x0f8  ELR_EL2 (PC)     0x100  SPSR_EL2
//   0x108  the registers of SYSREGS below, 8 bytes each, in order
//   0x280  CNTVCT at save     0x288  CNTPCT at save / restore's eret
//   0x300  q0..q31 (16 bytes each)

        .subsection 1                   // after hyp.S's own code
        .balign 4
        .equ    ACT_SAVE,       0x20
        .equ    CMD_STATE,      0x20
        .equ    ST_ELR,         0x0f8
        .equ    ST_SPSR,        0x100
        .equ    ST_SYS,         0x108
        .equ    ST_CNTVCT,      0x280
        .equ    ST_CNTPCT,      0x288
        .equ    ST_FP,          0x300

// EL1 context, FP control, timer and the virtual CPU interface. The list
// registers and ICH_HCR_EL2 come last so that restore enables the vCPU
// interface with everything else in place.
        .macro  sysregs op
        .irp    r, sctlr_el1, ttbr0_el1, ttbr1_el1, tcr_el1, mair_el1, amair_el1, vbar_el1, contextidr_el1, tpidr_el0, tpidrro_el0, tpidr_el1, sp_el0, sp_el1, elr_el1, spsr_el1, esr_el1, far_el1, afsr0_el1, afsr1_el1, par_el1, cpacr_el1, cntkctl_el1, mdscr_el1, csselr_el1
        \op     \r
        .endr
        .irp    r, apiakeylo_el1, apiakeyhi_el1, apibkeylo_el1, apibkeyhi_el1, apdakeylo_el1, apdakeyhi_el1, apdbkeylo_el1, apdbkeyhi_el1, apgakeylo_el1, apgakeyhi_el1
        \op     \r
        .endr
        .irp    r, fpcr, fpsr, cntv_cval_el0, cntv_ctl_el0, ich_vmcr_el2, ich_ap0r0_el2, ich_ap1r0_el2, ich_lr0_el2, ich_lr1_el2, ich_lr2_el2, ich_lr3_el2, ich_hcr_el2
        \op     \r
        .endr
        .endm
// q0..q31 to (\op stp) or from (ldp) the 512 bytes at x0, x0 advanced
// past them.
        .macro  fpregs op
        .irp    pair, "0, 1", "2, 3", "4, 5", "6, 7", "8, 9", "10, 11", "12, 13", "14, 15", "16, 17", "18, 19", "20, 21", "22, 23", "24, 25", "26, 27", "28, 29", "30, 31"
        fp_pair \op, \pair
        .endr
        .endm
        .macro  fp_pair op, a, b
        \op     q\a, q\b, [x0], #32
        .endm
        .macro  save1 r
        mrs     x1, \r
        str     x1, [x0], #8
        .endm
        .macro  load1 r
        ldr     x1, [x0], #8
        msr     \r, x1
        .endm

// ACT_SAVE: the host answered an exit as for ACT_LINUX (list registers,
// ICH_HCR_EL2 and the return address in the mailbox, registers edited in
// the frame), but instead of resuming, the stub stores the vCPU's state
// in the area and ends the vCPU's command. The guest stays stopped.
linux_save:
        load_list_regs
        isb
        add     x2, x28, #MB_CMD_INSNS
        mov     x3, #0
1:      ldr     x4, [sp, x3]
        str     x4, [x2, x3]
        add     x3, x3, #8
        cmp     x3, #248
        b.lo    1b
        ldr     x4, [x28, #MB_NEW_ELR]
        str     x4, [x2, #ST_ELR]
        mrs     x4, spsr_el2
        str     x4, [x2, #ST_SPSR]
        add     x0, x2, #ST_SYS
        sysregs save1
        mrs     x4, cntvct_el0
        mrs     x5, cntpct_el0
        add     x3, x2, #ST_CNTVCT
        stp     x4, x5, [x3]
        add     x0, x2, #ST_FP
        fpregs  stp
        add     sp, sp, #FRAME
        mov     x0, #0
        b       cmd_done

// STATE: arg3 = 0: answer CNTPCT_EL0 (the host's time base for CNTVOFF).
// arg3 = 1: run a vCPU from the state in the area. Args 0..2 as RUN,
// arg4 = CNTVOFF_EL2, arg5 = CNTHCTL_EL2. CNTPCT at the ERET is stored at
// ST_CNTPCT (the host's mark of the first guest instruction).
do_state:
        ldr     x1, [x28, #MB_ARG0 + 24]
        cbnz    x1, 1f
        isb
        mrs     x0, cntpct_el0
        b       cmd_done
1:      bl      load_vm
        // This CPU may have run another life of the guest (a migration
        // back): nothing it cached of that one may survive.
        tlbi    vmalls12e1
        dsb     nsh
        ic      iallu
        dsb     nsh
        isb
        ldr     x1, [x28, #MB_ARG4]
        msr     cntvoff_el2, x1
        ldr     x1, [x28, #MB_ARG4 + 8]
        msr     cnthctl_el2, x1
        add     x2, x28, #MB_CMD_INSNS
        add     x0, x2, #ST_SYS
        sysregs load1
        add     x0, x2, #ST_FP
        fpregs  ldp
        ldr     x1, [x2, #ST_ELR]
        msr     elr_el2, x1
        ldr     x1, [x2, #ST_SPSR]
        msr     spsr_el2, x1
        isb
        mrs     x1, cntpct_el0
        add     x3, x2, #ST_CNTPCT
        str     x1, [x3]
        mov     x30, x2
        ldp     x0, x1, [x30, #0]
        frame_x2_x30 ldp, ldr, x30
        eret
        .subsection 0
