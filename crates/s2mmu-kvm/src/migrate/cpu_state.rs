//! A vCPU's state as the migration's STATE carries it: `KVM_GET_REGS`
//! and `KVM_GET_SREGS`, field by field (little endian), one section per
//! vCPU in the library's [`State`] encoding (versioned, checksummed,
//! bounded). What a guest of this crate's kind uses is carried: general
//! registers, segments, descriptor tables, control registers and EFER;
//! FPU/XSAVE, MSRs beyond EFER, the local APIC and pending events are not
//! (the guests here have none in use).

use kvm_bindings::{kvm_dtable, kvm_regs, kvm_segment, kvm_sregs};
use s2mmu_migrate::state::{Fields, State, StateError};

/// The VM kind of this crate's KVM guests in [`State`].
pub const KVM_X86_STATE_KIND: u32 = 0x4b56_4d58; // "XMVK"
/// Section tag of vCPU `i`: this base plus `i`.
pub const VCPU_TAG: u32 = 0x100;
/// The most vCPUs one state may carry.
pub const MAX_STATE_VCPUS: usize = 128;

/// One vCPU's registers.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct VcpuState {
    /// `KVM_GET_REGS`.
    pub regs: kvm_regs,
    /// `KVM_GET_SREGS`.
    pub sregs: kvm_sregs,
}

fn regs_words(r: &kvm_regs) -> [u64; 18] {
    [
        r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.rsp, r.rbp, r.r8, r.r9, r.r10, r.r11, r.r12,
        r.r13, r.r14, r.r15, r.rip, r.rflags,
    ]
}

fn put_segment(out: &mut Vec<u8>, s: &kvm_segment) {
    out.extend_from_slice(&s.base.to_le_bytes());
    out.extend_from_slice(&s.limit.to_le_bytes());
    out.extend_from_slice(&s.selector.to_le_bytes());
    out.extend_from_slice(&[
        s.type_, s.present, s.dpl, s.db, s.s, s.l, s.g, s.avl, s.unusable,
    ]);
}

fn get_segment(f: &mut Fields<'_>) -> Result<kvm_segment, StateError> {
    let base = f.u64("segment base")?;
    let limit = f.u32("segment limit")?;
    let sel: [u8; 2] = f.array("segment selector")?;
    let b: [u8; 9] = f.array("segment flags")?;
    Ok(kvm_segment {
        base,
        limit,
        selector: u16::from_le_bytes(sel),
        type_: b[0],
        present: b[1],
        dpl: b[2],
        db: b[3],
        s: b[4],
        l: b[5],
        g: b[6],
        avl: b[7],
        unusable: b[8],
        padding: 0,
    })
}

impl VcpuState {
    /// The section's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(512);
        for w in regs_words(&self.regs) {
            out.extend_from_slice(&w.to_le_bytes());
        }
        let s = &self.sregs;
        for seg in [&s.cs, &s.ds, &s.es, &s.fs, &s.gs, &s.ss, &s.tr, &s.ldt] {
            put_segment(&mut out, seg);
        }
        for t in [&s.gdt, &s.idt] {
            out.extend_from_slice(&t.base.to_le_bytes());
            out.extend_from_slice(&t.limit.to_le_bytes());
        }
        let words = [s.cr0, s.cr2, s.cr3, s.cr4, s.cr8, s.efer, s.apic_base];
        for w in words.iter().chain(&s.interrupt_bitmap) {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out
    }

    /// Parses a section of tag `tag`.
    ///
    /// # Errors
    /// [`StateError`] naming the field that is cut, or trailing bytes.
    pub fn decode(bytes: &[u8], tag: u32) -> Result<VcpuState, StateError> {
        let mut f = Fields::new(bytes, "vcpu");
        let mut w = [0u64; 18];
        for x in &mut w {
            *x = f.u64("general register")?;
        }
        let regs = kvm_regs {
            rax: w[0],
            rbx: w[1],
            rcx: w[2],
            rdx: w[3],
            rsi: w[4],
            rdi: w[5],
            rsp: w[6],
            rbp: w[7],
            r8: w[8],
            r9: w[9],
            r10: w[10],
            r11: w[11],
            r12: w[12],
            r13: w[13],
            r14: w[14],
            r15: w[15],
            rip: w[16],
            rflags: w[17],
        };
        let mut seg = [kvm_segment::default(); 8];
        for s in &mut seg {
            *s = get_segment(&mut f)?;
        }
        let mut table = || -> Result<kvm_dtable, StateError> {
            let base = f.u64("table base")?;
            let limit: [u8; 2] = f.array("table limit")?;
            Ok(kvm_dtable {
                base,
                limit: u16::from_le_bytes(limit),
                padding: [0; 3],
            })
        };
        let (gdt, idt) = (table()?, table()?);
        let mut c = [0u64; 11];
        for x in &mut c {
            *x = f.u64("control register")?;
        }
        f.finish(tag)?;
        let [cs, ds, es, fs, gs, ss, tr, ldt] = seg;
        let sregs = kvm_sregs {
            cs,
            ds,
            es,
            fs,
            gs,
            ss,
            tr,
            ldt,
            gdt,
            idt,
            cr0: c[0],
            cr2: c[1],
            cr3: c[2],
            cr4: c[3],
            cr8: c[4],
            efer: c[5],
            apic_base: c[6],
            interrupt_bitmap: [c[7], c[8], c[9], c[10]],
        };
        Ok(VcpuState { regs, sregs })
    }
}

/// Every vCPU's state as one STATE body.
///
/// # Errors
/// [`StateError::TooLarge`] past [`MAX_STATE_VCPUS`].
pub fn encode_vcpus(vcpus: &[VcpuState]) -> Result<Vec<u8>, StateError> {
    if vcpus.len() > MAX_STATE_VCPUS {
        return Err(StateError::TooLarge {
            what: "vcpus".into(),
            value: vcpus.len() as u64,
            max: MAX_STATE_VCPUS as u64,
        });
    }
    let mut st = State::new(KVM_X86_STATE_KIND);
    for (i, v) in vcpus.iter().enumerate() {
        st.push(VCPU_TAG + i as u32, v.encode())?;
    }
    Ok(st.encode())
}

/// A STATE body's vCPUs, exactly `vcpus` of them.
///
/// # Errors
/// The encoding's [`StateError`]s; [`StateError::MissingSection`] for a
/// vCPU it lacks; [`StateError::TooLarge`] when it has more.
pub fn decode_vcpus(body: &[u8], vcpus: usize) -> Result<Vec<VcpuState>, StateError> {
    let st = State::decode(body, KVM_X86_STATE_KIND)?;
    if st.tags().len() > vcpus.min(MAX_STATE_VCPUS) {
        return Err(StateError::TooLarge {
            what: format!("vcpu sections (this guest has {vcpus})"),
            value: st.tags().len() as u64,
            max: vcpus.min(MAX_STATE_VCPUS) as u64,
        });
    }
    (0..vcpus)
        .map(|i| {
            let tag = VCPU_TAG + i as u32;
            VcpuState::decode(st.section(tag)?, tag)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(seed: u64) -> VcpuState {
        let mut v = VcpuState::default();
        (v.regs.rax, v.regs.rip, v.regs.rflags, v.regs.r15) = (seed, seed + 1, 2, !seed);
        v.sregs.cs = kvm_segment {
            base: 7,
            limit: 0xffff_ffff,
            selector: 0x23,
            type_: 11,
            present: 1,
            dpl: 3,
            l: 1,
            s: 1,
            ..Default::default()
        };
        v.sregs.gdt = kvm_dtable {
            base: 0x1000,
            limit: 0x2f,
            padding: [0; 3],
        };
        (v.sregs.cr3, v.sregs.efer, v.sregs.interrupt_bitmap[3]) = (0x10000, 0x500, 1 << 63);
        v
    }

    #[test]
    fn every_field_round_trips() {
        let vcpus = [sample(5), sample(9)];
        let body = encode_vcpus(&vcpus).unwrap();
        assert_eq!(decode_vcpus(&body, 2).unwrap(), vcpus);
    }

    #[test]
    fn a_state_of_another_shape_is_refused_by_name() {
        let body = encode_vcpus(&[sample(1), sample(2)]).unwrap();
        // One vCPU more than this guest has, one fewer.
        assert!(matches!(
            decode_vcpus(&body, 1),
            Err(StateError::TooLarge { .. })
        ));
        let e = decode_vcpus(&body, 3).unwrap_err();
        assert_eq!(e, StateError::MissingSection { tag: VCPU_TAG + 2 });
        // A section cut short names the field it lost.
        let cut = VcpuState::decode(&sample(1).encode()[..100], VCPU_TAG).unwrap_err();
        assert!(matches!(cut, StateError::Truncated { .. }), "{cut:?}");
        // Damage anywhere fails the checksum before any field is read.
        let mut bad = body.clone();
        bad[40] ^= 1;
        assert!(decode_vcpus(&bad, 2).is_err());
        assert!(encode_vcpus(&vec![VcpuState::default(); MAX_STATE_VCPUS + 1]).is_err());
    }
}
