//! A VM's state as the migration's STATE carries it: every vCPU's full
//! x86 state as QEMU and cloud-hypervisor save it (`KVM_GET_REGS`,
//! `KVM_GET_SREGS`, the XSAVE area or the FPU, XCRs, the MSRs of
//! `KVM_GET_MSR_INDEX_LIST` that the vCPU can read, the local APIC,
//! pending events, debug registers, the run state), and the VM's KVM clock
//! (`KVM_GET_CLOCK`) with the TSC frequency, in the library's [`State`]
//! encoding (checksummed, bounded). This layout is versioned by its own
//! [`STATE_LAYOUT`] in the VM section, so a state of another layout is
//! refused by name.
//!
//! Sections: the VM section ([`VM_TAG`]), and one per vCPU (tag
//! [`VCPU_TAG`] plus its index) holding its parts (the `PART_*`
//! constants) as (part, length, bytes).

use super::cpu_parts::{self as parts, put_u64s, FpuState};
use kvm_bindings::{
    kvm_debugregs, kvm_dtable, kvm_lapic_state, kvm_regs, kvm_segment, kvm_sregs, kvm_vcpu_events,
    kvm_xcrs,
};
use s2mmu_migrate::state::{Fields, State, StateError};

/// The VM kind of this crate's KVM guests in [`State`].
pub const KVM_X86_STATE_KIND: u32 = 0x4b56_4d58; // "XMVK"
/// The layout of the sections this build writes and reads.
pub const STATE_LAYOUT: u32 = 2;
/// Tag of the VM section: the layout, the vCPU count, the clock.
pub const VM_TAG: u32 = 0;
/// Section tag of vCPU `i`: this base plus `i`.
pub const VCPU_TAG: u32 = 0x100;
/// Part: general and segment registers, descriptor tables, control
/// registers, EFER, APIC base.
pub const PART_CORE: u32 = 1;
/// Part: the XSAVE area or the FPU.
pub const PART_FPU: u32 = 2;
/// Part: the extended control registers (absent where the host has no
/// `KVM_CAP_XCRS`).
pub const PART_XCRS: u32 = 3;
/// Part: the MSRs.
pub const PART_MSRS: u32 = 4;
/// Part: the local APIC's registers.
pub const PART_LAPIC: u32 = 5;
/// Part: pending exceptions, interrupts, NMI, SMI.
pub const PART_EVENTS: u32 = 6;
/// Part: DR0-3, DR6, DR7.
pub const PART_DEBUGREGS: u32 = 7;
/// Part: the run state (`KVM_MP_STATE_*`).
pub const PART_MP_STATE: u32 = 8;
/// The most vCPUs one state may carry.
pub const MAX_STATE_VCPUS: usize = 128;

/// One vCPU's state. A part that is `None` is not set on restore;
/// encoding and decoding demand every part but the XCRs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VcpuState {
    /// `KVM_GET_REGS`.
    pub regs: kvm_regs,
    /// `KVM_GET_SREGS`.
    pub sregs: kvm_sregs,
    /// `KVM_GET_XSAVE2`/`KVM_GET_XSAVE`, or `KVM_GET_FPU`.
    pub fpu: Option<FpuState>,
    /// `KVM_GET_XCRS`.
    pub xcrs: Option<kvm_xcrs>,
    /// `KVM_GET_MSRS`: (index, value), in the order they are set.
    pub msrs: Vec<(u32, u64)>,
    /// `KVM_GET_LAPIC`.
    pub lapic: Option<kvm_lapic_state>,
    /// `KVM_GET_VCPU_EVENTS`.
    pub events: Option<kvm_vcpu_events>,
    /// `KVM_GET_DEBUGREGS`.
    pub debugregs: Option<kvm_debugregs>,
    /// `KVM_GET_MP_STATE`.
    pub mp_state: Option<u32>,
}

/// The VM's clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClockState {
    /// `KVM_GET_CLOCK`'s nanoseconds.
    pub clock_ns: u64,
    /// The guest's TSC frequency in kHz (`KVM_GET_TSC_KHZ`; 0: unknown).
    pub tsc_khz: u32,
}

/// Every vCPU's state and the VM's clock.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KvmState {
    /// One per vCPU, in vCPU id order.
    pub vcpus: Vec<VcpuState>,
    /// The KVM clock.
    pub clock: ClockState,
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

/// The core part's bytes.
fn encode_core(regs: &kvm_regs, sregs: &kvm_sregs) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    for w in regs_words(regs) {
        out.extend_from_slice(&w.to_le_bytes());
    }
    let s = sregs;
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

/// Parses the core part of tag `tag`.
fn decode_core(bytes: &[u8], tag: u32) -> Result<(kvm_regs, kvm_sregs), StateError> {
    let mut f = Fields::new(bytes, "vcpu registers");
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
    Ok((regs, sregs))
}

/// A part's name in error texts.
pub fn part_name(part: u32) -> &'static str {
    match part {
        PART_CORE => "registers",
        PART_FPU => "xsave/fpu",
        PART_XCRS => "xcrs",
        PART_MSRS => "msrs",
        PART_LAPIC => "lapic",
        PART_EVENTS => "events",
        PART_DEBUGREGS => "debugregs",
        PART_MP_STATE => "mp state",
        _ => "unknown part",
    }
}

impl VcpuState {
    /// The vCPU's section of tag `tag`: each part as (part, length,
    /// bytes), the XCRs where present.
    ///
    /// # Errors
    /// What [`VcpuState::decode`] would refuse, named, before anything is
    /// sent: [`StateError::BadSection`] for a missing part (every part but
    /// the XCRs), the parts' bounds ([`parts::encode_fpu`],
    /// [`parts::encode_xcrs`], [`parts::encode_msrs`]).
    pub fn encode(&self, tag: u32) -> Result<Vec<u8>, StateError> {
        let missing = |p: u32| bad(tag, format!("no {} part", part_name(p)));
        let fpu = self.fpu.as_ref().ok_or_else(|| missing(PART_FPU))?;
        let lapic = self.lapic.as_ref().ok_or_else(|| missing(PART_LAPIC))?;
        let events = self.events.as_ref().ok_or_else(|| missing(PART_EVENTS))?;
        let debugregs = self.debugregs.as_ref();
        let debugregs = debugregs.ok_or_else(|| missing(PART_DEBUGREGS))?;
        let mp_state = self.mp_state.ok_or_else(|| missing(PART_MP_STATE))?;
        let mut out = Vec::with_capacity(8 << 10);
        let mut add = |part: u32, b: Vec<u8>| {
            out.extend_from_slice(&part.to_le_bytes());
            out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            out.extend_from_slice(&b);
        };
        add(PART_CORE, encode_core(&self.regs, &self.sregs));
        add(PART_FPU, parts::encode_fpu(fpu, tag)?);
        if let Some(x) = &self.xcrs {
            add(PART_XCRS, parts::encode_xcrs(x)?);
        }
        add(PART_MSRS, parts::encode_msrs(&self.msrs, tag)?);
        add(PART_LAPIC, parts::encode_lapic(lapic));
        add(PART_EVENTS, parts::encode_events(events));
        add(PART_DEBUGREGS, parts::encode_debugregs(debugregs));
        add(PART_MP_STATE, mp_state.to_le_bytes().to_vec());
        Ok(out)
    }

    /// Parses the section of tag `tag`.
    ///
    /// # Errors
    /// [`StateError`] naming the field; [`StateError::BadSection`] naming
    /// a part that is missing (every part but the XCRs must be there),
    /// unknown or twice.
    pub fn decode(bytes: &[u8], tag: u32) -> Result<VcpuState, StateError> {
        let mut f = Fields::new(bytes, "vcpu");
        let mut found: [Option<&[u8]>; PART_MP_STATE as usize + 1] = Default::default();
        while f.remaining() > 0 {
            let part = f.u32("part")?;
            let len = f.u32("part length")? as usize;
            let body = f.bytes(len, part_name(part))?;
            let slot = found
                .get_mut(part as usize)
                .filter(|_| part >= PART_CORE)
                .ok_or_else(|| bad(tag, format!("part {part} is none of this layout's")))?;
            if slot.replace(body).is_some() {
                return Err(bad(tag, format!("{} twice", part_name(part))));
            }
        }
        let need =
            |p: u32| found[p as usize].ok_or_else(|| bad(tag, format!("no {} part", part_name(p))));
        let (regs, sregs) = decode_core(need(PART_CORE)?, tag)?;
        let fpu = Some(parts::decode_fpu(need(PART_FPU)?, tag)?);
        let xcrs = found[PART_XCRS as usize]
            .map(|b| parts::decode_xcrs(b, tag))
            .transpose()?;
        let msrs = parts::decode_msrs(need(PART_MSRS)?, tag)?;
        let lapic = Some(parts::decode_lapic(need(PART_LAPIC)?, tag)?);
        let events = Some(parts::decode_events(need(PART_EVENTS)?, tag)?);
        let debugregs = Some(parts::decode_debugregs(need(PART_DEBUGREGS)?, tag)?);
        let mut m = Fields::new(need(PART_MP_STATE)?, "mp state");
        let mp_state = Some(m.u32("mp state")?);
        m.finish(tag)?;
        Ok(VcpuState {
            regs,
            sregs,
            fpu,
            xcrs,
            msrs,
            lapic,
            events,
            debugregs,
            mp_state,
        })
    }
}

fn bad(tag: u32, what: String) -> StateError {
    StateError::BadSection { tag, what }
}

impl KvmState {
    /// The STATE body.
    ///
    /// # Errors
    /// [`StateError::TooLarge`] past [`MAX_STATE_VCPUS`] or a bound of the
    /// encoding; a vCPU's [`VcpuState::encode`] error (a part missing or
    /// over its bound, named with that vCPU's tag).
    pub fn encode(&self) -> Result<Vec<u8>, StateError> {
        let n = self.vcpus.len();
        if n > MAX_STATE_VCPUS {
            return Err(StateError::TooLarge {
                what: "vcpus".into(),
                value: n as u64,
                max: MAX_STATE_VCPUS as u64,
            });
        }
        let mut st = State::new(KVM_X86_STATE_KIND);
        let mut vm = Vec::with_capacity(20);
        vm.extend_from_slice(&STATE_LAYOUT.to_le_bytes());
        vm.extend_from_slice(&(n as u32).to_le_bytes());
        put_u64s(&mut vm, &[self.clock.clock_ns]);
        vm.extend_from_slice(&self.clock.tsc_khz.to_le_bytes());
        st.push(VM_TAG, vm)?;
        for (i, v) in self.vcpus.iter().enumerate() {
            let tag = VCPU_TAG + i as u32;
            st.push(tag, v.encode(tag)?)?;
        }
        Ok(st.encode())
    }

    /// A STATE body of a VM of exactly `vcpus` vCPUs. Nothing is returned
    /// unless every section parses.
    ///
    /// # Errors
    /// The encoding's [`StateError`]s; [`StateError::Version`] for another
    /// layout; [`StateError::BadSection`] for a vCPU count other than
    /// `vcpus`; [`StateError::MissingSection`] naming the tag of a part it
    /// lacks; [`StateError::BadSection`] for a section that belongs to no
    /// vCPU.
    pub fn decode(body: &[u8], vcpus: usize) -> Result<KvmState, StateError> {
        let st = State::decode(body, KVM_X86_STATE_KIND)?;
        let mut f = Fields::new(st.section(VM_TAG)?, "vm");
        let layout = f.u32("state layout")?;
        if layout != STATE_LAYOUT {
            return Err(StateError::Version {
                found: layout,
                supported: STATE_LAYOUT,
            });
        }
        let n = f.u32("vcpu count")? as usize;
        let clock = ClockState {
            clock_ns: f.u64("kvm clock")?,
            tsc_khz: f.u32("tsc khz")?,
        };
        f.finish(VM_TAG)?;
        if n != vcpus || n > MAX_STATE_VCPUS {
            return Err(StateError::BadSection {
                tag: VM_TAG,
                what: format!("{n} vcpus, but this VM has {vcpus}"),
            });
        }
        if st.tags().len() != n + 1 {
            return Err(bad(
                VM_TAG,
                format!("{} sections for {n} vcpus", st.tags().len()),
            ));
        }
        let vcpus = (0..n)
            .map(|i| {
                let tag = VCPU_TAG + i as u32;
                VcpuState::decode(st.section(tag)?, tag)
            })
            .collect::<Result<_, _>>()?;
        Ok(KvmState { vcpus, clock })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migrate::cpu_parts::{MAX_MSRS, MAX_XSAVE_BYTES};

    pub(crate) fn sample(seed: u64) -> VcpuState {
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
        let mut xsave = vec![0u32; 1024];
        xsave[40] = seed as u32; // xmm0's low word
        v.fpu = Some(FpuState::Xsave(xsave));
        v.xcrs = Some(kvm_xcrs {
            nr_xcrs: 1,
            ..Default::default()
        });
        v.msrs = vec![(0x10, seed << 20), (0xc000_0102, 0xfeed)];
        let mut lapic = kvm_lapic_state::default();
        lapic.regs[0x80] = 0x20;
        v.lapic = Some(lapic);
        v.events = Some(kvm_vcpu_events {
            flags: 13,
            ..Default::default()
        });
        let mut dr = kvm_debugregs::default();
        (dr.db[0], dr.dr7) = (seed, 0x400);
        v.debugregs = Some(dr);
        v.mp_state = Some(0);
        v
    }

    fn two() -> KvmState {
        KvmState {
            vcpus: vec![sample(5), sample(9)],
            clock: ClockState {
                clock_ns: 123_456,
                tsc_khz: 2_600_000,
            },
        }
    }

    #[test]
    fn every_field_round_trips() {
        let st = two();
        assert_eq!(KvmState::decode(&st.encode().unwrap(), 2).unwrap(), st);
        // The XCRs are the one optional part.
        let mut no_xcrs = two();
        no_xcrs.vcpus[1].xcrs = None;
        assert_eq!(
            KvmState::decode(&no_xcrs.encode().unwrap(), 2).unwrap(),
            no_xcrs
        );
    }

    #[test]
    fn a_state_of_another_shape_is_refused_by_name() {
        let body = two().encode().unwrap();
        // One vCPU more than this guest has, one fewer.
        for n in [1, 3] {
            let e = KvmState::decode(&body, n).unwrap_err();
            assert!(
                matches!(e, StateError::BadSection { tag: VM_TAG, .. }),
                "{e:?}"
            );
        }
        // A state without vCPU 1's XSAVE section names that section.
        let mut st = State::decode(&body, KVM_X86_STATE_KIND).unwrap();
        let one = VCPU_TAG + 1;
        let mut section = st.section(one).unwrap().to_vec();
        let core = 8 + encode_core(&sample(9).regs, &sample(9).sregs).len();
        let fpu_len = u32::from_le_bytes(section[core + 4..core + 8].try_into().unwrap());
        section.drain(core..core + 8 + fpu_len as usize);
        let mut dropped = State::new(KVM_X86_STATE_KIND);
        for tag in st.tags() {
            let bytes = if tag == one {
                section.clone()
            } else {
                st.section(tag).unwrap().to_vec()
            };
            dropped.push(tag, bytes).unwrap();
        }
        let e = KvmState::decode(&dropped.encode(), 2).unwrap_err();
        assert_eq!(e, bad(one, "no xsave/fpu part".into()));
        // A part this layout does not have, a part twice, a section more.
        let mut extra = sample(1).encode(VCPU_TAG).unwrap();
        extra.extend_from_slice(&[9, 0, 0, 0, 1, 0, 0, 0, 7]);
        let e = VcpuState::decode(&extra, VCPU_TAG).unwrap_err();
        assert!(matches!(e, StateError::BadSection { ref what, .. } if what.contains("part 9")));
        let mut twice = sample(1).encode(VCPU_TAG).unwrap();
        twice.extend_from_slice(&[8, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0]);
        let e = VcpuState::decode(&twice, VCPU_TAG).unwrap_err();
        assert_eq!(e, bad(VCPU_TAG, "mp state twice".into()));
        st.push(VCPU_TAG + 7, sample(1).encode(VCPU_TAG + 7).unwrap())
            .unwrap();
        let e = KvmState::decode(&st.encode(), 2).unwrap_err();
        assert!(
            matches!(e, StateError::BadSection { tag: VM_TAG, .. }),
            "{e:?}"
        );
        // Another layout version.
        let mut st = State::new(KVM_X86_STATE_KIND);
        let mut vm = 1u32.to_le_bytes().to_vec();
        vm.extend_from_slice(&[0; 16]);
        st.push(VM_TAG, vm).unwrap();
        let e = KvmState::decode(&st.encode(), 2).unwrap_err();
        assert_eq!(
            e,
            StateError::Version {
                found: 1,
                supported: STATE_LAYOUT
            }
        );
        // A core section cut short names the field it lost.
        let core = encode_core(&sample(1).regs, &sample(1).sregs);
        let cut = decode_core(&core[..100], VCPU_TAG).unwrap_err();
        assert!(matches!(cut, StateError::Truncated { .. }), "{cut:?}");
        // Damage anywhere fails the checksum before any field is read.
        let mut bad = body.clone();
        bad[40] ^= 1;
        assert!(KvmState::decode(&bad, 2).is_err());
        let many = KvmState {
            vcpus: vec![VcpuState::default(); MAX_STATE_VCPUS + 1],
            ..KvmState::default()
        };
        assert!(many.encode().is_err());
    }

    #[test]
    fn a_state_missing_a_part_or_over_a_bound_is_refused_when_encoded() {
        type Drop = fn(&mut VcpuState);
        let drops: [(Drop, &str); 5] = [
            (|v| v.fpu = None, "no xsave/fpu part"),
            (|v| v.lapic = None, "no lapic part"),
            (|v| v.events = None, "no events part"),
            (|v| v.debugregs = None, "no debugregs part"),
            (|v| v.mp_state = None, "no mp state part"),
        ];
        for (drop, what) in drops {
            let mut st = two();
            drop(&mut st.vcpus[1]);
            assert_eq!(st.encode().unwrap_err(), bad(VCPU_TAG + 1, what.into()));
        }
        let mut st = two();
        st.vcpus[0].msrs = (0..=MAX_MSRS as u32).map(|i| (i, 0)).collect();
        let e = st.encode().unwrap_err();
        assert!(
            matches!(e, StateError::TooLarge { ref what, .. } if what == "msrs"),
            "{e:?}"
        );
        let mut st = two();
        st.vcpus[1].fpu = Some(FpuState::Xsave(vec![0; MAX_XSAVE_BYTES / 4 + 1]));
        let e = st.encode().unwrap_err();
        assert!(
            matches!(e, StateError::TooLarge { ref what, .. } if what == "xsave words"),
            "{e:?}"
        );
    }
}
