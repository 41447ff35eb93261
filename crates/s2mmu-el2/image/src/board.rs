//! What the image's entry points and its driver share about the machine:
//! the memory map (EL2's carve-out with the heap and the table pool in
//! it, the guest's RAM, the area shared with the host), the registers a
//! trap saved, and reading a system register.

use s2mmu_el2::Region;

/// EL2's carve-out: no guest mapping may reach it.
pub const CARVE_OUT: Region = Region::new(0x4000_0000, 32 << 20);
pub const HEAP_BASE: usize = 0x4100_0000;
pub const HEAP_BYTES: usize = 8 << 20;
pub const POOL_BASE: u64 = 0x4180_0000;
pub const POOL_PAGES: usize = 2048;
/// The guest's RAM (what a slot may be backed by): the rest of `-m 256M`.
pub const RAM: Region = Region::new(0x4000_0000, 256 << 20);
pub const SHARED: Region = Region::new(0x4300_0000, 256 << 10);

/// The registers a trap saved (`boot.S`'s frame).
#[repr(C)]
pub struct Frame {
    /// x0-x30.
    pub x: [u64; 31],
    /// `CNTVCT_EL0` at the vector's entry.
    pub entry_ticks: u64,
}

/// Reads a system register.
macro_rules! sysreg {
    ($name:literal) => {{
        let v: u64;
        // SAFETY: reading an EL2-accessible system register has no side
        // effect.
        unsafe {
            core::arch::asm!(concat!("mrs {}, ", $name), out(reg) v, options(nomem, nostack))
        };
        v
    }};
}
pub(crate) use sysreg;
