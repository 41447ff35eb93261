//! The GICv3's state as plain values: what [`Gic::state`] reads out of a
//! running GIC and [`Gic::from_state`] builds a GIC from, for a pause, a
//! reboot or a move to another host. The encoding of these values is the
//! caller's.

use crate::linux::gic::{Dist, Gic, Redist, NR_IRQS};
use std::fmt;

/// The distributor's registers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DistState {
    /// GICD_CTLR's EnableGrp0/1 (bits 1:0).
    pub ctlr: u32,
    /// GICD_ISENABLER, one bit per INTID.
    pub enabled: u128,
    /// GICD_IGROUPR, one bit per INTID.
    pub group: u128,
    /// GICD_IPRIORITYR, one byte per INTID.
    pub prio: [u8; NR_IRQS as usize],
    /// GICD_ICFGR, two bits per INTID.
    pub cfg: [u32; (NR_IRQS / 16) as usize],
    /// GICD_IROUTER, one per INTID.
    pub route: [u64; NR_IRQS as usize],
}

/// One vCPU's redistributor and what is pending for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedistState {
    /// GICR_WAKER.ProcessorSleep.
    pub sleep: bool,
    /// GICR_ISENABLER0.
    pub enabled: u32,
    /// GICR_IGROUPR0.
    pub group: u32,
    /// GICR_IPRIORITYR for the SGIs and PPIs.
    pub prio: [u8; 32],
    /// GICR_ICFGR0 and 1.
    pub cfg: [u32; 2],
    /// The INTIDs pending for the vCPU and not yet in a list register.
    pub pending: u128,
}

/// A GIC's state: its distributor, then one redistributor per vCPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GicState {
    /// The distributor.
    pub dist: DistState,
    /// Each vCPU's redistributor, vCPU 0 first.
    pub redists: Vec<RedistState>,
}

/// A state no GIC can hold (the text names the value).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GicStateError(pub String);

impl fmt::Display for GicStateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for GicStateError {}

impl Gic {
    /// The GIC's registers and pending sets as they are now.
    pub fn state(&self) -> GicState {
        let d = self.dist.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let redists = self
            .redist
            .iter()
            .zip(&self.pending)
            .map(|(r, p)| {
                // The pending set first, as the GIC's lock order says.
                let pending = *p.lock().unwrap_or_else(|p| p.into_inner());
                let r = r.lock().unwrap_or_else(|p| p.into_inner()).clone();
                RedistState {
                    sleep: r.sleep,
                    enabled: r.enabled,
                    group: r.group,
                    prio: r.prio,
                    cfg: r.cfg,
                    pending,
                }
            })
            .collect();
        GicState {
            dist: DistState {
                ctlr: d.ctlr,
                enabled: d.enabled,
                group: d.group,
                prio: d.prio,
                cfg: d.cfg,
                route: d.route,
            },
            redists,
        }
    }

    /// A GIC of `s.redists.len()` vCPUs holding `s`.
    ///
    /// # Errors
    /// GICD_CTLR bits beyond EnableGrp0/1 (a guest cannot set them), or
    /// an INTID beyond the distributor's pending for a vCPU.
    pub fn from_state(s: &GicState) -> Result<Gic, GicStateError> {
        let d = &s.dist;
        if d.ctlr & !3 != 0 {
            return Err(GicStateError(format!(
                "GICD_CTLR {:#x} has bits beyond EnableGrp0/1",
                d.ctlr
            )));
        }
        for (v, r) in s.redists.iter().enumerate() {
            if NR_IRQS < 128 && r.pending >> NR_IRQS != 0 {
                return Err(GicStateError(format!(
                    "vCPU {v} has INTIDs >= {NR_IRQS} pending ({:#x})",
                    r.pending
                )));
            }
        }
        let g = Gic::new(s.redists.len());
        *g.dist.lock().unwrap_or_else(|p| p.into_inner()) = Dist {
            ctlr: d.ctlr,
            enabled: d.enabled,
            group: d.group,
            prio: d.prio,
            cfg: d.cfg,
            route: d.route,
        };
        for ((r, p), st) in g.redist.iter().zip(&g.pending).zip(&s.redists) {
            *r.lock().unwrap_or_else(|p| p.into_inner()) = Redist {
                sleep: st.sleep,
                enabled: st.enabled,
                group: st.group,
                prio: st.prio,
                cfg: st.cfg,
            };
            *p.lock().unwrap_or_else(|p| p.into_inner()) = st.pending;
        }
        Ok(g)
    }
}

#[cfg(test)]
mod tests {
    use crate::linux::gic::{Gic, GicAccess, GICR_STRIDE, NR_LRS};

    fn wr(g: &Gic, dist: bool, offset: u64, v: u64) {
        let a = GicAccess {
            offset,
            size: 4,
            write: Some(v),
        };
        if dist {
            g.dist_access(a);
        } else {
            g.redist_access(a);
        }
    }

    #[test]
    fn a_gic_built_from_its_state_delivers_what_was_pending_and_saves_the_same() {
        let g = Gic::new(2);
        wr(&g, true, 0, 2);
        wr(&g, true, 0x100 + 4, 1 << 1); // SPI 33 enabled
        wr(&g, true, 0x400 + 33, 0xa0);
        wr(&g, false, GICR_STRIDE + 0x1_0100, 1 << 3); // SGI 3 on vCPU 1
        wr(&g, false, GICR_STRIDE + 0x14, 0); // vCPU 1 awake
        g.raise(0, 33);
        g.raise(1, 3);
        let s = g.state();
        assert_eq!(s.redists.len(), 2);
        assert!(!s.redists[1].sleep);
        assert_eq!(s.redists[1].pending, 1 << 3);
        let h = Gic::from_state(&s).unwrap();
        assert_eq!(h.state(), s);
        // What was pending reaches vCPU 1's list registers on the copy.
        let mut lrs = [0; NR_LRS];
        h.sync_lrs(1, &mut lrs);
        let ids: Vec<u64> = lrs
            .iter()
            .filter(|&&l| l != 0)
            .map(|l| l & 0xffff_ffff)
            .collect();
        assert_eq!(ids, [3]);
    }

    #[test]
    fn states_no_gic_holds_are_refused() {
        let mut s = Gic::new(1).state();
        s.dist.ctlr = 1 << 4;
        assert!(Gic::from_state(&s).err().unwrap().0.contains("GICD_CTLR"));
        let mut s = Gic::new(1).state();
        s.redists[0].pending = 1 << 100;
        assert!(Gic::from_state(&s).err().unwrap().0.contains("vCPU 0"));
    }
}
