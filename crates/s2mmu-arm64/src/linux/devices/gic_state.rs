//! The GICv3's own state as plain values ([`GicState`]): its
//! distributor's and redistributors' registers and each vCPU's pending
//! set, taken from a GIC and checked as a GIC is built from them again.

use crate::linux::gic::{Gic, NR_IRQS};

/// The distributor's registers for the SPIs, and each redistributor's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GicState {
    /// GICD_CTLR (EnableGrp0/1).
    pub ctlr: u32,
    /// GICD_ISENABLER, a bit per INTID.
    pub enabled: u128,
    /// GICD_IGROUPR, a bit per INTID.
    pub group: u128,
    /// GICD_IPRIORITYR, a byte per INTID.
    pub prio: [u8; NR_IRQS as usize],
    /// GICD_ICFGR, two bits per INTID.
    pub cfg: [u32; (NR_IRQS / 16) as usize],
    /// GICD_IROUTER, per INTID.
    pub route: [u64; NR_IRQS as usize],
    /// Per vCPU.
    pub redist: Vec<RedistState>,
}

/// One redistributor's registers (the vCPU's SGIs and PPIs) and the
/// INTIDs pending for its vCPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedistState {
    /// GICR_WAKER.ProcessorSleep.
    pub sleep: bool,
    /// GICR_ISENABLER0.
    pub enabled: u32,
    /// GICR_IGROUPR0.
    pub group: u32,
    /// GICR_IPRIORITYR.
    pub prio: [u8; 32],
    /// GICR_ICFGR0/1.
    pub cfg: [u32; 2],
    /// INTIDs pending and not yet in a list register, a bit each.
    pub pending: u128,
}

impl Gic {
    /// The GIC's registers and pending sets now.
    pub fn state(&self) -> GicState {
        let d = self.dist.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let redist = self
            .redist
            .iter()
            .zip(&self.pending)
            .map(|(r, p)| {
                // The pending set first, as the GIC's lock order says.
                let pending = *p.lock().unwrap_or_else(|p| p.into_inner());
                let r = r.lock().unwrap_or_else(|p| p.into_inner());
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
            ctlr: d.ctlr,
            enabled: d.enabled,
            group: d.group,
            prio: d.prio,
            cfg: d.cfg,
            route: d.route,
            redist,
        }
    }

    /// A GIC with the registers and pending sets of `s`, for as many
    /// vCPUs as it has redistributors.
    ///
    /// # Errors
    /// What no guest can write, named: GICD_CTLR bits beyond
    /// EnableGrp0/1, or a pending INTID beyond the GIC's.
    pub fn from_state(s: &GicState) -> Result<Gic, String> {
        // A guest sets EnableGrp0/1 only (dist_access keeps bits 1:0).
        if s.ctlr & !3 != 0 {
            return Err(format!(
                "GICD_CTLR {:#x} has bits beyond EnableGrp0/1",
                s.ctlr
            ));
        }
        for (v, r) in s.redist.iter().enumerate() {
            if NR_IRQS < 128 && r.pending >> NR_IRQS != 0 {
                return Err(format!(
                    "vCPU {v} has INTIDs >= {NR_IRQS} pending ({:#x})",
                    r.pending
                ));
            }
        }
        let g = Gic::new(s.redist.len());
        {
            let mut d = g.dist.lock().unwrap_or_else(|p| p.into_inner());
            d.ctlr = s.ctlr;
            d.enabled = s.enabled;
            d.group = s.group;
            d.prio = s.prio;
            d.cfg = s.cfg;
            d.route = s.route;
        }
        for ((r, p), st) in g.redist.iter().zip(&g.pending).zip(&s.redist) {
            let mut r = r.lock().unwrap_or_else(|p| p.into_inner());
            r.sleep = st.sleep;
            r.enabled = st.enabled;
            r.group = st.group;
            r.prio = st.prio;
            r.cfg = st.cfg;
            *p.lock().unwrap_or_else(|p| p.into_inner()) = st.pending;
        }
        Ok(g)
    }
}
