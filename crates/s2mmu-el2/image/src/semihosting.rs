//! Arm semihosting (`HLT #0xF000`): QEMU's `-semihosting` prints and exits.

use alloc::string::String;
use core::arch::asm;
use core::fmt::Write;

const SYS_WRITE0: u64 = 0x04;
const SYS_EXIT_EXTENDED: u64 = 0x20;
const ADP_STOPPED_APPLICATION_EXIT: u64 = 0x20026;

fn call(op: u64, arg: u64) -> u64 {
    let r: u64;
    // SAFETY: QEMU's semihosting reads only the argument block `arg`
    // points to, which the caller keeps alive across the call.
    unsafe { asm!("hlt #0xf000", inout("x0") op => r, in("x1") arg, options(nostack)) };
    r
}

/// Prints a line.
pub fn println(args: core::fmt::Arguments) {
    let mut s = String::new();
    let _ = s.write_fmt(args);
    s.push_str("\n\0");
    call(SYS_WRITE0, s.as_ptr() as u64);
}

/// Ends QEMU with exit code `code`.
pub fn exit(code: u64) -> ! {
    let block = [ADP_STOPPED_APPLICATION_EXIT, code];
    call(SYS_EXIT_EXTENDED, block.as_ptr() as u64);
    loop {
        core::hint::spin_loop();
    }
}
