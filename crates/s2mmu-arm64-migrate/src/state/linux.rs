//! The Linux VM's state ([`LinuxState`]) in the migration encoding: the
//! emulated GICv3 (distributor, redistributors, pending interrupts), the
//! 16550's registers and FIFO (vm-superio's `SerialState`), each vCPU's
//! PSCI power state and saved registers, and the guest's virtual time,
//! a section each.

use super::device::DeviceState;
use super::vcpu::{self, VCPU_STATE_LEN};
use s2mmu_arm64::linux::gic::Gic;
use s2mmu_arm64::linux::gic_snapshot::GicState;
use s2mmu_arm64::linux::psci::PowerState;
use s2mmu_arm64::linux::vm_state::{LinuxState, VcpuPart};
use s2mmu_migrate::state::{Fields, State, StateError};
use vm_superio::serial::SerialState;

/// The VM kind of a Linux guest on the arm64 model ("LXA6").
pub const LINUX_KIND: u32 = 0x4c58_4136;
/// vCPUs and RAM size.
pub const TAG_CONFIG: u32 = 1;
/// The guest's virtual count at the pause.
pub const TAG_TIMER: u32 = 2;
/// The interrupt controller.
pub const TAG_GIC: u32 = 3;
/// The UART.
pub const TAG_UART: u32 = 4;
/// vCPU n's power state and registers: `TAG_VCPU + n`.
pub const TAG_VCPU: u32 = 0x100;

/// Appends the GIC's registers.
pub fn gic_save(g: &Gic, out: &mut Vec<u8>) {
    g.state().save(out);
}

/// A GIC for `vcpus` vCPUs with the registers [`gic_save`] wrote.
///
/// # Errors
/// Truncated or left-over bytes, a value no guest can write (a pending
/// INTID beyond the GIC's, ...): [`StateError::BadSection`] of [`TAG_GIC`].
pub fn gic_load(bytes: &[u8], vcpus: usize) -> Result<Gic, StateError> {
    let st = GicState::load(bytes, vcpus, TAG_GIC)?;
    Gic::from_state(&st).map_err(|e| StateError::BadSection {
        tag: TAG_GIC,
        what: e.0,
    })
}

fn vcpu_save(c: &VcpuPart, out: &mut Vec<u8>) {
    out.extend_from_slice(&(c.power.code() as u32).to_le_bytes());
    let (flag, e, x) = c.start.map_or((0u64, 0, 0), |(e, x)| (1, e, x));
    [flag, e, x]
        .iter()
        .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
    out.push(u8::from(c.regs.is_some()));
    if let Some(r) = &c.regs {
        vcpu::encode(r, out);
    }
}

fn vcpu_load(bytes: &[u8], tag: u32) -> Result<VcpuPart, StateError> {
    let mut f = Fields::new(bytes, "vCPU");
    let bad = |what: String| StateError::BadSection { tag, what };
    let power = match f.u32("the power state")? {
        0 => PowerState::On,
        1 => PowerState::Off,
        2 => PowerState::OnPending,
        p => return Err(bad(format!("power state {p} (0 on, 1 off, 2 pending)"))),
    };
    let (flag, e, x) = (f.u64("start")?, f.u64("entry")?, f.u64("x0")?);
    let start = (flag != 0).then_some((e, x));
    let regs = match f.array::<1>("the registers' flag")?[0] {
        0 => None,
        _ => Some(vcpu::decode(&mut f, tag)?),
    };
    f.finish(tag)?;
    let part = VcpuPart { power, start, regs };
    part.check().map_err(bad)?;
    Ok(part)
}

/// The encoded state of `state`.
///
/// # Errors
/// A section over the encoding's bounds.
pub fn encode(state: &LinuxState) -> Result<Vec<u8>, StateError> {
    let mut st = State::new(LINUX_KIND);
    let mut c = (state.vcpus as u32).to_le_bytes().to_vec();
    c.extend_from_slice(&state.mem.to_le_bytes());
    st.push(TAG_CONFIG, c)?;
    st.push(TAG_TIMER, state.vct.to_le_bytes().to_vec())?;
    let mut g = Vec::new();
    gic_save(&state.gic, &mut g);
    st.push(TAG_GIC, g)?;
    let mut u = Vec::new();
    state.uart.save(&mut u);
    st.push(TAG_UART, u)?;
    for (i, cpu) in state.cpus.iter().enumerate() {
        let mut b = Vec::with_capacity(40 + VCPU_STATE_LEN);
        vcpu_save(cpu, &mut b);
        st.push(TAG_VCPU + i as u32, b)?;
    }
    Ok(st.encode())
}

/// Decodes a state for a VM of `vcpus` vCPUs and `mem` bytes.
///
/// # Errors
/// The encoding's refusals; [`StateError::BadSection`] for another
/// VM size or inconsistent contents.
pub fn decode(bytes: &[u8], vcpus: usize, mem: u64) -> Result<LinuxState, StateError> {
    let st = State::decode(bytes, LINUX_KIND)?;
    let mut f = Fields::new(st.section(TAG_CONFIG)?, "config");
    let (v, m) = (f.u32("vCPUs")? as usize, f.u64("RAM bytes")?);
    f.finish(TAG_CONFIG)?;
    if v != vcpus || m != mem {
        return Err(StateError::BadSection {
            tag: TAG_CONFIG,
            what: format!("a VM of {v} vCPUs and {m} bytes, the destination has {vcpus} and {mem}"),
        });
    }
    let mut f = Fields::new(st.section(TAG_TIMER)?, "timer");
    let vct = f.u64("the virtual count")?;
    f.finish(TAG_TIMER)?;
    let cpus = (0..vcpus)
        .map(|i| vcpu_load(st.section(TAG_VCPU + i as u32)?, TAG_VCPU + i as u32))
        .collect::<Result<Vec<_>, _>>()?;
    if !cpus.iter().any(|c| c.regs.is_some()) {
        return Err(StateError::BadSection {
            tag: TAG_VCPU,
            what: "no vCPU was running".into(),
        });
    }
    if st.tags().len() != 4 + vcpus {
        return Err(StateError::BadSection {
            tag: 0,
            what: format!(
                "{} sections, a {vcpus}-vCPU VM has {}",
                st.tags().len(),
                4 + vcpus
            ),
        });
    }
    Ok(LinuxState {
        vcpus,
        mem,
        vct,
        gic: gic_load(st.section(TAG_GIC)?, vcpus)?,
        uart: SerialState::load(st.section(TAG_UART)?, vcpus, TAG_UART)?,
        cpus,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use s2mmu_arm64::linux::gic::GicAccess;

    #[test]
    fn a_gic_round_trips_and_values_no_guest_can_write_are_refused() {
        let g = Gic::new(2);
        let w = |offset, v| {
            g.dist_access(GicAccess {
                offset,
                size: 4,
                write: Some(v),
            })
        };
        w(0, 0xffff_ffff);
        w(0x104, 1 << 1);
        g.raise(1, 5);
        let mut b = Vec::new();
        gic_save(&g, &mut b);
        let h = gic_load(&b, 2).unwrap();
        let mut b2 = Vec::new();
        gic_save(&h, &mut b2);
        assert_eq!(b, b2);
        assert_eq!(h.state().dist.ctlr, 3, "the guest's write kept 1:0");
        let mut bad = b.clone();
        bad[0] |= 1 << 4; // GICD_CTLR.ARE is fixed, not stored
        let e = gic_load(&bad, 2).err().expect("refused");
        assert!(
            matches!(e, StateError::BadSection { tag: TAG_GIC, .. }),
            "{e}"
        );
        // vCPU 1's pending set is the section's last 16 bytes.
        let mut bad = b.clone();
        let n = bad.len();
        bad[n - 4] = 0x80; // INTID 103
        assert!(gic_load(&bad, 2).is_err());
        assert!(gic_load(&b[..n - 1], 2).is_err());
    }
}
