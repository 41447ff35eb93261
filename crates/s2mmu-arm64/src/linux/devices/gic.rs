//! The Linux guest's interrupt controller: a GICv3 whose distributor and
//! redistributors the host emulates (MMIO aborts in their IPA ranges) and
//! whose CPU interface is the hardware's virtual one (ICV_* registers,
//! through HCR_EL2.IMO/FMO). Interrupts reach a vCPU through its list
//! registers: at every exit the host merges what is pending for the vCPU
//! into the free ones ([`Gic::sync_lrs`]), as Linux's `vgic-v3.c` does on
//! entry.
//!
//! Each vCPU owns one QEMU CPU, so the list registers, ICH_VMCR_EL2 and the
//! active priorities stay in that CPU between exits; the stub reports the
//! list registers at each exit and loads the host's answer.

use std::sync::Mutex;

/// Shared peripheral interrupts the distributor implements (INTIDs 32..).
pub const NR_SPIS: u32 = 64;
/// All INTIDs the distributor knows (SGIs, PPIs, SPIs).
pub const NR_IRQS: u32 = 32 + NR_SPIS;
pub use crate::linux::devices::timer::VTIMER_INTID;
/// Bytes of the distributor's frame.
pub const GICD_SIZE: u64 = 0x1_0000;
/// Bytes of one redistributor (RD and SGI frames).
pub const GICR_STRIDE: u64 = 0x2_0000;
/// List registers the stub saves and loads (QEMU implements 4).
pub const NR_LRS: usize = 4;

const LR_STATE_PENDING: u64 = 1 << 62;
/// ICH_LR<n>_EL2.State: zero for a list register that holds nothing.
pub(in crate::linux) const LR_STATE_MASK: u64 = 3 << 62;
/// ICH_LR<n>_EL2.HW: the virtual interrupt is tied to a physical one.
pub(in crate::linux) const LR_HW: u64 = 1 << 61;
const LR_GROUP1: u64 = 1 << 60;
/// ICH_HCR_EL2.En: the virtual CPU interface on.
pub const ICH_HCR_EN: u64 = 1;
/// ICH_HCR_EL2.UIE: a maintenance interrupt when at most one list
/// register is in use (so what waits for a free one gets in).
pub const ICH_HCR_UIE: u64 = 1 << 1;

/// The registers of one redistributor (the vCPU's SGIs and PPIs).
#[derive(Clone, Debug)]
pub(crate) struct Redist {
    /// GICR_WAKER.ProcessorSleep.
    pub(crate) sleep: bool,
    pub(crate) enabled: u32,
    pub(crate) group: u32,
    pub(crate) prio: [u8; 32],
    pub(crate) cfg: [u32; 2],
}

impl Default for Redist {
    fn default() -> Self {
        Redist {
            sleep: true,
            enabled: 0,
            group: 0,
            prio: [0; 32],
            // SGIs are edge-triggered, PPIs level (GICR_ICFGR reset).
            cfg: [0xaaaa_aaaa, 0],
        }
    }
}

/// The distributor's registers for the SPIs.
#[derive(Clone, Debug)]
pub(crate) struct Dist {
    pub(crate) ctlr: u32,
    pub(crate) enabled: u128,
    pub(crate) group: u128,
    pub(crate) prio: [u8; NR_IRQS as usize],
    pub(crate) cfg: [u32; (NR_IRQS / 16) as usize],
    pub(crate) route: [u64; NR_IRQS as usize],
}

/// The emulated GICv3 of one VM.
pub struct Gic {
    pub(crate) vcpus: usize,
    pub(crate) dist: Mutex<Dist>,
    pub(crate) redist: Vec<Mutex<Redist>>,
    /// INTIDs pending for each vCPU and not yet in a list register.
    ///
    /// Lock order: a vCPU's pending set before `dist` or a redistributor
    /// ([`Gic::sync_lrs`] holds it while it reads enables and priorities);
    /// nothing takes a pending set while it holds `dist` or a
    /// redistributor.
    pub(crate) pending: Vec<Mutex<u128>>,
}

/// A distributor or redistributor access.
#[derive(Clone, Copy, Debug)]
pub struct GicAccess {
    /// Byte offset into the frame.
    pub offset: u64,
    /// Bytes (1, 2, 4 or 8).
    pub size: u64,
    /// `Some(value)` for a write.
    pub write: Option<u64>,
}

fn bit_reg_read(bits: u128, first: u32) -> u64 {
    if first >= 128 {
        return 0;
    }
    ((bits >> first) & 0xffff_ffff) as u64
}

impl Gic {
    /// A GIC for `vcpus` vCPUs (1..=8; with 0, nothing can be raised).
    pub fn new(vcpus: usize) -> Gic {
        Gic {
            vcpus,
            dist: Mutex::new(Dist {
                ctlr: 0,
                enabled: 0,
                group: 0,
                prio: [0; NR_IRQS as usize],
                cfg: [0; (NR_IRQS / 16) as usize],
                route: [0; NR_IRQS as usize],
            }),
            redist: (0..vcpus).map(|_| Mutex::new(Redist::default())).collect(),
            pending: (0..vcpus).map(|_| Mutex::new(0)).collect(),
        }
    }

    /// vCPUs.
    pub fn vcpus(&self) -> usize {
        self.vcpus
    }

    /// Makes `intid` pending for `vcpu` (SGIs and PPIs), or for the vCPU
    /// its route names (SPIs); returns that vCPU, which the caller kicks
    /// if it runs on another thread. `None` for an INTID beyond the
    /// distributor's, or a GIC of no vCPUs.
    pub fn raise(&self, vcpu: usize, intid: u32) -> Option<usize> {
        if intid >= NR_IRQS {
            return None;
        }
        let target = if intid < 32 {
            vcpu
        } else {
            let route = self.dist.lock().unwrap().route[intid as usize];
            // Interrupt_Routing_Mode (bit 31) = any: vCPU 0.
            if route & (1 << 31) != 0 {
                0
            } else {
                (route & 0xff) as usize
            }
        };
        // A route to a vCPU that does not exist goes to the last one.
        let target = target.min(self.vcpus.checked_sub(1)?);
        *self.pending[target].lock().unwrap() |= 1u128 << intid;
        Some(target)
    }

    fn enabled(&self, vcpu: usize, intid: u32) -> bool {
        if intid < 32 {
            self.redist[vcpu].lock().unwrap().enabled & (1 << intid) != 0
        } else {
            let d = self.dist.lock().unwrap();
            // EnableGrp1 (bit 1 with DS = 1) and the SPI's own enable.
            d.ctlr & 2 != 0 && d.enabled & (1u128 << intid) != 0
        }
    }

    fn prio(&self, vcpu: usize, intid: u32) -> u8 {
        if intid < 32 {
            self.redist[vcpu].lock().unwrap().prio[intid as usize]
        } else {
            self.dist.lock().unwrap().prio[intid as usize]
        }
    }

    /// Merges what is pending for `vcpu` into its list registers `lrs` (as
    /// the stub reported them); returns the ICH_HCR_EL2 to load: En, plus
    /// UIE while something waits for a free register.
    pub fn sync_lrs(&self, vcpu: usize, lrs: &mut [u64; NR_LRS]) -> u64 {
        let mut q = self.pending[vcpu].lock().unwrap();
        let mut waiting = false;
        let mut bits = *q;
        while bits != 0 {
            let intid = bits.trailing_zeros();
            bits &= bits - 1;
            if !self.enabled(vcpu, intid) {
                continue;
            }
            let same = lrs
                .iter()
                .position(|&lr| lr & 0xffff_ffff == u64::from(intid) && lr & LR_STATE_MASK != 0);
            let slot = same.or_else(|| lrs.iter().position(|&lr| lr & LR_STATE_MASK == 0));
            match (same, slot) {
                (Some(i), _) => lrs[i] |= LR_STATE_PENDING,
                (None, Some(i)) => {
                    let prio = u64::from(self.prio(vcpu, intid));
                    lrs[i] = LR_STATE_PENDING | LR_GROUP1 | prio << 48 | u64::from(intid);
                }
                (None, None) => {
                    waiting = true;
                    continue;
                }
            }
            *q &= !(1u128 << intid);
        }
        if waiting {
            ICH_HCR_EN | ICH_HCR_UIE
        } else {
            ICH_HCR_EN
        }
    }

    /// Whether anything is pending for `vcpu` and enabled.
    pub fn has_pending(&self, vcpu: usize) -> bool {
        let q = *self.pending[vcpu].lock().unwrap();
        (0..NR_IRQS).any(|i| q & (1u128 << i) != 0 && self.enabled(vcpu, i))
    }

    /// A distributor access; returns a read's value. Unimplemented
    /// registers read as zero and ignore writes (as reserved ones do).
    pub fn dist_access(&self, a: GicAccess) -> u64 {
        let mut d = self.dist.lock().unwrap();
        let off = a.offset;
        let w = a.write.unwrap_or(0);
        let first = |base: u64| ((off - base) * 8) as u32;
        match (off, a.write) {
            (0x0000, None) => u64::from(d.ctlr) | 1 << 6 | 1 << 4, // DS, ARE
            (0x0000, Some(_)) => {
                d.ctlr = w as u32 & 0x3;
                0
            }
            // TYPER: ITLinesNumber, IDbits = 9 (10 bits), no LPIs.
            (0x0004, None) => u64::from(NR_IRQS / 32 - 1) | 9 << 19,
            (0x0008, None) => 0x0100_143b,
            (0xffe8, None) => 0x3b,
            (0x0080..=0x00ff, None) => bit_reg_read(d.group, first(0x80)),
            (0x0080..=0x00ff, Some(_)) => set_bits(&mut d.group, first(0x80), w, Bits::Assign),
            (0x0100..=0x017f, None) => bit_reg_read(d.enabled, first(0x100)),
            (0x0180..=0x01ff, None) => bit_reg_read(d.enabled, first(0x180)),
            (0x0100..=0x017f, Some(_)) => set_bits(&mut d.enabled, first(0x100), w, Bits::Set),
            (0x0180..=0x01ff, Some(_)) => set_bits(&mut d.enabled, first(0x180), w, Bits::Clear),
            (0x0200..=0x027f, Some(_)) => {
                drop(d);
                self.pend_spis(first(0x200), w);
                0
            }
            (0x0400..=0x07ff, _) => {
                bytes_access(&mut d.prio, (off - 0x400) as usize, a.size, a.write)
            }
            (0x0c00..=0x0cff, _) => word_access(&mut d.cfg, (off - 0xc00) / 4, a.write),
            (0x6100..=0x7fd8, _) => route_access(&mut d.route, off, a),
            _ => 0,
        }
    }

    fn pend_spis(&self, first: u32, w: u64) {
        for i in 0..32 {
            if w & (1 << i) != 0 && first + i >= 32 {
                self.raise(0, first + i);
            }
        }
    }

    /// A redistributor access (`offset` from the first redistributor's
    /// base); returns a read's value.
    pub fn redist_access(&self, a: GicAccess) -> u64 {
        let vcpu = (a.offset / GICR_STRIDE) as usize;
        if vcpu >= self.vcpus {
            return 0;
        }
        let off = a.offset % GICR_STRIDE;
        let w = a.write.unwrap_or(0);
        // The pending set is locked on its own: sync_lrs holds it while it
        // takes this redistributor's lock, so holding that lock here while
        // taking the pending set's (another vCPU's thread can write this
        // frame) would deadlock the two threads.
        match (off, a.write) {
            (0x1_0200, Some(_)) => {
                *self.pending[vcpu].lock().unwrap() |= u128::from(w as u32);
                return 0;
            }
            (0x1_0280, Some(_)) => {
                *self.pending[vcpu].lock().unwrap() &= !u128::from(w as u32);
                return 0;
            }
            _ => {}
        }
        let mut r = self.redist[vcpu].lock().unwrap();
        match (off, a.write) {
            (0x0008, None) => {
                // TYPER: affinity = vCPU index in Aff0, processor number,
                // Last on the final one.
                let last = u64::from(vcpu + 1 == self.vcpus) << 4;
                return (vcpu as u64) << 32 | (vcpu as u64) << 8 | last;
            }
            (0x000c, None) => return vcpu as u64,
            (0x0014, None) => return if r.sleep { 6 } else { 0 },
            (0x0014, Some(_)) => r.sleep = w & 2 != 0,
            (0xffe8, None) => return 0x3b,
            (0x1_0080, None) => return u64::from(r.group),
            (0x1_0080, Some(_)) => r.group = w as u32,
            (0x1_0100, None) | (0x1_0180, None) => return u64::from(r.enabled),
            (0x1_0100, Some(_)) => r.enabled |= w as u32,
            (0x1_0180, Some(_)) => r.enabled &= !(w as u32),
            (0x1_0400..=0x1_041f, _) => {
                return bytes_access(&mut r.prio, (off - 0x1_0400) as usize, a.size, a.write)
            }
            (0x1_0c00..=0x1_0c07, _) => {
                return word_access(&mut r.cfg, (off - 0x1_0c00) / 4, a.write)
            }
            _ => {}
        }
        0
    }

    /// The vCPUs an ICC_SGI1R_EL1 value targets, and its INTID.
    ///
    /// vCPU n has MPIDR Aff0 = n and Aff1 = Aff2 = Aff3 = 0, so a target
    /// list names vCPU `RS * 16 + bit` (RS, the range selector, is bits
    /// 47:44) and only when the value's Aff1, Aff2 and Aff3 are all 0; a
    /// list for another cluster targets nothing, as on hardware with no
    /// CPU there.
    pub fn sgi_targets(&self, from: usize, v: u64) -> (u32, Vec<usize>) {
        let intid = ((v >> 24) & 0xf) as u32;
        let targets = if v & (1 << 40) != 0 {
            // IRM: every vCPU but the sender.
            (0..self.vcpus).filter(|&c| c != from).collect()
        } else if v & SGI1R_HIGH_AFF != 0 {
            Vec::new()
        } else {
            let range = ((v >> 44) & 0xf) as usize * 16;
            let list = v & 0xffff;
            (0..16)
                .filter(|b| list & (1 << b) != 0)
                .map(|b| range + b)
                .filter(|&c| c < self.vcpus)
                .collect()
        };
        (intid, targets)
    }
}

/// ICC_SGI1R_EL1's Aff1 (23:16), Aff2 (39:32) and Aff3 (55:48) fields.
const SGI1R_HIGH_AFF: u64 = 0xff << 16 | 0xff << 32 | 0xff << 48;

/// How a write changes a bit register.
#[derive(Clone, Copy)]
enum Bits {
    Assign,
    Set,
    Clear,
}

fn set_bits(bits: &mut u128, first: u32, w: u64, how: Bits) -> u64 {
    if first >= 128 {
        return 0;
    }
    let m = u128::from(w as u32) << first;
    match how {
        Bits::Assign => *bits = *bits & !(0xffff_ffffu128 << first) | m,
        Bits::Set => *bits |= m,
        Bits::Clear => *bits &= !m,
    }
    0
}

/// GICD_IROUTER<n>: 64-bit, or either 32-bit half.
fn route_access(route: &mut [u64], off: u64, a: GicAccess) -> u64 {
    let n = ((off - 0x6000) / 8) as usize;
    let Some(r) = route.get_mut(n) else {
        return 0;
    };
    match a.write {
        None => *r >> ((off % 8) * 8),
        Some(v) => {
            *r = match (a.size, off % 8) {
                (8, _) => v,
                (_, 0) => *r & !0xffff_ffff | v & 0xffff_ffff,
                _ => *r & 0xffff_ffff | v << 32,
            };
            0
        }
    }
}

fn bytes_access(arr: &mut [u8], at: usize, size: u64, write: Option<u64>) -> u64 {
    let mut v = 0u64;
    for i in 0..size as usize {
        let Some(b) = arr.get_mut(at + i) else { break };
        match write {
            Some(w) => *b = (w >> (8 * i)) as u8,
            None => v |= u64::from(*b) << (8 * i),
        }
    }
    v
}

fn word_access(arr: &mut [u32], idx: u64, write: Option<u64>) -> u64 {
    let Some(x) = arr.get_mut(idx as usize) else {
        return 0;
    };
    match write {
        Some(w) => {
            *x = w as u32;
            0
        }
        None => u64::from(*x),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wr(g: &Gic, offset: u64, v: u64) {
        g.dist_access(GicAccess {
            offset,
            size: 4,
            write: Some(v),
        });
    }

    #[test]
    fn an_enabled_spi_lands_in_a_free_list_register_once() {
        let g = Gic::new(2);
        wr(&g, 0, 2);
        wr(&g, 0x400 + 33, 0xa0);
        g.dist_access(GicAccess {
            offset: 0x6000 + 8 * 33,
            size: 8,
            write: Some(1),
        });
        assert_eq!(g.raise(0, 33), Some(1));
        let mut lrs = [0; NR_LRS];
        // Disabled: stays pending, no list register.
        assert_eq!(g.sync_lrs(1, &mut lrs), ICH_HCR_EN);
        assert_eq!(lrs, [0; NR_LRS]);
        wr(&g, 0x104, 1 << 1);
        g.sync_lrs(1, &mut lrs);
        assert_eq!(lrs[0] & 0xffff_ffff, 33);
        assert_eq!(lrs[0] >> 62, 1);
        g.raise(0, 33);
        g.sync_lrs(1, &mut lrs);
        assert_eq!(lrs[1], 0, "merged into the same register");
    }

    #[test]
    fn full_list_registers_ask_for_the_underflow_interrupt() {
        let g = Gic::new(1);
        g.redist_access(GicAccess {
            offset: 0x1_0100,
            size: 4,
            write: Some(0xffff),
        });
        let mut lrs = [LR_STATE_PENDING | 100; NR_LRS];
        g.raise(0, 3);
        assert_eq!(g.sync_lrs(0, &mut lrs), ICH_HCR_EN | ICH_HCR_UIE);
        lrs[2] = 0;
        assert_eq!(g.sync_lrs(0, &mut lrs), ICH_HCR_EN);
        assert_eq!(lrs[2] & 0xffff_ffff, 3);
    }

    /// A vCPU writing another vCPU's GICR_ISPENDR0 while that vCPU's
    /// thread merges its pending interrupts into its list registers: the
    /// two paths took the redistributor's and the pending set's locks in
    /// opposite orders, and a guest could deadlock both host threads.
    #[test]
    fn pending_writes_to_another_redistributor_do_not_deadlock_its_vcpu() {
        let g = std::sync::Arc::new(Gic::new(2));
        let ispendr0 = GICR_STRIDE + 0x1_0200;
        let (tx, rx) = std::sync::mpsc::channel();
        let writer = {
            let (g, tx) = (g.clone(), tx.clone());
            std::thread::spawn(move || {
                for i in 0..200_000u64 {
                    g.redist_access(GicAccess {
                        offset: ispendr0 + (i & 1) * 0x80,
                        size: 4,
                        write: Some(0xffff_ffff),
                    });
                }
                let _ = tx.send(());
            })
        };
        let merger = std::thread::spawn(move || {
            for _ in 0..200_000 {
                g.sync_lrs(1, &mut [0; NR_LRS]);
            }
            let _ = tx.send(());
        });
        for _ in 0..2 {
            rx.recv_timeout(std::time::Duration::from_secs(30))
                .expect("the vCPU threads deadlocked on the GIC's locks");
        }
        writer.join().unwrap();
        merger.join().unwrap();
    }

    #[test]
    fn raising_in_a_gic_of_no_vcpus_is_refused_not_a_panic() {
        let g = Gic::new(0);
        assert_eq!(g.raise(0, 40), None);
        assert_eq!(g.raise(3, 5), None);
        assert_eq!(Gic::new(2).raise(0, NR_IRQS), None);
    }

    #[test]
    fn sgi1r_targets_the_listed_vcpus() {
        let g = Gic::new(4);
        assert_eq!(g.sgi_targets(0, 5 << 24 | 0b1010), (5, vec![1, 3]));
        assert_eq!(g.sgi_targets(2, 1 << 40 | 1 << 24), (1, vec![0, 1, 3]));
    }

    #[test]
    fn sgi1r_outside_cluster_0_range_0_targets_no_vcpu() {
        let g = Gic::new(4);
        // Aff1 = 1 names CPUs 1.x, of which there are none: not vCPUs 16+.
        assert_eq!(g.sgi_targets(0, 1 << 16 | 3 << 24 | 0b1), (3, vec![]));
        assert_eq!(g.sgi_targets(0, 1 << 32 | 0b1), (0, vec![]));
        assert_eq!(g.sgi_targets(0, 1 << 48 | 0b1), (0, vec![]));
        // Range selector 1 names Aff0 16..31: none exist here.
        assert_eq!(g.sgi_targets(0, 1 << 44 | 0b1111), (0, vec![]));
        let big = Gic::new(20);
        assert_eq!(big.sgi_targets(0, 1 << 44 | 0b1001), (0, vec![16, 19]));
    }
}
