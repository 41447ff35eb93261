//! Arm semihosting (`HLT #0xF000`): QEMU's `-semihosting` prints and exits.

use alloc::string::String;
use core::arch::asm;
use core::fmt::Write;

const SYS_OPEN: u64 = 0x01;
const SYS_CLOSE: u64 = 0x02;
const SYS_WRITE0: u64 = 0x04;
const SYS_WRITE: u64 = 0x05;
/// `SYS_OPEN`'s mode "wb".
const MODE_WB: u64 = 5;
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

/// Writes `bytes` to the host's file `name` (relative to QEMU's working
/// directory), replacing it; whether every byte was written.
pub fn write_file(name: &str, bytes: &[u8]) -> bool {
    let mut path = String::from(name);
    path.push('\0');
    let open = [path.as_ptr() as u64, MODE_WB, name.len() as u64];
    let handle = call(SYS_OPEN, open.as_ptr() as u64);
    if handle as i64 == -1 {
        return false;
    }
    let write = [handle, bytes.as_ptr() as u64, bytes.len() as u64];
    // SYS_WRITE answers the bytes it did not write.
    let left = call(SYS_WRITE, write.as_ptr() as u64);
    let closed = call(SYS_CLOSE, [handle].as_ptr() as u64);
    left == 0 && closed == 0
}

/// Ends QEMU with exit code `code`.
pub fn exit(code: u64) -> ! {
    let block = [ADP_STOPPED_APPLICATION_EXIT, code];
    call(SYS_EXIT_EXTENDED, block.as_ptr() as u64);
    loop {
        core::hint::spin_loop();
    }
}
