//! The break-before-make monitor's fault injection at EL2, and the trace's
//! dump for the host: a VM whose invalidations are withheld
//! ([`s2mmu_el2::trace::TracedTlb::withhold`]) while the engine splits
//! blocks, protects pages and collapses them back, so the host's replay of
//! the trace must find each rule broken on that VM's table and none on the
//! tables before it.

use s2mmu::TlbInvalidate;
use s2mmu_el2::abi::{LogMode, Op};
use s2mmu_el2::trace;

use super::{hyp, Driver, OFF_BITMAP, PAGES};
use crate::board::SHARED;
use crate::semihosting::println;

/// The host's file the trace is written to (in QEMU's working directory).
const TRACE_FILE: &str = "el2-bbm.trace";

impl Driver {
    /// A new VM on 2 MiB blocks; the guest touches them.
    pub(super) fn inject_start(&mut self) {
        self.must(Op::VmDestroy, &[]);
        self.new_vm(LogMode::Manual, 0, 2 << 20);
        self.write_pass(64, 8);
    }

    /// Logging on (its protections invalidated), then every invalidation
    /// withheld while the guest's writes split the blocks.
    pub(super) fn inject_withhold(&mut self) {
        self.must(Op::LogSet, &[1, 1, LogMode::Manual as u64]);
        let table = hyp().with_mmu(|m| m.bbm_id()).unwrap_or(0);
        println(format_args!("el2: bbm_inject table={table:#x}"));
        self.tlb.withhold(true);
        self.write_pass(3, 9);
    }

    /// GET, CLEAR of the pages it names and COLLAPSE still withheld, then the invalidations back (a
    /// whole-VMID flush so no CPU keeps a stale entry), the trace written
    /// to the host, and the summary.
    pub(super) fn inject_end(&mut self) -> ! {
        let bm = SHARED.base + OFF_BITMAP;
        self.must(Op::GetDirty, &[1, bm, PAGES / 8]);
        self.must(Op::ClearDirty, &[1, 0, PAGES, bm, PAGES / 8]);
        let collapsed = self.must(Op::Collapse, &[1])[0];
        self.tlb.withhold(false);
        self.tlb.flush_vmid();
        let (ring, n) = trace::ring();
        // SAFETY: the ring holds `n` complete records; the other CPU waits
        // in its HVC, so nothing records any more.
        let bytes = unsafe { core::slice::from_raw_parts(ring.cast::<u8>(), n * trace::WORDS * 8) };
        let written = crate::semihosting::write_file(TRACE_FILE, bytes);
        println(format_args!(
            "el2: bbm_trace records={n} dropped={} written={} file={TRACE_FILE} collapsed={collapsed}",
            trace::dropped(),
            u8::from(written)
        ));
        if !written || trace::dropped() != 0 {
            self.failures += 1;
        }
        self.finish()
    }
}
