//! The parts of a vCPU's state beyond its registers, each one section of
//! the STATE, field by field (little endian): the FPU/SSE/AVX state
//! (`KVM_GET_XSAVE2`, `KVM_GET_XSAVE` or `KVM_GET_FPU`), the extended
//! control registers (`KVM_GET_XCRS`), the MSRs (`KVM_GET_MSRS`), the
//! local APIC (`KVM_GET_LAPIC`), pending events (`KVM_GET_VCPU_EVENTS`),
//! the debug registers (`KVM_GET_DEBUGREGS`) and the run state
//! (`KVM_GET_MP_STATE`).
//!
//! Every count read from the bytes is checked against its bound and
//! against the bytes present before anything is allocated.

use kvm_bindings::{
    kvm_debugregs, kvm_fpu, kvm_lapic_state, kvm_vcpu_events, kvm_xcr, kvm_xcrs, KVM_APIC_REG_SIZE,
};
use s2mmu_migrate::state::{Fields, StateError};

/// The largest XSAVE area carried (Linux's `KVM_CAP_XSAVE2` sizes are
/// 4 KiB, about 11 KiB with AMX).
pub const MAX_XSAVE_BYTES: usize = 64 << 10;
/// The XSAVE area of `KVM_GET_XSAVE` (the legacy ioctl), and the least.
pub const XSAVE_LEGACY_BYTES: usize = 4096;
/// The most MSRs one vCPU's section carries.
pub const MAX_MSRS: usize = 1024;
/// The most extended control registers (`kvm_xcrs` holds 16).
pub const MAX_XCRS: usize = 16;

/// The FPU, SSE and AVX state.
#[derive(Clone, Debug, PartialEq)]
pub enum FpuState {
    /// The XSAVE area (`KVM_GET_XSAVE2` or `KVM_GET_XSAVE`) as 32-bit
    /// words, at least [`XSAVE_LEGACY_BYTES`].
    Xsave(Vec<u32>),
    /// `KVM_GET_FPU`, on a host without XSAVE.
    Fpu(Box<kvm_fpu>),
}

/// Appends little-endian words.
pub(super) fn put_u64s(out: &mut Vec<u8>, words: &[u64]) {
    for w in words {
        out.extend_from_slice(&w.to_le_bytes());
    }
}

fn put_u32(out: &mut Vec<u8>, w: u32) {
    out.extend_from_slice(&w.to_le_bytes());
}

/// A count from the bytes, checked against `max` and against the bytes
/// left (`each` bytes per item) before the caller allocates.
fn count(f: &mut Fields<'_>, what: &str, max: usize, each: usize) -> Result<usize, StateError> {
    let n = f.u32(what)? as usize;
    if n > max {
        return Err(StateError::TooLarge {
            what: what.into(),
            value: n as u64,
            max: max as u64,
        });
    }
    if n * each > f.remaining() {
        return Err(StateError::Truncated {
            what: format!("{n} {what} ({} bytes left)", f.remaining()),
        });
    }
    Ok(n)
}

/// `value` of `what`, refused past `max` as the decoder would.
fn bounded(what: &str, value: usize, max: usize) -> Result<u32, StateError> {
    if value > max {
        return Err(StateError::TooLarge {
            what: what.into(),
            value: value as u64,
            max: max as u64,
        });
    }
    Ok(value as u32)
}

/// The FPU section's bytes.
///
/// # Errors
/// The decoder's bounds: [`StateError::TooLarge`] for an XSAVE area over
/// [`MAX_XSAVE_BYTES`], [`StateError::BadSection`] (with `tag`) for one
/// under [`XSAVE_LEGACY_BYTES`].
pub fn encode_fpu(fpu: &FpuState, tag: u32) -> Result<Vec<u8>, StateError> {
    let mut out = Vec::new();
    match fpu {
        FpuState::Xsave(words) => {
            let n = bounded("xsave words", words.len(), MAX_XSAVE_BYTES / 4)?;
            if words.len() * 4 < XSAVE_LEGACY_BYTES {
                return Err(StateError::BadSection {
                    tag,
                    what: format!("xsave area of {} bytes, less than 4096", words.len() * 4),
                });
            }
            out.push(0);
            put_u32(&mut out, n);
            for w in words {
                put_u32(&mut out, *w);
            }
        }
        FpuState::Fpu(f) => {
            out.push(1);
            for r in &f.fpr {
                out.extend_from_slice(r);
            }
            out.extend_from_slice(&f.fcw.to_le_bytes());
            out.extend_from_slice(&f.fsw.to_le_bytes());
            out.push(f.ftwx);
            out.extend_from_slice(&f.last_opcode.to_le_bytes());
            put_u64s(&mut out, &[f.last_ip, f.last_dp]);
            for r in &f.xmm {
                out.extend_from_slice(r);
            }
            put_u32(&mut out, f.mxcsr);
        }
    }
    Ok(out)
}

/// Parses the FPU section of tag `tag`.
///
/// # Errors
/// [`StateError`] naming the field that is cut or out of bounds.
pub fn decode_fpu(bytes: &[u8], tag: u32) -> Result<FpuState, StateError> {
    let mut f = Fields::new(bytes, "fpu");
    let [kind] = f.array::<1>("fpu kind")?;
    let fpu = match kind {
        0 => {
            let n = count(&mut f, "xsave words", MAX_XSAVE_BYTES / 4, 4)?;
            if n * 4 < XSAVE_LEGACY_BYTES {
                return Err(StateError::BadSection {
                    tag,
                    what: format!("xsave area of {} bytes, less than 4096", n * 4),
                });
            }
            let raw = f.bytes(n * 4, "xsave area")?;
            let words = raw
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")));
            FpuState::Xsave(words.collect())
        }
        1 => {
            let mut x = kvm_fpu::default();
            for r in &mut x.fpr {
                *r = f.array("x87 register")?;
            }
            x.fcw = u16::from_le_bytes(f.array("fcw")?);
            x.fsw = u16::from_le_bytes(f.array("fsw")?);
            [x.ftwx] = f.array("ftwx")?;
            x.last_opcode = u16::from_le_bytes(f.array("last opcode")?);
            x.last_ip = f.u64("last ip")?;
            x.last_dp = f.u64("last dp")?;
            for r in &mut x.xmm {
                *r = f.array("xmm register")?;
            }
            x.mxcsr = f.u32("mxcsr")?;
            FpuState::Fpu(Box::new(x))
        }
        k => {
            return Err(StateError::BadSection {
                tag,
                what: format!("fpu kind {k}: neither 0 (xsave) nor 1 (fpu)"),
            })
        }
    };
    f.finish(tag)?;
    Ok(fpu)
}

/// The XCR section's bytes.
///
/// # Errors
/// [`StateError::TooLarge`] for more than [`MAX_XCRS`].
pub fn encode_xcrs(x: &kvm_xcrs) -> Result<Vec<u8>, StateError> {
    let n = bounded("xcrs", x.nr_xcrs as usize, MAX_XCRS)? as usize;
    let mut out = Vec::with_capacity(8 + n * 12);
    put_u32(&mut out, n as u32);
    put_u32(&mut out, x.flags);
    for r in &x.xcrs[..n] {
        put_u32(&mut out, r.xcr);
        put_u64s(&mut out, &[r.value]);
    }
    Ok(out)
}

/// Parses the XCR section of tag `tag`.
///
/// # Errors
/// [`StateError`] naming the field.
pub fn decode_xcrs(bytes: &[u8], tag: u32) -> Result<kvm_xcrs, StateError> {
    let mut f = Fields::new(bytes, "xcrs");
    let n = count(&mut f, "xcrs", MAX_XCRS, 12)?;
    let mut x = kvm_xcrs {
        nr_xcrs: n as u32,
        flags: f.u32("xcrs flags")?,
        ..Default::default()
    };
    for r in &mut x.xcrs[..n] {
        *r = kvm_xcr {
            xcr: f.u32("xcr index")?,
            reserved: 0,
            value: f.u64("xcr value")?,
        };
    }
    f.finish(tag)?;
    Ok(x)
}

/// The MSR section's bytes: (index, value) pairs.
///
/// # Errors
/// The decoder's bounds: [`StateError::TooLarge`] past [`MAX_MSRS`];
/// [`StateError::BadSection`] (with `tag`) for an index twice.
pub fn encode_msrs(msrs: &[(u32, u64)], tag: u32) -> Result<Vec<u8>, StateError> {
    let n = bounded("msrs", msrs.len(), MAX_MSRS)?;
    let mut out = Vec::with_capacity(4 + msrs.len() * 12);
    put_u32(&mut out, n);
    let mut seen = std::collections::HashSet::with_capacity(msrs.len());
    for (i, v) in msrs {
        if !seen.insert(*i) {
            return Err(StateError::BadSection {
                tag,
                what: format!("msr {i:#x} twice"),
            });
        }
        put_u32(&mut out, *i);
        put_u64s(&mut out, &[*v]);
    }
    Ok(out)
}

/// Parses the MSR section of tag `tag`.
///
/// # Errors
/// [`StateError`] naming the field; [`StateError::TooLarge`] past
/// [`MAX_MSRS`]; [`StateError::BadSection`] for an index twice.
pub fn decode_msrs(bytes: &[u8], tag: u32) -> Result<Vec<(u32, u64)>, StateError> {
    let mut f = Fields::new(bytes, "msrs");
    let n = count(&mut f, "msrs", MAX_MSRS, 12)?;
    let mut out: Vec<(u32, u64)> = Vec::with_capacity(n);
    for _ in 0..n {
        let index = f.u32("msr index")?;
        let value = f.u64("msr value")?;
        if out.iter().any(|(i, _)| *i == index) {
            return Err(StateError::BadSection {
                tag,
                what: format!("msr {index:#x} twice"),
            });
        }
        out.push((index, value));
    }
    f.finish(tag)?;
    Ok(out)
}

/// The LAPIC section's bytes: its register page.
pub fn encode_lapic(l: &kvm_lapic_state) -> Vec<u8> {
    l.regs.iter().map(|b| *b as u8).collect()
}

/// Parses the LAPIC section of tag `tag`.
///
/// # Errors
/// [`StateError`] naming the field.
pub fn decode_lapic(bytes: &[u8], tag: u32) -> Result<kvm_lapic_state, StateError> {
    let mut f = Fields::new(bytes, "lapic");
    let raw: [u8; KVM_APIC_REG_SIZE as usize] = f.array("lapic registers")?;
    f.finish(tag)?;
    let mut l = kvm_lapic_state::default();
    for (d, s) in l.regs.iter_mut().zip(raw) {
        *d = s as std::os::raw::c_char;
    }
    Ok(l)
}

/// The events section's bytes.
pub fn encode_events(e: &kvm_vcpu_events) -> Vec<u8> {
    let (x, i, n, s) = (&e.exception, &e.interrupt, &e.nmi, &e.smi);
    let mut out = vec![
        x.injected,
        x.nr,
        x.has_error_code,
        x.pending,
        i.injected,
        i.nr,
        i.soft,
        i.shadow,
        n.injected,
        n.pending,
        n.masked,
        s.smm,
        s.pending,
        s.smm_inside_nmi,
        s.latched_init,
        e.triple_fault.pending,
        e.exception_has_payload,
    ];
    for w in [x.error_code, e.sipi_vector, e.flags] {
        put_u32(&mut out, w);
    }
    put_u64s(&mut out, &[e.exception_payload]);
    out
}

/// Parses the events section of tag `tag`.
///
/// # Errors
/// [`StateError`] naming the field.
pub fn decode_events(bytes: &[u8], tag: u32) -> Result<kvm_vcpu_events, StateError> {
    let mut f = Fields::new(bytes, "events");
    let b: [u8; 17] = f.array("event flags")?;
    let mut e = kvm_vcpu_events::default();
    let (x, i) = (&mut e.exception, &mut e.interrupt);
    [x.injected, x.nr, x.has_error_code, x.pending] = [b[0], b[1], b[2], b[3]];
    [i.injected, i.nr, i.soft, i.shadow] = [b[4], b[5], b[6], b[7]];
    [e.nmi.injected, e.nmi.pending, e.nmi.masked] = [b[8], b[9], b[10]];
    let s = &mut e.smi;
    [s.smm, s.pending, s.smm_inside_nmi, s.latched_init] = [b[11], b[12], b[13], b[14]];
    [e.triple_fault.pending, e.exception_has_payload] = [b[15], b[16]];
    e.exception.error_code = f.u32("exception error code")?;
    e.sipi_vector = f.u32("sipi vector")?;
    e.flags = f.u32("events flags")?;
    e.exception_payload = f.u64("exception payload")?;
    f.finish(tag)?;
    Ok(e)
}

/// The debug registers' section bytes.
pub fn encode_debugregs(d: &kvm_debugregs) -> Vec<u8> {
    let mut out = Vec::with_capacity(56);
    put_u64s(&mut out, &d.db);
    put_u64s(&mut out, &[d.dr6, d.dr7, d.flags]);
    out
}

/// Parses the debug registers' section of tag `tag`.
///
/// # Errors
/// [`StateError`] naming the field.
pub fn decode_debugregs(bytes: &[u8], tag: u32) -> Result<kvm_debugregs, StateError> {
    let mut f = Fields::new(bytes, "debugregs");
    let mut d = kvm_debugregs::default();
    for r in &mut d.db {
        *r = f.u64("debug address register")?;
    }
    d.dr6 = f.u64("dr6")?;
    d.dr7 = f.u64("dr7")?;
    d.flags = f.u64("debugregs flags")?;
    f.finish(tag)?;
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_part_round_trips() {
        let xs = FpuState::Xsave((0..1100).collect());
        assert_eq!(decode_fpu(&encode_fpu(&xs, 1).unwrap(), 1).unwrap(), xs);
        let mut fpu = kvm_fpu::default();
        (fpu.fcw, fpu.xmm[15][3], fpu.mxcsr, fpu.last_dp) = (0x37f, 9, 0x1f80, 7);
        let fp = FpuState::Fpu(Box::new(fpu));
        assert_eq!(decode_fpu(&encode_fpu(&fp, 1).unwrap(), 1).unwrap(), fp);
        let mut x = kvm_xcrs {
            nr_xcrs: 1,
            ..Default::default()
        };
        x.xcrs[0].value = 7;
        assert_eq!(decode_xcrs(&encode_xcrs(&x).unwrap(), 1).unwrap(), x);
        let msrs = vec![(0x10, 1 << 40), (0xc000_0102, 5)];
        assert_eq!(
            decode_msrs(&encode_msrs(&msrs, 1).unwrap(), 1).unwrap(),
            msrs
        );
        let mut l = kvm_lapic_state::default();
        (l.regs[0x80], l.regs[1023]) = (0x20, -1);
        assert_eq!(decode_lapic(&encode_lapic(&l), 1).unwrap(), l);
        let mut e = kvm_vcpu_events::default();
        (
            e.nmi.masked,
            e.flags,
            e.exception_payload,
            e.smi.latched_init,
        ) = (1, 13, 9, 1);
        assert_eq!(decode_events(&encode_events(&e), 1).unwrap(), e);
        let mut d = kvm_debugregs::default();
        (d.db[2], d.dr7) = (0x1234, 0x400);
        assert_eq!(decode_debugregs(&encode_debugregs(&d), 1).unwrap(), d);
    }

    #[test]
    fn counts_from_the_bytes_are_bounded_before_allocating() {
        // 4 billion MSRs claimed in 4 bytes.
        let e = decode_msrs(&u32::MAX.to_le_bytes(), 7).unwrap_err();
        assert!(
            matches!(e, StateError::TooLarge { ref what, .. } if what == "msrs"),
            "{e:?}"
        );
        // A count within bounds but more than the bytes hold.
        let e = decode_msrs(&3u32.to_le_bytes(), 7).unwrap_err();
        assert!(matches!(e, StateError::Truncated { ref what } if what.contains("msrs")));
        let mut big = vec![0u8];
        big.extend_from_slice(&(1u32 << 20).to_le_bytes());
        let e = decode_fpu(&big, 7).unwrap_err();
        assert!(matches!(e, StateError::TooLarge { ref what, .. } if what == "xsave words"));
        let mut small = vec![0u8];
        small.extend_from_slice(&4u32.to_le_bytes());
        small.extend_from_slice(&[0; 16]);
        assert!(matches!(
            decode_fpu(&small, 7),
            Err(StateError::BadSection { tag: 7, .. })
        ));
        assert!(matches!(
            decode_fpu(&[9], 7),
            Err(StateError::BadSection { tag: 7, .. })
        ));
        let e = decode_xcrs(&17u32.to_le_bytes(), 7).unwrap_err();
        assert!(matches!(e, StateError::TooLarge { .. }));
        // An MSR twice, a section cut, bytes left over.
        let mut twice = 2u32.to_le_bytes().to_vec();
        for v in [1u64, 2] {
            twice.extend_from_slice(&0x10u32.to_le_bytes());
            twice.extend_from_slice(&v.to_le_bytes());
        }
        assert!(matches!(
            decode_msrs(&twice, 7),
            Err(StateError::BadSection { tag: 7, .. })
        ));
        let ev = encode_events(&kvm_vcpu_events::default());
        let e = decode_events(&ev[..ev.len() - 1], 7).unwrap_err();
        assert!(
            matches!(e, StateError::Truncated { ref what } if what.contains("exception payload"))
        );
        let mut long = encode_debugregs(&kvm_debugregs::default());
        long.push(0);
        assert!(matches!(
            decode_debugregs(&long, 7),
            Err(StateError::BadSection { tag: 7, .. })
        ));
    }

    #[test]
    fn the_encoder_refuses_what_the_decoder_would() {
        let many: Vec<(u32, u64)> = (0..=MAX_MSRS as u32).map(|i| (i, 0)).collect();
        let e = encode_msrs(&many, 7).unwrap_err();
        assert!(
            matches!(e, StateError::TooLarge { ref what, value, max }
                if what == "msrs" && value == MAX_MSRS as u64 + 1 && max == MAX_MSRS as u64),
            "{e:?}"
        );
        assert!(encode_msrs(&many[..MAX_MSRS], 7).is_ok());
        let e = encode_msrs(&[(0x10, 1), (0x10, 2)], 7).unwrap_err();
        assert_eq!(
            e,
            StateError::BadSection {
                tag: 7,
                what: "msr 0x10 twice".into()
            }
        );
        let big = FpuState::Xsave(vec![0; MAX_XSAVE_BYTES / 4 + 1]);
        let e = encode_fpu(&big, 7).unwrap_err();
        assert!(matches!(e, StateError::TooLarge { ref what, .. } if what == "xsave words"));
        let small = FpuState::Xsave(vec![0; XSAVE_LEGACY_BYTES / 4 - 1]);
        let e = encode_fpu(&small, 7).unwrap_err();
        assert!(matches!(e, StateError::BadSection { tag: 7, ref what } if what.contains("xsave")));
        let x = kvm_xcrs {
            nr_xcrs: MAX_XCRS as u32 + 1,
            ..Default::default()
        };
        let e = encode_xcrs(&x).unwrap_err();
        assert!(matches!(e, StateError::TooLarge { ref what, .. } if what == "xcrs"));
    }
}
