//! The GICv3's state ([`GicState`]): its distributor's and
//! redistributors' registers and each vCPU's pending set, saved and
//! loaded as one section's bytes.

use super::device::DeviceState;
use s2mmu_arm64::linux::gic::NR_IRQS;
use s2mmu_arm64::linux::gic_snapshot::{DistState, GicState, RedistState};
use s2mmu_migrate::state::{Fields, StateError};

impl DeviceState for GicState {
    /// Appends the distributor's registers, then each redistributor's with
    /// its vCPU's pending set.
    fn save(&self, out: &mut Vec<u8>) {
        let d = &self.dist;
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
        for r in &self.redists {
            out.push(u8::from(r.sleep));
            out.extend_from_slice(&r.enabled.to_le_bytes());
            out.extend_from_slice(&r.group.to_le_bytes());
            out.extend_from_slice(&r.prio);
            r.cfg
                .iter()
                .for_each(|c| out.extend_from_slice(&c.to_le_bytes()));
            out.extend_from_slice(&r.pending.to_le_bytes());
        }
    }

    /// The state of a GIC for `vcpus` vCPUs with the registers
    /// [`DeviceState::save`] wrote; truncated or left-over bytes are
    /// refused (values no guest can write are refused as the GIC is built
    /// from them: `Gic::from_state`).
    fn load(bytes: &[u8], vcpus: usize, tag: u32) -> Result<GicState, StateError> {
        let mut f = Fields::new(bytes, "GIC");
        let ctlr = f.u32("GICD_CTLR")?;
        let enabled = u128f(&mut f, "GICD_ISENABLER")?;
        let group = u128f(&mut f, "GICD_IGROUPR")?;
        let prio = f.array::<{ NR_IRQS as usize }>("GICD_IPRIORITYR")?;
        let mut cfg = [0u32; (NR_IRQS / 16) as usize];
        for c in cfg.iter_mut() {
            *c = f.u32("GICD_ICFGR")?;
        }
        let mut route = [0u64; NR_IRQS as usize];
        for r in route.iter_mut() {
            *r = f.u64("GICD_IROUTER")?;
        }
        let mut redist = Vec::with_capacity(vcpus.min(bytes.len()));
        for _ in 0..vcpus {
            let sleep = f.array::<1>("GICR_WAKER")?[0] != 0;
            let enabled = f.u32("GICR_ISENABLER0")?;
            let group = f.u32("GICR_IGROUPR0")?;
            let prio = f.array::<32>("GICR_IPRIORITYR")?;
            let mut cfg = [0u32; 2];
            for c in cfg.iter_mut() {
                *c = f.u32("GICR_ICFGR")?;
            }
            let pending = u128f(&mut f, "pending INTIDs")?;
            redist.push(RedistState {
                sleep,
                enabled,
                group,
                prio,
                cfg,
                pending,
            });
        }
        f.finish(tag)?;
        Ok(GicState {
            dist: DistState {
                ctlr,
                enabled,
                group,
                prio,
                cfg,
                route,
            },
            redists: redist,
        })
    }
}

fn u128f(f: &mut Fields<'_>, what: &str) -> Result<u128, StateError> {
    Ok(u128::from_le_bytes(f.array(what)?))
}
