// Small EL1 guests for the Linux VM's host (`linux::vm::run`): an arm64
// `Image` (the boot protocol's 64-byte header) whose scenario is the word
// at offset 64, which the tests write before they hand the file over.
// Each scenario does one thing a hostile or broken kernel may do (sleep
// with interrupts masked, power every CPU off, loop on exits, send SGIs,
// make accesses with no syndrome) and reports on the 16550 at UART (the
// device tree's `FdtConfig::virt` place) in lines "el1: ...". The code is
// position independent; the kernel runs at RAM + 0 with its MMU off.

        .equ UART, 0x09000000
        .equ GICD, 0x08000000
        .equ GICR, 0x080a0000
        .equ GICR_STRIDE, 0x20000
        .equ NOWHERE, 0x0a000000        // no device, no RAM
        .equ PSCI_VERSION, 0x84000000
        .equ CPU_OFF, 0x84000002
        .equ CPU_ON, 0xc4000003
        .equ CPU_ON32, 0x84000003
        .equ AFFINITY_INFO, 0xc4000004
        .equ SYSTEM_OFF, 0x84000008
        .equ SYSTEM_RESET, 0x84000009
        .equ FEATURES, 0x8400000a
        .equ STACK, 4096
        .equ IPI_SGIS, 20000

        // Prints x0 in hex, then a space.
        .macro  puthex_sp
        bl      puthex
        mov     x0, #' '
        bl      putc
        .endm

        .text
        .globl  _head
_head:
        b       start                   // code0
        .long   0                       // code1
        .quad   0                       // text_offset
        .quad   _end - _head            // image_size
        .quad   0                       // flags: little-endian
        .quad   0, 0, 0
        .ascii  "ARM\x64"
        .long   0
scenario:
        .quad   0                       // offset 64: which test runs
up_flags:
        .quad   0, 0, 0, 0              // 1 once a secondary runs, per vCPU
sgis_seen:
        .quad   0, 0, 0, 0              // SGIs taken, per vCPU

start:
        adr     x1, scenario
        ldr     x1, [x1]
        cmp     x1, #3
        b.eq    never_boots             // before the stack: nothing works
        mov     x19, #0                 // this CPU's index
        bl      cpu_setup
        adr     x0, s_hello
        bl      puts
        adr     x1, scenario
        ldr     x1, [x1]
        adr     x2, table
        cmp     x1, #13                 // the table's entries
        b.hs    wfi_masked
        add     x2, x2, x1, lsl #2
        br      x2
table:
        b       wfi_masked              // 0
        b       spin                    // 1
        b       exit_loop               // 2
        b       never_boots             // 3
        b       cpu_off_one             // 4
        b       system_off              // 5
        b       system_reset            // 6
        b       cpu_off_all             // 7
        b       psci_args               // 8
        b       nisv                    // 9
        b       ipi                     // 10
        b       wfi_all                 // 11
        b       sgi_targets             // 12

// x19 = CPU index: its stack, its vectors.
cpu_setup:
        adr     x0, stacks
        add     x1, x19, #1
        mov     x2, #STACK
        madd    x0, x1, x2, x0
        mov     sp, x0
        adr     x0, vectors
        msr     vbar_el1, x0
        isb
        mov     x28, #UART
        ret

// ---- scenarios ------------------------------------------------------

wfi_masked:
        msr     daifset, #0xf
1:      wfi
        b       1b

spin:
        msr     daifset, #0xf
1:      b       1b

exit_loop:
        msr     daifset, #0xf
1:      ldr     x0, =PSCI_VERSION
        hvc     #0
        b       1b

never_boots:
        // No vectors (VBAR_EL1 is 0, outside RAM): the UNDEF's vector
        // cannot be fetched, and the abort's cannot either.
        .inst   0x00000000

cpu_off_one:
        ldr     x0, =CPU_OFF
        hvc     #0
        adr     x0, s_fail
        bl      puts
        b       wfi_masked

system_off:
        ldr     x0, =SYSTEM_OFF
        hvc     #0
        b       wfi_masked

system_reset:
        ldr     x0, =SYSTEM_RESET
        hvc     #0
        b       wfi_masked

cpu_off_all:
        adr     x1, second_off
        bl      start_secondaries
        ldr     x0, =CPU_OFF
        hvc     #0
        b       wfi_masked

wfi_all:
        adr     x1, second_wfi
        bl      start_secondaries
        b       wfi_masked

// Starts CPUs 1, 2, ... at x1 until CPU_ON refuses; x0 of each is its
// index. Returns once each one ran.
start_secondaries:
        stp     x30, x20, [sp, #-16]!
        mov     x20, x1
        mov     x21, #1
1:      ldr     x0, =CPU_ON
        mov     x1, x21
        mov     x2, x20
        mov     x3, x21
        hvc     #0
        cbnz    x0, 2f
        add     x21, x21, #1
        b       1b
2:      sub     x21, x21, #1            // secondaries started
        adr     x1, up_flags
        mov     x3, #1
3:      cmp     x3, x21
        b.hi    5f
4:      ldr     x2, [x1, x3, lsl #3]
        cbz     x2, 4b
        add     x3, x3, #1
        b       3b
5:      mov     x0, x21
        ldp     x30, x20, [sp], #16
        ret

// A secondary's entry: x0 = its index.
secondary:
        mov     x27, x30
        mov     x19, x0
        bl      cpu_setup
        adr     x1, up_flags
        mov     x2, #1
        str     x2, [x1, x19, lsl #3]
        ret     x27

second_off:
        bl      secondary
        ldr     x0, =CPU_OFF
        hvc     #0
        b       wfi_masked

second_wfi:
        bl      secondary
        b       wfi_masked

// PSCI calls with every argument bit that must be checked: prints
// "el1: psci <n> <x0>" for each, then powers off.
psci_args:
        mov     x20, #0
        adr     x21, psci_cases
1:      ldp     x0, x1, [x21], #16
        ldp     x2, x3, [x21], #16
        cbz     x0, 2f
        hvc     #0
        mov     x22, x0
        adr     x0, s_psci
        bl      puts
        mov     x0, x20
        puthex_sp
        mov     x0, x22
        bl      puthex
        bl      newline
        add     x20, x20, #1
        b       1b
2:      b       system_off

        .balign 16
psci_cases:
        .quad   CPU_ON, 0x01000000, 0, 0        // 0: Aff bits 24-31
        .quad   CPU_ON, 0x80000000, 0, 0        // 1: bit 31
        .quad   CPU_ON, 0x10000000000, 0, 0     // 2: bit 40
        .quad   CPU_ON, 0, 0, 0                 // 3: itself: ALREADY_ON
        .quad   CPU_ON32, 0x100000000, 0, 0     // 4: SMC32: upper half ignored
        .quad   AFFINITY_INFO, 0x01000000, 0, 0 // 5: Aff bits 24-31
        .quad   AFFINITY_INFO, 0, 1, 0          // 6: level 1
        .quad   AFFINITY_INFO, 0, 0, 0          // 7: itself: ON
        .quad   FEATURES, 0x100000000 + CPU_OFF, 0, 0   // 8: upper half
        .quad   FEATURES, CPU_OFF, 0, 0         // 9: CPU_OFF: SUCCESS
        .quad   0x184000000, 0, 0, 0            // 10: x0's upper half
        .quad   0, 0, 0, 0

// Accesses with no syndrome to a device: each one's exception is printed
// by the vector ("el1: sync esr far"), then "el1: after <name> x0 x3".
// The stage-1 tables make the device range Normal memory, so that DC ZVA
// reaches stage 2 instead of faulting at stage 1; FP/SIMD is enabled for
// the vector forms.
nisv:
        bl      mmu_on
        mov     x1, #(3 << 20)          // CPACR_EL1.FPEN: FP/SIMD on
        msr     cpacr_el1, x1
        isb
        adr     x20, nisv_forms
1:      ldr     w1, [x20]
        cbz     w1, 2f
        adr     x0, s_form
        bl      puts
        add     x0, x20, #4
        bl      puts
        bl      newline
        ldr     x0, =NOWHERE
        mov     x3, #0x5a
        mov     x4, #0xa5
        add     x2, x20, #12            // the form's code
        blr     x2
        mov     x21, x0
        mov     x22, x3
        adr     x0, s_after
        bl      puts
        mov     x0, x21
        puthex_sp
        mov     x0, x22
        bl      puthex
        bl      newline
        add     x20, x20, #20
        b       1b
2:      b       system_off

// Each form: a 4-byte tag, an 8-byte name, its instruction, ret. (A
// store-exclusive is not among them: with the monitor never set on a
// device, it fails without an access.)
        .balign 4
nisv_forms:
        .long   1
        .ascii  "strpost\0"
        str     w3, [x0], #4
        ret
        .long   1
        .ascii  "ldrpre\0\0"
        ldr     w3, [x0, #4]!
        ret
        .long   1
        .ascii  "stp\0\0\0\0\0"
        stp     w3, w4, [x0]
        ret
        .long   1
        .ascii  "ldp\0\0\0\0\0"
        ldp     w3, w4, [x0]
        ret
        .long   1
        .ascii  "ldxr\0\0\0\0"
        ldxr    w3, [x0]
        ret
        .long   1
        .ascii  "dczva\0\0\0"
        dc      zva, x0
        ret
        .long   1
        .ascii  "ld1\0\0\0\0\0"
        ld1     {v0.4s}, [x0]
        ret
        .long   1
        .ascii  "st1post\0"
        st1     {v0.4s}, [x0], #16
        ret
        .long   0

mmu_on:
        adr     x0, l1_table
        ldr     x1, =0x701              // block, AF, inner shareable, attr 0
        str     x1, [x0]
        ldr     x1, =0x40000701
        str     x1, [x0, #8]
        msr     ttbr0_el1, x0
        mov     x1, #0xff               // attr 0: Normal write-back
        msr     mair_el1, x1
        // T0SZ 32, walks inner/outer write-back, inner shareable, 4 KiB,
        // TTBR1 walks off, 32-bit PA.
        ldr     x1, =(32 | 1 << 8 | 1 << 10 | 3 << 12 | 1 << 23)
        msr     tcr_el1, x1
        isb
        mrs     x1, sctlr_el1
        orr     x1, x1, #1              // M
        orr     x1, x1, #(1 << 2)       // C
        orr     x1, x1, #(1 << 12)      // I
        msr     sctlr_el1, x1
        isb
        ret

// SGIs: vCPU 0 turns the others on (each waits in WFI with its SGIs
// enabled), then sends IPI_SGIS SGIs 1 to every vCPU (itself included)
// and prints the counter ticks they took, the counter's frequency and
// how many of them vCPU 0 took itself.
ipi:
        bl      irq_on
        adr     x1, second_irq
        bl      start_secondaries
        add     x21, x0, #1             // vCPUs
        mov     x1, #1
        lsl     x1, x1, x21
        sub     x1, x1, #1              // target list: every vCPU
        orr     x22, x1, #(1 << 24)     // INTID 1
        ldr     x20, =IPI_SGIS
        isb
        mrs     x23, cntvct_el0
1:      msr     icc_sgi1r_el1, x22
        subs    x20, x20, #1
        b.ne    1b
        isb
        mrs     x24, cntvct_el0
        adr     x0, s_ipi
        bl      puts
        mov     x0, x21
        puthex_sp
        ldr     x0, =IPI_SGIS
        puthex_sp
        sub     x0, x24, x23
        puthex_sp
        mrs     x0, cntfrq_el0
        puthex_sp
        adr     x1, sgis_seen           // the ones vCPU 0 took
        ldr     x0, [x1]
        bl      puthex
        bl      newline
        b       system_off

second_irq:
        bl      secondary
        bl      irq_on
1:      wfi
        b       1b

// SGIs to a target list: vCPU 1 takes them in WFI, vCPU 2 spins with its
// interrupts masked (it is no target and must never leave its guest for
// them), vCPU 0 sends 1000 to vCPU 1 and 1 to vCPU 3 while vCPU 3 is off,
// then turns vCPU 3 on: it must take the queued one.
sgi_targets:
        bl      irq_on
        ldr     x0, =((1 << 24) | (1 << 3))     // INTID 1 to vCPU 3
        msr     icc_sgi1r_el1, x0
        isb
        ldr     x0, =CPU_ON
        mov     x1, #1
        adr     x2, second_irq
        mov     x3, #1
        hvc     #0
        ldr     x0, =CPU_ON
        mov     x1, #2
        adr     x2, second_spin
        mov     x3, #2
        hvc     #0
        adr     x1, up_flags
1:      ldr     x2, [x1, #8]
        cbz     x2, 1b
        ldr     x2, [x1, #16]
        cbz     x2, 1b
        mov     x20, #1000
        ldr     x22, =((1 << 24) | (1 << 1))    // INTID 1 to vCPU 1
2:      msr     icc_sgi1r_el1, x22
        subs    x20, x20, #1
        b.ne    2b
        ldr     x0, =CPU_ON
        mov     x1, #3
        adr     x2, second_irq
        mov     x3, #3
        hvc     #0
        // Wait until vCPU 3 took its SGI and vCPU 1 took at least one.
        adr     x1, sgis_seen
3:      ldr     x2, [x1, #24]
        ldr     x3, [x1, #8]
        cbz     x2, 3b
        cbz     x3, 3b
        adr     x0, s_sgis
        bl      puts
        adr     x1, sgis_seen
        ldr     x0, [x1, #8]
        puthex_sp
        adr     x1, sgis_seen
        ldr     x0, [x1, #24]
        bl      puthex
        bl      newline
        b       system_off

second_spin:
        bl      secondary
        b       spin

// Enables group 1 at the distributor, wakes this CPU's redistributor,
// makes SGIs 0-15 group 1 and enables them there, and IRQs at the (virtual)
// CPU interface and in PSTATE: what a GICv3 needs, ours or QEMU's.
irq_on:
        ldr     x0, =GICD
        mov     w1, #0x13               // EnableGrp0, EnableGrp1, ARE
        str     w1, [x0]
        ldr     x0, =GICR
        mov     x1, #GICR_STRIDE
        madd    x0, x19, x1, x0
        str     wzr, [x0, #0x14]        // GICR_WAKER: awake
1:      ldr     w1, [x0, #0x14]
        tbnz    w1, #2, 1b              // ChildrenAsleep
        add     x0, x0, #0x10000        // the SGI frame
        mov     w1, #-1
        str     w1, [x0, #0x80]         // IGROUPR0: group 1
        mov     w1, #0xffff
        str     w1, [x0, #0x100]        // ISENABLER0
        mov     x1, #0xff
        msr     icc_pmr_el1, x1
        mov     x1, #1
        msr     icc_igrpen1_el1, x1
        isb
        msr     daifclr, #2
        ret

// ---- exceptions -----------------------------------------------------

        .balign 2048
vectors:
        .rept   4                       // current EL with SP_EL0
        b       bad_vector
        .balign 128
        .endr
        b       sync_cur                // current EL with SP_EL1
        .balign 128
        b       irq_cur
        .balign 128
        .rept   10                      // FIQ, SError; lower ELs
        b       bad_vector
        .balign 128
        .endr

bad_vector:
        adr     x0, s_bad
        bl      puts
        b       wfi_masked

// A synchronous exception at EL1 (an injected abort): prints ESR_EL1 and
// FAR_EL1, then goes on after the instruction. x0-x3 and x30 are kept.
sync_cur:
        stp     x0, x1, [sp, #-48]!
        stp     x2, x3, [sp, #16]
        str     x30, [sp, #32]
        adr     x0, s_sync
        bl      puts
        mrs     x0, esr_el1
        puthex_sp
        mrs     x0, far_el1
        bl      puthex
        bl      newline
        mrs     x0, elr_el1
        add     x0, x0, #4
        msr     elr_el1, x0
        ldr     x30, [sp, #32]
        ldp     x2, x3, [sp, #16]
        ldp     x0, x1, [sp], #48
        eret

// An IRQ: acknowledged, counted for this CPU (x19), ended.
irq_cur:
        stp     x0, x1, [sp, #-16]!
        stp     x2, x3, [sp, #-16]!
        mrs     x0, icc_iar1_el1
        cmp     x0, #1020               // spurious: nothing to end
        b.hs    1f
        adr     x1, sgis_seen
        ldr     x2, [x1, x19, lsl #3]
        add     x2, x2, #1
        str     x2, [x1, x19, lsl #3]
        msr     icc_eoir1_el1, x0
1:      ldp     x2, x3, [sp], #16
        ldp     x0, x1, [sp], #16
        eret

// ---- console --------------------------------------------------------

// putc(w0); keeps every register but x0.
putc:
        strb    w0, [x28]
        ret

newline:
        mov     x0, #'\n'
        b       putc

// puts(x0 = NUL-terminated string); keeps every register but x0, x1.
puts:
        mov     x1, x0
        str     x30, [sp, #-16]!
1:      ldrb    w0, [x1], #1
        cbz     w0, 2f
        bl      putc
        b       1b
2:      ldr     x30, [sp], #16
        ret

// puthex(x0): 16 hex digits; keeps every register but x0-x3.
puthex:
        str     x30, [sp, #-16]!
        mov     x2, x0
        mov     x3, #60
1:      lsr     x0, x2, x3
        and     x0, x0, #0xf
        cmp     x0, #10
        add     x1, x0, #'0'
        add     x0, x0, #('a' - 10)
        csel    x0, x1, x0, lo
        bl      putc
        subs    x3, x3, #4
        b.pl    1b
        ldr     x30, [sp], #16
        ret

s_hello: .asciz "el1: hello\n"
s_fail:  .asciz "el1: FAIL\n"
s_bad:   .asciz "el1: unexpected exception\n"
s_psci:  .asciz "el1: psci "
s_form:  .asciz "el1: form "
s_after: .asciz "el1: after "
s_sync:  .asciz "el1: sync "
s_ipi:   .asciz "el1: ipi "
s_sgis:  .asciz "el1: sgis "

        .ltorg
        .balign 4096
l1_table:
        .space  4096
stacks:
        .space  STACK * 4
_end:
