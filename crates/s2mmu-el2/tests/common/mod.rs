//! A host-side EL2: the dispatcher over a layout whose shared area and
//! table pool are this process's memory, and so is its RAM (which only a
//! remap's copy touches).

#![allow(dead_code)]

use std::sync::Arc;

use s2mmu::TlbInvalidate;
use s2mmu_el2::abi::{Command, HypError, LogMode, Op};
use s2mmu_el2::abort::{EC_DABT_LOW, EC_IABT_LOW};
use s2mmu_el2::{Hyp, Layout, PagePool, Region, Stage2Abort};
use std::sync::atomic::{AtomicU64, Ordering};

pub const CARVE: Region = Region::new(0x4000_0000, 32 << 20);
pub const RAM: Region = Region::new(0x4000_0000, 1 << 30);
pub const SHARED_PA: u64 = 0x7f00_0000;
pub const SHARED_BYTES: usize = 64 << 10;
pub const POOL_PAGES: usize = 1024;
/// Slot 0: 4 MiB at IPA 2 GiB backed at 0x4400_0000 (2 MiB pages).
pub const S0: [u64; 6] = [0, 0, 0x8000_0000, 4 << 20, 0x4400_0000, 2 << 20];

/// Page-aligned memory leaked for the test's lifetime.
fn leak_pages(bytes: usize) -> *mut u8 {
    let v: Vec<u8> = vec![0; bytes + 4096];
    let p = Box::leak(v.into_boxed_slice()).as_mut_ptr();
    p.wrapping_add(p.align_offset(4096))
}

/// Counts the invalidations EL2 asks for (a host has no TLB to flush).
#[derive(Default)]
pub struct CountingTlb {
    pub ipa: AtomicU64,
    pub range: AtomicU64,
    pub vmid: AtomicU64,
}

impl TlbInvalidate for CountingTlb {
    fn flush_ipa(&self, _ipa: u64, _level: Option<u32>) {
        self.ipa.fetch_add(1, Ordering::Relaxed);
    }
    fn flush_range(&self, _ipa: u64, _size: u64) {
        self.range.fetch_add(1, Ordering::Relaxed);
    }
    fn flush_vmid(&self) {
        self.vmid.fetch_add(1, Ordering::Relaxed);
    }
}

pub struct Host {
    pub hyp: Hyp,
    pub shared: *mut u8,
    /// Where this process holds RAM's bytes.
    pub ram: *mut u8,
    pub tlb: Arc<CountingTlb>,
}

impl Host {
    pub fn new() -> Host {
        let shared = leak_pages(SHARED_BYTES);
        // Untouched pages of a zeroed allocation cost nothing.
        let ram = leak_pages(RAM.size as usize);
        let layout = Layout {
            carve_out: CARVE,
            ram: RAM,
            shared: Region::new(SHARED_PA, SHARED_BYTES as u64),
            shared_va: shared,
            ram_va: ram,
        };
        let tlb = Arc::new(CountingTlb::default());
        // SAFETY: both buffers are leaked, page aligned, this test's alone.
        let hyp = unsafe {
            let pool = PagePool::new(
                CARVE.base + (16 << 20),
                leak_pages(POOL_PAGES * 4096),
                POOL_PAGES,
            );
            Hyp::new(layout, pool, tlb.clone()).unwrap()
        };
        Host {
            hyp,
            shared,
            ram,
            tlb,
        }
    }

    /// A host with a VM in `mode` (ring: 256 entries) and slot 0.
    pub fn with_slot(mode: LogMode) -> Host {
        let mut h = Host::new();
        let entries = if mode == LogMode::Ring { 256 } else { 0 };
        h.ok(Op::VmInit, &[mode as u64, entries, 1]);
        h.ok(Op::MemslotSet, &S0);
        h
    }

    /// Sends `op` through a command block; the status and results.
    pub fn send(&mut self, op: Op, args: &[u64]) -> Command {
        let mut c = Command::new(op, args);
        self.hyp.dispatch(&mut c);
        c
    }

    pub fn ok(&mut self, op: Op, args: &[u64]) -> [u64; 4] {
        let c = self.send(op, args);
        assert_eq!(c.status, 0, "{op:?} {args:x?} refused");
        c.ret
    }

    /// What EL2's state looks like from outside: slot records, which of
    /// a few guest pages are mapped and writable, the fault counters.
    pub fn state(&self) -> String {
        let slots: Vec<_> = (0..s2mmu_el2::MAX_SLOTS)
            .map(|i| self.hyp.slot(i))
            .collect();
        let maps: Option<Vec<_>> = self.hyp.with_mmu(|m| {
            (0..8u64)
                .map(|p| {
                    m.reader()
                        .translate(0x8000_0000 + p * 0x8000)
                        .map(|t| (t.pa, t.prot))
                })
                .collect()
        });
        let mut c = self.hyp.counters();
        (c.commands_ok, c.commands_refused) = (0, 0);
        format!("{slots:?} {maps:?} {c:?}")
    }

    /// Asserts `op` with `args` is refused with `err` and changes nothing.
    pub fn refused(&mut self, op: Op, args: &[u64], err: HypError) {
        let before = self.state();
        let shared_before = self.shared_bytes();
        let c = self.send(op, args);
        assert_eq!(c.status, err.status(), "{op:?} {args:x?}: want {err:?}");
        assert_eq!(c.ret, [0; 4]);
        assert_eq!(self.state(), before, "{op:?} {args:x?} changed EL2's state");
        assert_eq!(
            self.shared_bytes(),
            shared_before,
            "{op:?} wrote shared memory"
        );
    }

    pub fn shared_bytes(&self) -> Vec<u8> {
        // SAFETY: the shared buffer is SHARED_BYTES long and lives forever.
        unsafe { std::slice::from_raw_parts(self.shared, SHARED_BYTES) }.to_vec()
    }

    pub fn shared_word(&self, off: usize) -> u64 {
        // SAFETY: as above; callers pass 8-aligned offsets inside it.
        unsafe { (self.shared.add(off) as *const u64).read_volatile() }
    }

    /// The word of RAM at physical address `pa` (8-aligned, in RAM).
    pub fn ram_word(&self, pa: u64) -> u64 {
        // SAFETY: RAM's buffer is RAM.size long and lives forever.
        unsafe { (self.ram.add((pa - RAM.base) as usize) as *const u64).read_volatile() }
    }

    pub fn set_ram_word(&self, pa: u64, w: u64) {
        // SAFETY: as above.
        unsafe { (self.ram.add((pa - RAM.base) as usize) as *mut u64).write_volatile(w) }
    }

    pub fn set_shared_word(&self, off: usize, w: u64) {
        // SAFETY: as above.
        unsafe { (self.shared.add(off) as *mut u64).write_volatile(w) }
    }
}

/// A data abort at `ipa`: a translation fault (level 3) or a permission
/// fault, a write or a read.
pub fn dabt(ipa: u64, write: bool, permission: bool) -> Stage2Abort {
    let fsc = if permission { 0b001111 } else { 0b000111 };
    Stage2Abort {
        esr: EC_DABT_LOW << 26 | u64::from(write) << 6 | fsc,
        far: ipa & 0xfff,
        hpfar: (ipa >> 12) << 4,
    }
}

/// An instruction abort (translation) at `ipa`.
pub fn iabt(ipa: u64) -> Stage2Abort {
    Stage2Abort {
        esr: EC_IABT_LOW << 26 | 0b000111,
        far: ipa & 0xfff,
        hpfar: (ipa >> 12) << 4,
    }
}

/// Bytes `COUNTERS` writes.
pub const COUNTERS_BYTES: u64 = std::mem::size_of::<s2mmu_el2::Counters>() as u64;
