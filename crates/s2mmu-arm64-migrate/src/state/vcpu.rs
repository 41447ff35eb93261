//! One Linux vCPU's registers ([`VcpuState`]) in the migration encoding:
//! x0..x30, PC, PSTATE, the system registers of [`SYSREG_NAMES`], the
//! virtual and physical counts and q0..q31, little-endian.

use s2mmu_arm64::linux::vcpu_state::{VcpuState, SYSREG_NAMES};
use s2mmu_migrate::state::{Fields, StateError};

/// Bytes of one encoded [`VcpuState`].
pub const VCPU_STATE_LEN: usize = 8 * (31 + 2 + SYSREG_NAMES.len() + 2) + 16 * 32;

/// Appends `s`'s bytes.
pub fn encode(s: &VcpuState, out: &mut Vec<u8>) {
    let words = s.x.iter().chain([&s.pc, &s.pstate]);
    let words = words.chain(s.sys.iter()).chain([&s.cntvct, &s.cntpct]);
    for v in words {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for q in &s.q {
        out.extend_from_slice(&q.to_le_bytes());
    }
}

/// Decodes one vCPU's state (`tag`: the section, for errors), and checks
/// that the stub can load it ([`VcpuState::check`]: AArch64 EL1 or EL0,
/// EL2's interrupt registers as a running vCPU holds them).
///
/// # Errors
/// [`StateError::Truncated`] or [`StateError::BadSection`].
pub fn decode(f: &mut Fields<'_>, tag: u32) -> Result<VcpuState, StateError> {
    let mut s = VcpuState {
        x: [0; 31],
        pc: 0,
        pstate: 0,
        sys: [0; SYSREG_NAMES.len()],
        cntvct: 0,
        cntpct: 0,
        q: [0; 32],
    };
    for (i, v) in s.x.iter_mut().enumerate() {
        *v = f.u64(&format!("x{i}"))?;
    }
    s.pc = f.u64("PC")?;
    s.pstate = f.u64("PSTATE")?;
    for (v, name) in s.sys.iter_mut().zip(SYSREG_NAMES) {
        *v = f.u64(name)?;
    }
    s.cntvct = f.u64("CNTVCT")?;
    s.cntpct = f.u64("CNTPCT")?;
    for (i, v) in s.q.iter_mut().enumerate() {
        *v = u128::from_le_bytes(f.array(&format!("q{i}"))?);
    }
    s.check()
        .map_err(|what| StateError::BadSection { tag, what })?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use s2mmu_arm64::linux::vcpu_state::{SYS_ICH_HCR, SYS_ICH_LR0};

    fn state() -> VcpuState {
        let mut s = VcpuState {
            x: std::array::from_fn(|i| i as u64 * 3),
            pc: 0x4020_0000,
            pstate: 5,
            sys: std::array::from_fn(|i| i as u64),
            cntvct: 1,
            cntpct: 2,
            q: std::array::from_fn(|i| (i as u128) << 70 | 9),
        };
        s.sys[SYS_ICH_HCR] = 1 | 3 << 27;
        s.sys[SYS_ICH_LR0..SYS_ICH_LR0 + 4].fill(0);
        s.sys[SYS_ICH_LR0 + 1] = 1 << 62 | 1 << 60 | 0xa0 << 48 | 33;
        s
    }

    fn decoded(s: &VcpuState) -> Result<VcpuState, StateError> {
        let mut b = Vec::new();
        encode(s, &mut b);
        assert_eq!(b.len(), VCPU_STATE_LEN);
        let mut f = Fields::new(&b, "vCPU");
        let r = decode(&mut f, 0x100);
        assert!(r.is_err() || f.remaining() == 0);
        r
    }

    #[test]
    fn a_vcpu_round_trips_and_what_the_stub_cannot_load_is_refused_by_section() {
        let good = state();
        assert_eq!(decoded(&good).unwrap(), good);
        let mut tall = good.clone();
        tall.sys[SYS_ICH_HCR] |= 1 << 12; // TALL1
        let mut aarch32 = good.clone();
        aarch32.pstate = 0x10;
        for bad in [tall, aarch32] {
            let e = decoded(&bad).unwrap_err();
            assert!(
                matches!(e, StateError::BadSection { tag: 0x100, .. }),
                "{e}"
            );
        }
        let mut b = Vec::new();
        encode(&good, &mut b);
        let mut f = Fields::new(&b[..b.len() - 1], "vCPU");
        assert!(matches!(
            decode(&mut f, 0x100),
            Err(StateError::Truncated { .. })
        ));
    }
}
