//! The GICv3's own state: its distributor's and redistributors' registers
//! and each vCPU's pending set, saved and loaded as one section's bytes.

use crate::linux::devices::DeviceState;
use crate::linux::gic::{Gic, NR_IRQS};
use s2mmu_migrate::state::{Fields, StateError};

impl DeviceState for Gic {
    type Shape = usize;

    /// Appends the distributor's registers, then each redistributor's with
    /// its vCPU's pending set.
    fn save(&self, out: &mut Vec<u8>) {
        let g = self;
        let d = g.dist.lock().unwrap_or_else(|p| p.into_inner());
        out.extend_from_slice(&d.ctlr.to_le_bytes());
        out.extend_from_slice(&d.enabled.to_le_bytes());
        out.extend_from_slice(&d.group.to_le_bytes());
        out.extend_from_slice(&d.prio);
        d.cfg
            .iter()
            .for_each(|c| out.extend_from_slice(&c.to_le_bytes()));
        d.route
            .iter()
            .for_each(|r| out.extend_from_slice(&r.to_le_bytes()));
        drop(d);
        for (r, p) in g.redist.iter().zip(&g.pending) {
            // The pending set first, as the GIC's lock order says.
            let p = *p.lock().unwrap_or_else(|p| p.into_inner());
            let r = r.lock().unwrap_or_else(|p| p.into_inner());
            out.push(u8::from(r.sleep));
            out.extend_from_slice(&r.enabled.to_le_bytes());
            out.extend_from_slice(&r.group.to_le_bytes());
            out.extend_from_slice(&r.prio);
            r.cfg
                .iter()
                .for_each(|c| out.extend_from_slice(&c.to_le_bytes()));
            out.extend_from_slice(&p.to_le_bytes());
        }
    }

    /// A GIC for `vcpus` vCPUs with the registers [`DeviceState::save`]
    /// wrote; truncated or left-over bytes, or a pending INTID beyond the
    /// GIC's, are refused.
    fn load(bytes: &[u8], vcpus: usize, tag: u32) -> Result<Gic, StateError> {
        let mut f = Fields::new(bytes, "GIC");
        let g = Gic::new(vcpus);
        {
            let mut d = g.dist.lock().unwrap_or_else(|p| p.into_inner());
            d.ctlr = f.u32("GICD_CTLR")?;
            // A guest sets EnableGrp0/1 only (dist_access keeps bits 1:0).
            if d.ctlr & !3 != 0 {
                return Err(StateError::BadSection {
                    tag,
                    what: format!("GICD_CTLR {:#x} has bits beyond EnableGrp0/1", d.ctlr),
                });
            }
            d.enabled = u128f(&mut f, "GICD_ISENABLER")?;
            d.group = u128f(&mut f, "GICD_IGROUPR")?;
            d.prio
                .copy_from_slice(f.bytes(NR_IRQS as usize, "GICD_IPRIORITYR")?);
            for c in d.cfg.iter_mut() {
                *c = f.u32("GICD_ICFGR")?;
            }
            for r in d.route.iter_mut() {
                *r = f.u64("GICD_IROUTER")?;
            }
        }
        for (v, (r, p)) in g.redist.iter().zip(&g.pending).enumerate() {
            let mut r = r.lock().unwrap_or_else(|p| p.into_inner());
            r.sleep = f.array::<1>("GICR_WAKER")?[0] != 0;
            r.enabled = f.u32("GICR_ISENABLER0")?;
            r.group = f.u32("GICR_IGROUPR0")?;
            r.prio.copy_from_slice(f.bytes(32, "GICR_IPRIORITYR")?);
            for c in r.cfg.iter_mut() {
                *c = f.u32("GICR_ICFGR")?;
            }
            let pend = u128f(&mut f, "pending INTIDs")?;
            if NR_IRQS < 128 && pend >> NR_IRQS != 0 {
                return Err(StateError::BadSection {
                    tag,
                    what: format!("vCPU {v} has INTIDs >= {NR_IRQS} pending ({pend:#x})"),
                });
            }
            *p.lock().unwrap_or_else(|p| p.into_inner()) = pend;
        }
        f.finish(tag)?;
        Ok(g)
    }
}

fn u128f(f: &mut Fields<'_>, what: &str) -> Result<u128, StateError> {
    Ok(u128::from_le_bytes(f.array(what)?))
}
