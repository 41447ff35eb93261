//! The effect of a harvest's invalidations, judged by a CPU's TLB: a
//! benchmark that times CLEAR with no guest running checks nothing about
//! what its TLBIs did. Here an idle CPU first writes each sampled page
//! through a writable translation, so QEMU's TLB of that CPU holds it;
//! the harvest then write-protects the pages and invalidates them from
//! the service CPU (the broadcast forms); a second write must now take a
//! stage-2 permission fault. A write that goes through used a stale
//! translation: the invalidation missed that CPU, that page or that VMID.

use crate::vm::{Arm64Mmu, Arm64Vm};
use crate::{Arm64Error, Result};

/// What the check saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProtectEffect {
    /// Pages written before the harvest (and so cached writable).
    pub pages: u64,
    /// Of those, the pages whose second write took a permission fault.
    pub protected: u64,
    /// IPAs whose second write went through: stale translations.
    pub stale: Vec<u64>,
}

/// Pages a check samples: `n` spread over `npages` (first and last
/// included).
pub fn spread(npages: u64, n: u64) -> Vec<u64> {
    if npages == 0 || n == 0 {
        return Vec::new();
    }
    let n = n.min(npages);
    (0..n)
        .map(|k| {
            if n == 1 {
                0
            } else {
                k * (npages - 1) / (n - 1)
            }
        })
        .collect()
}

/// Dirties `pages` (offsets in slot `slot`, at `gpa`) as a guest write's
/// fault would, writes each from CPU `cpu`, runs `harvest` (GET and CLEAR
/// with the policy under test), and writes each again from `cpu`.
///
/// # Errors
/// The engine's or the model's errors; [`Arm64Error::Guest`] when a first
/// write faults (the page was not made writable) or a second write takes
/// another fault than a stage-2 permission fault.
pub fn protect_effect(
    vm: &Arm64Vm,
    slot: u16,
    gpa: u64,
    pages: &[u64],
    cpu: usize,
    harvest: impl FnOnce(&Arm64Mmu) -> Result<()>,
) -> Result<ProtectEffect> {
    let page = 4096;
    // The relax's local TLBI belongs to the faulting CPU's answer; no
    // guest faulted, and the first write below fills the TLB anyway.
    let (r, _local) = vm
        .sink()
        .collect_for_fault(|| vm.mmu().dirty_pages(slot, pages.iter().copied()));
    r?;
    for &p in pages {
        let ipa = gpa + p * page;
        if let Err(e) = vm.probe(cpu, ipa, Some(0x5e5e_0000 | p))? {
            return Err(Arm64Error::Guest(format!(
                "write to {ipa:#x} before the harvest faulted: ESR_EL2 {:#x}",
                e.esr
            )));
        }
    }
    harvest(vm.mmu())?;
    let mut out = ProtectEffect {
        pages: pages.len() as u64,
        ..ProtectEffect::default()
    };
    for &p in pages {
        let ipa = gpa + p * page;
        match vm.probe(cpu, ipa, Some(0x5e5f_0000 | p))? {
            Ok(_) => out.stale.push(ipa),
            Err(e) if e.dfsc() >> 2 == 0b0011 && e.write() && e.ipa() == ipa => out.protected += 1,
            Err(e) => {
                return Err(Arm64Error::Guest(format!(
                "write to {ipa:#x} after the harvest: fault status {:#x}, not a permission fault",
                e.dfsc()
            )))
            }
        }
    }
    Ok(out)
}
