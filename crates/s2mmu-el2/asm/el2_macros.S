// Macros both EL2 programs use: the stub the host drives
// (crates/s2mmu-arm64/asm/hyp.S) and the bare-metal image that runs the
// engine alone (crates/s2mmu-el2/image/src/boot.S). They define no symbol
// and emit nothing until used.

        // EL2's stage-1 MMU on, with `table` the level-1 table of an
        // identity map (4 KiB granule, 39-bit VA): attr0 Device-nGnRnE,
        // attr1 Normal write-back. Clobbers x0.
        .macro  el2_stage1_on table
        // MAIR_EL2: attr0 Device-nGnRnE, attr1 Normal WB RW-allocate.
        mov     x0, #0xff00
        msr     mair_el2, x0
        // TCR_EL2: T0SZ 25, IRGN0/ORGN0 WB, SH0 inner, TG0 4K, PS 40 bits,
        // RES1 bits 31 and 23.
        ldr     x0, =(25 | (1 << 8) | (1 << 10) | (3 << 12) | (2 << 16) | (1 << 23) | (1 << 31))
        msr     tcr_el2, x0
        ldr     x0, =\table
        msr     ttbr0_el2, x0
        tlbi    alle2
        dsb     ish
        isb
        // SCTLR_EL2: M, C, I and the RES1 bits.
        ldr     x0, =(0x30c50830 | 1 | (1 << 2) | (1 << 12))
        msr     sctlr_el2, x0
        isb
        .endm

        // Zeroes [__bss_start, __bss_end), 8 bytes at a time. Clobbers x0
        // and x1.
        .macro  zero_bss
        ldr     x0, =__bss_start
        ldr     x1, =__bss_end
.Lzero_bss_loop\@:
        cmp     x0, x1
        b.hs    .Lzero_bss_done\@
        str     xzr, [x0], #8
        b       .Lzero_bss_loop\@
.Lzero_bss_done\@:
        .endm

        // x2-x30 to or from a frame at `base` that holds x0-x30 in 8-byte
        // slots: `stp, str` save, `ldp, ldr` load. x30 comes last, so a
        // load may use x30 as `base`.
        .macro  frame_x2_x30 pair, single, base
        \pair   x2, x3, [\base, #16]
        \pair   x4, x5, [\base, #32]
        \pair   x6, x7, [\base, #48]
        \pair   x8, x9, [\base, #64]
        \pair   x10, x11, [\base, #80]
        \pair   x12, x13, [\base, #96]
        \pair   x14, x15, [\base, #112]
        \pair   x16, x17, [\base, #128]
        \pair   x18, x19, [\base, #144]
        \pair   x20, x21, [\base, #160]
        \pair   x22, x23, [\base, #176]
        \pair   x24, x25, [\base, #192]
        \pair   x26, x27, [\base, #208]
        \pair   x28, x29, [\base, #224]
        \single x30, [\base, #240]
        .endm
