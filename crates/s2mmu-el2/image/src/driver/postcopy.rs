//! Post-copy at EL2, the host's side played by the driver: the data slot
//! is post-copy, so no page is mapped until it has arrived. Each first
//! touch exits ([`s2mmu_el2::AbortOutcome::PageMissing`]); the host writes
//! the page's contents into its backing and sends `PAGE_READY`, EL2 maps
//! it, and the guest's write retried completes on top of them.

use core::arch::asm;
use s2mmu_el2::abi::{LogMode, Op};
use s2mmu_el2::FLAG_POSTCOPY;

use super::{fail, Driver, DATA_BACKING, DATA_IPA, PAGES};
use crate::semihosting::println;

/// What the guest writes into word 0 of each page.
const GUEST_VALUE: u64 = 0x5005;
const WORDS: u64 = 4096 / 8;
/// The backing's contents before any page arrived.
const POISON: u64 = 0xdead_beef_dead_beef;

/// Word `w` of page `p` as the host sends it.
fn content(p: u64, w: u64) -> u64 {
    0xc0de_0000_0000_0000 | p << 16 | w
}

fn word(p: u64, w: u64) -> *mut u64 {
    (DATA_BACKING + p * 4096 + w * 8) as *mut u64
}

/// Cleans and invalidates page `p`'s backing to the point of coherency:
/// the guest, its stage 1 off, accesses it non-cacheable.
fn sync_page(p: u64) {
    let mut a = DATA_BACKING + p * 4096;
    while a < DATA_BACKING + (p + 1) * 4096 {
        // SAFETY: a cache maintenance by address of the data backing,
        // mapped Normal at EL2; it changes no memory's contents.
        unsafe { asm!("dc civac, {}", in(reg) a, options(nostack)) };
        a += 64;
    }
    // SAFETY: a barrier.
    unsafe { asm!("dsb ish", options(nostack)) };
}

impl Driver {
    /// A VM whose data slot is post-copy, its backing poisoned (nothing
    /// has arrived); the guest writes every page.
    pub(super) fn postcopy_start(&mut self) {
        self.must(Op::VmDestroy, &[]);
        for p in 0..PAGES {
            for w in 0..WORDS {
                // SAFETY: the data backing, RAM outside the carve-out that
                // no VM maps now.
                unsafe { word(p, w).write_volatile(POISON) };
            }
            sync_page(p);
        }
        self.sent = alloc::vec![0; PAGES as usize];
        self.mark_faults();
        self.new_vm_flags(LogMode::WpGet, 0, 4096, FLAG_POSTCOPY);
        self.write_pass(1, GUEST_VALUE);
    }

    /// The host's answer to a missing page at `ipa`: its contents into the
    /// backing, then `PAGE_READY`.
    pub(super) fn postcopy_fill(&mut self, ipa: u64) {
        let p = ipa.wrapping_sub(DATA_IPA) / 4096;
        if ipa < DATA_IPA || p >= PAGES {
            fail(format_args!(
                "a missing page outside the data slot: {ipa:#x}"
            ));
        }
        for w in 0..WORDS {
            // SAFETY: page `p` of the data backing, not mapped yet.
            unsafe { word(p, w).write_volatile(content(p, w)) };
        }
        sync_page(p);
        self.must(Op::PageReady, &[1, p]);
        self.sent[p as usize] += 1;
    }

    /// Every page arrived once, through its exit, and holds the host's
    /// contents under the guest's word.
    pub(super) fn postcopy_check(&mut self) {
        let once = self.sent.iter().filter(|&&n| n == 1).count();
        let exits: u32 = self.sent.iter().sum();
        let mut ok = 0;
        for p in 0..PAGES {
            sync_page(p);
            // SAFETY: the data backing, read after the pass.
            let read = |w: u64| unsafe { word(p, w).read_volatile() };
            if read(0) == GUEST_VALUE && (1..WORDS).all(|w| read(w) == content(p, w)) {
                ok += 1;
            }
        }
        let c = super::hyp().counters();
        let faults = c.permission + c.translation - self.fault_mark;
        println(format_args!(
            "el2: postcopy pages={PAGES} exits={exits} arrived_once={once} contents_ok={ok} faults={faults}"
        ));
        if once as u64 != PAGES || exits as u64 != PAGES || ok != PAGES {
            self.failures += 1;
        }
    }
}
