//! The GDT and the segment/control registers that put a vCPU in 64-bit mode at CPL 3.
//!
//! kvm_pvm emulates CPL 0 code instruction by instruction (slow, and its writes bypass the
//! shadow MMU), but runs CPL 3 code natively. So the guest starts directly in user mode:
//! CS is a DPL-3 64-bit code segment (selector 0x23), SS/DS/ES a DPL-3 data segment
//! (selector 0x2b), with long mode and paging already on.

use kvm_bindings::{kvm_segment, kvm_sregs};

/// GDT index of the 64-bit user code descriptor.
pub const USER_CODE_INDEX: u16 = 4;
/// GDT index of the user data descriptor.
pub const USER_DATA_INDEX: u16 = 5;
/// CS selector: index 4, table GDT, RPL 3.
pub const USER_CODE_SELECTOR: u16 = (USER_CODE_INDEX << 3) | 3;
/// SS/DS/ES selector: index 5, table GDT, RPL 3.
pub const USER_DATA_SELECTOR: u16 = (USER_DATA_INDEX << 3) | 3;

/// CR0.PE: protected mode.
pub const CR0_PE: u64 = 1 << 0;
/// CR0.ET: extension type (hard-wired to 1 on modern CPUs).
pub const CR0_ET: u64 = 1 << 4;
/// CR0.NE: native FPU error reporting.
pub const CR0_NE: u64 = 1 << 5;
/// CR0.WP: supervisor writes honour read-only pages.
pub const CR0_WP: u64 = 1 << 16;
/// CR0.PG: paging.
pub const CR0_PG: u64 = 1 << 31;
/// CR4.PAE: needed for long mode.
pub const CR4_PAE: u64 = 1 << 5;
/// CR4.OSFXSR: SSE instructions and FXSAVE enabled.
pub const CR4_OSFXSR: u64 = 1 << 9;
/// CR4.OSXMMEXCPT: unmasked SSE exceptions raise #XM.
pub const CR4_OSXMMEXCPT: u64 = 1 << 10;
/// EFER.LME: long mode enable.
pub const EFER_LME: u64 = 1 << 8;
/// EFER.LMA: long mode active.
pub const EFER_LMA: u64 = 1 << 10;

/// A flat 64-bit code descriptor, DPL 3: P, DPL=3, S, type execute/read accessed; G, L.
pub const USER_CODE_DESCRIPTOR: u64 = 0x00af_fb00_0000_ffff;
/// A flat data descriptor, DPL 3: P, DPL=3, S, type read/write accessed; G, D/B.
pub const USER_DATA_DESCRIPTOR: u64 = 0x00cf_f300_0000_ffff;

/// The GDT image: null descriptor, three unused ones, user code, user data.
pub fn gdt_bytes() -> Vec<u8> {
    let mut gdt = [0u64; 6];
    gdt[USER_CODE_INDEX as usize] = USER_CODE_DESCRIPTOR;
    gdt[USER_DATA_INDEX as usize] = USER_DATA_DESCRIPTOR;
    gdt.iter().flat_map(|d| d.to_le_bytes()).collect()
}

/// The cached (hidden) part of the user code segment, consistent with its descriptor.
pub fn user_code_segment() -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector: USER_CODE_SELECTOR,
        type_: 0xb,
        present: 1,
        dpl: 3,
        db: 0,
        s: 1,
        l: 1,
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// The cached part of the user data segment, consistent with its descriptor.
pub fn user_data_segment() -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector: USER_DATA_SELECTOR,
        type_: 0x3,
        present: 1,
        dpl: 3,
        db: 1,
        s: 1,
        l: 0,
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// Rewrites `sregs` (as read from a fresh vCPU, so TR and LDT keep KVM's reset values) for
/// 64-bit user mode with the GDT at `gdt_gva` and the page tables at `cr3`.
pub fn set_user_long_mode(sregs: &mut kvm_sregs, gdt_gva: u64, cr3: u64) {
    sregs.gdt.base = gdt_gva;
    sregs.gdt.limit = (gdt_bytes().len() - 1) as u16;
    sregs.cs = user_code_segment();
    let data = user_data_segment();
    sregs.ss = data;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.cr0 = CR0_PE | CR0_ET | CR0_NE | CR0_WP | CR0_PG;
    sregs.cr3 = cr3;
    sregs.cr4 = CR4_PAE;
    sregs.efer = EFER_LME | EFER_LMA;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dpl(descriptor: u64) -> u64 {
        (descriptor >> 45) & 3
    }

    #[test]
    fn descriptors_are_dpl3_and_match_the_cached_segments() {
        let gdt = gdt_bytes();
        assert_eq!(gdt.len(), 48);
        let code = u64::from_le_bytes(gdt[32..40].try_into().unwrap());
        let data = u64::from_le_bytes(gdt[40..48].try_into().unwrap());
        assert_eq!(dpl(code), 3);
        assert_eq!(dpl(data), 3);
        // L bit (53) on code, D/B (54) on data; present (47) and S (44) on both.
        assert_eq!((code >> 53) & 1, 1);
        assert_eq!((data >> 54) & 1, 1);
        for d in [code, data] {
            assert_eq!((d >> 47) & 1, 1);
            assert_eq!((d >> 44) & 1, 1);
        }
        assert_eq!((code >> 40) & 0xf, u64::from(user_code_segment().type_));
        assert_eq!((data >> 40) & 0xf, u64::from(user_data_segment().type_));
        assert_eq!(USER_CODE_SELECTOR, 0x23);
        assert_eq!(USER_DATA_SELECTOR, 0x2b);
    }

    #[test]
    fn sregs_enable_long_mode_paging() {
        let mut sregs = kvm_sregs::default();
        set_user_long_mode(&mut sregs, 0x1000, 0x10000);
        assert_eq!(sregs.cs.dpl, 3);
        assert_eq!(sregs.ss.selector, 0x2b);
        assert_eq!(sregs.cr3, 0x10000);
        assert_ne!(sregs.cr0 & CR0_PG, 0);
        assert_ne!(sregs.cr4 & CR4_PAE, 0);
        assert_eq!(sregs.efer & (EFER_LME | EFER_LMA), EFER_LME | EFER_LMA);
        assert_eq!(sregs.gdt.limit, 47);
    }
}
