//! The memstress guest program, assembled by [`crate::asm`], and the host-side model of
//! which pages it writes.
//!
//! Register interface (set by the host through `KVM_SET_REGS` before the first entry):
//!
//! | register | meaning |
//! |---|---|
//! | `rdi` | guest-virtual base of this vCPU's region |
//! | `rsi` | number of 4 KiB pages in the region |
//! | `r8`  | guest-virtual address of the MMIO "pass done" doorbell |
//! | `r9`  | guest-virtual address of the control block (word 0: write threshold) |
//! | `r10` | this vCPU's random state (xorshift64, never 0) |
//! | `rax` | the value written (memstress writes `0x0123456789ABCDEF`) |
//!
//! Each pass touches one u64 at the start of every page in order, like
//! `memstress_guest_code` with sequential access: it steps the random state once per page
//! and writes when `state & 0xffff < threshold` (so threshold `0x10000` writes every page
//! and `0` reads every page), then stores `rax` to the doorbell, which no memslot covers:
//! `KVM_RUN` returns `KVM_EXIT_MMIO`. Re-entering `KVM_RUN` starts the next pass, which
//! re-reads the threshold from the control block.

use crate::asm::{Assembler, Cond, Reg};

/// The value memstress writes to each page.
pub const MEMSTRESS_VALUE: u64 = 0x0123_4567_89AB_CDEF;
/// Page stride of the access loop (the guest page size).
pub const GUEST_PAGE_SIZE: u64 = 4096;
/// Threshold that makes every access a write.
pub const THRESHOLD_ALL_WRITES: u64 = 0x10000;

/// Assembles the memstress pass loop.
pub fn memstress_program() -> Vec<u8> {
    let mut a = Assembler::new();
    let pass = a.label();
    let page = a.label();
    let read = a.label();
    let next = a.label();

    a.bind(pass);
    a.load(Reg::R11, Reg::R9, 0); // threshold for this pass
    a.mov_rr(Reg::Rcx, Reg::Rdi); // cursor
    a.mov_rr(Reg::Rdx, Reg::Rsi); // pages left

    a.bind(page);
    // xorshift64 (13, 7, 17) on r10, rbx as scratch.
    for (left, shift) in [(true, 13u8), (false, 7), (true, 17)] {
        a.mov_rr(Reg::Rbx, Reg::R10);
        if left {
            a.shl_ri(Reg::Rbx, shift);
        } else {
            a.shr_ri(Reg::Rbx, shift);
        }
        a.xor_rr(Reg::R10, Reg::Rbx);
    }
    a.mov_rr(Reg::Rbx, Reg::R10);
    a.and_ri(Reg::Rbx, 0xffff);
    a.cmp_rr(Reg::Rbx, Reg::R11);
    a.jcc(Cond::AboveOrEqual, read);
    a.store(Reg::Rcx, 0, Reg::Rax);
    a.jmp(next);
    a.bind(read);
    a.load(Reg::Rbx, Reg::Rcx, 0);
    a.bind(next);
    a.add_ri(Reg::Rcx, GUEST_PAGE_SIZE as i32);
    a.dec(Reg::Rdx);
    a.jcc(Cond::NotEqual, page);

    a.store(Reg::R8, 0, Reg::Rax); // doorbell: exits with KVM_EXIT_MMIO
    a.jmp(pass);
    // Every label above is bound, so finishing cannot fail.
    a.finish().unwrap_or_default()
}

/// The write threshold for a write percentage (0..=100), as the guest compares it.
pub fn write_threshold(write_percent: u32) -> u64 {
    u64::from(write_percent.min(100)) * THRESHOLD_ALL_WRITES / 100
}

/// The guest's random step, replicated on the host.
pub fn xorshift_step(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// The initial random state of vCPU `vcpu` (never 0, distinct per vCPU).
pub fn initial_random_state(vcpu: u32) -> u64 {
    0x9E37_79B9_7F4A_7C15 ^ (u64::from(vcpu) + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9)
}

/// Replays one pass of the guest on the host: calls `on_write(page)` for each page the
/// guest writes, and returns the random state after the pass.
pub fn replay_pass(
    mut state: u64,
    pages: u64,
    threshold: u64,
    mut on_write: impl FnMut(u64),
) -> u64 {
    for page in 0..pages {
        state = xorshift_step(state);
        if state & 0xffff < threshold {
            on_write(page);
        }
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_bytes_are_stable() {
        let code = memstress_program();
        // mov 0x0(%r9),%r11 ; mov %rdi,%rcx ; mov %rsi,%rdx
        assert_eq!(
            &code[..13],
            &[0x4d, 0x8b, 0x99, 0, 0, 0, 0, 0x48, 0x89, 0xf9, 0x48, 0x89, 0xf2]
        );
        // ... ends with mov %rax,0x0(%r8) ; jmp back to offset 0.
        let n = code.len();
        assert_eq!(&code[n - 12..n - 5], &[0x49, 0x89, 0x80, 0, 0, 0, 0]);
        assert_eq!(code[n - 5], 0xe9);
        let rel = i32::from_le_bytes(code[n - 4..].try_into().unwrap());
        assert_eq!(rel, -(n as i32));
        // The page-write store is present: mov %rax,0x0(%rcx).
        assert!(code.windows(7).any(|w| w == [0x48, 0x89, 0x81, 0, 0, 0, 0]));
    }

    #[test]
    fn thresholds_and_replay() {
        assert_eq!(write_threshold(100), THRESHOLD_ALL_WRITES);
        assert_eq!(write_threshold(0), 0);
        assert_eq!(write_threshold(250), THRESHOLD_ALL_WRITES);
        let mut all = 0;
        replay_pass(initial_random_state(0), 1000, write_threshold(100), |_| {
            all += 1
        });
        assert_eq!(all, 1000);
        let mut none = 0;
        replay_pass(initial_random_state(0), 1000, 0, |_| none += 1);
        assert_eq!(none, 0);
        let mut half = 0;
        replay_pass(initial_random_state(3), 10000, write_threshold(50), |_| {
            half += 1
        });
        assert!((4000..6000).contains(&half), "{half}");
        assert_ne!(initial_random_state(0), initial_random_state(1));
        assert_ne!(initial_random_state(7), 0);
    }
}
