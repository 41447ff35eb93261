// Boot at EL2, EL2's stage-1 MMU, the vector table, the guest.
//
// EL2's stage 1 is on before any Rust runs: with it off, data accesses are
// Device-nGnRnE, where atomics and unaligned accesses are not guaranteed.
// One level-1 table (4 KiB granule, 39-bit VA, identity): 0-1 GiB Device
// (the UART, the GIC), 1-2 GiB Normal write-back inner-shareable (RAM).

        // EL2's own translation and traps, the same on every CPU.
        .macro  el2_setup
        el2_stage1_on el2_l1
        // CPTR_EL2: no FP/SIMD trap (Rust uses the registers), RES1 bits.
        mov     x0, #0x33ff
        msr     cptr_el2, x0
        adr     x0, el2_vectors
        msr     vbar_el2, x0
        isb
        .endm

        .section .text.boot, "ax"
        .global _start
_start:
        mrs     x0, CurrentEL
        cmp     x0, #(2 << 2)
        b.ne    .                       // not at EL2: nothing to do
        ldr     x0, =__stack_top
        mov     sp, x0
        msr     tpidr_el2, xzr          // CPU 0
        el2_setup
        zero_bss
        bl      el2_main
        b       .

// A secondary CPU from PSCI CPU_ON, at EL2 with x0 = its index: a stack
// of 64 KiB below CPU 0's per index, the same EL2 set-up.
        .global el2_secondary_entry
el2_secondary_entry:
        mov     x19, x0
        ldr     x1, =__stack_top
        sub     x1, x1, x19, lsl #16
        mov     sp, x1
        msr     tpidr_el2, x19
        el2_setup
        mov     x0, x19
        bl      el2_secondary_main
        b       .

// el2_enter_guest(entry, stack_top): EL1h with interrupts masked at
// `entry`; EL2's stack starts again from `stack_top` for the traps.
        .global el2_enter_guest
el2_enter_guest:
        mov     sp, x1
        msr     elr_el2, x0
        mov     x2, #0x3c5
        msr     spsr_el2, x2
        isb
        eret

// A trap frame: x0-x30, then the counter at entry (256 bytes).
        .macro  save_frame
        sub     sp, sp, #256
        stp     x0, x1, [sp, #0]
        isb
        mrs     x0, cntvct_el0
        str     x0, [sp, #248]
        frame_x2_x30 stp, str, sp
        .endm

lower_sync:
        save_frame
        mov     x0, sp
        bl      el2_trap
        frame_x2_x30 ldp, ldr, sp
        // The counter just before the ERET, for the fault-cost samples:
        // EL2_EXIT_TICKS[this CPU] (TPIDR_EL2 holds its index).
        adrp    x1, EL2_EXIT_TICKS
        add     x1, x1, :lo12:EL2_EXIT_TICKS
        mrs     x0, tpidr_el2
        add     x1, x1, x0, lsl #3
        isb
        mrs     x0, cntvct_el0
        str     x0, [x1]
        ldp     x0, x1, [sp, #0]
        add     sp, sp, #256
        eret

unexpected:
        save_frame
        mov     x0, sp
        bl      el2_unexpected
        b       .

        .macro  vector target
        .balign 0x80
        b       \target
        .endm

        .balign 0x800
el2_vectors:
        vector unexpected       // current EL, SP0
        vector unexpected
        vector unexpected
        vector unexpected
        vector unexpected       // current EL, SPx
        vector unexpected
        vector unexpected
        vector unexpected
        vector lower_sync       // lower EL, AArch64: synchronous
        vector unexpected
        vector unexpected
        vector unexpected
        vector unexpected       // lower EL, AArch32
        vector unexpected
        vector unexpected
        vector unexpected

// The guest (EL1, its stage 1 off): asks EL2 for work with HVC #0 and
// does it. x0 = 1: store x3 to x2 locations from x1, x4 bytes apart;
// x0 = 2: load from x1, then store to it (a stage-2 refusal skips each).
        .section .rodata.guest, "a"
        .balign 8
        .global guest_start, guest_end
guest_start:
1:      hvc     #0
        cmp     x0, #1
        b.ne    3f
        mov     x5, x1
        mov     x6, x2
2:      str     x3, [x5]
        add     x5, x5, x4
        subs    x6, x6, #1
        b.ne    2b
        b       1b
3:      cmp     x0, #2
        b.ne    1b
        ldr     x7, [x1]
        str     x3, [x1]
        b       1b
guest_end:

        .section .data.el2_pt, "aw"
        .balign 4096
el2_l1:
        .quad   0x0000000000000401      // 0-1 GiB: block, AF, attr0 Device
        .quad   0x0000000040000705      // 1-2 GiB: block, AF, inner shareable, attr1 Normal
        .fill   510, 8, 0
