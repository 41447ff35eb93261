//! One Linux vCPU's architectural state as the stub's STATE command and
//! ACT_SAVE answer move it (asm/state.S).

use crate::layout::mb;
use crate::linux::gic::{ICH_HCR_EN, ICH_HCR_UIE, LR_HW, LR_STATE_MASK, NR_IRQS, NR_LRS};
use crate::machine::Mailbox;

/// The stub's STATE command (asm/state.S).
pub const CMD_STATE: u64 = 0x20;
/// The answer to an exit that saves the vCPU's state instead of resuming.
pub const ACT_SAVE: u64 = 0x20;
/// The state area: the vCPU mailbox's command-instruction page.
const AREA: u64 = mb::CMD_INSNS;
const ST_ELR: u64 = 0x0f8;
const ST_SPSR: u64 = 0x100;
const ST_SYS: u64 = 0x108;
const ST_CNTVCT: u64 = 0x280;
const ST_CNTPCT: u64 = 0x288;
const ST_FP: u64 = 0x300;

/// The system registers in the area, in asm/state.S's order.
pub const SYSREG_NAMES: [&str; 46] = [
    "SCTLR_EL1",
    "TTBR0_EL1",
    "TTBR1_EL1",
    "TCR_EL1",
    "MAIR_EL1",
    "AMAIR_EL1",
    "VBAR_EL1",
    "CONTEXTIDR_EL1",
    "TPIDR_EL0",
    "TPIDRRO_EL0",
    "TPIDR_EL1",
    "SP_EL0",
    "SP_EL1",
    "ELR_EL1",
    "SPSR_EL1",
    "ESR_EL1",
    "FAR_EL1",
    "AFSR0_EL1",
    "AFSR1_EL1",
    "PAR_EL1",
    "CPACR_EL1",
    "CNTKCTL_EL1",
    "MDSCR_EL1",
    "CSSELR_EL1",
    "APIAKEYLO_EL1",
    "APIAKEYHI_EL1",
    "APIBKEYLO_EL1",
    "APIBKEYHI_EL1",
    "APDAKEYLO_EL1",
    "APDAKEYHI_EL1",
    "APDBKEYLO_EL1",
    "APDBKEYHI_EL1",
    "APGAKEYLO_EL1",
    "APGAKEYHI_EL1",
    "FPCR",
    "FPSR",
    "CNTV_CVAL_EL0",
    "CNTV_CTL_EL0",
    "ICH_VMCR_EL2",
    "ICH_AP0R0_EL2",
    "ICH_AP1R0_EL2",
    "ICH_LR0_EL2",
    "ICH_LR1_EL2",
    "ICH_LR2_EL2",
    "ICH_LR3_EL2",
    "ICH_HCR_EL2",
];

/// Index of CNTV_CTL_EL0 in [`VcpuState::sys`].
pub const SYS_CNTV_CTL: usize = 37;

/// A stopped vCPU's registers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VcpuState {
    /// x0..x30.
    pub x: [u64; 31],
    /// The PC (ELR_EL2 at the stop).
    pub pc: u64,
    /// PSTATE (SPSR_EL2 at the stop).
    pub pstate: u64,
    /// The registers of [`SYSREG_NAMES`].
    pub sys: [u64; SYSREG_NAMES.len()],
    /// The guest's virtual count when it stopped.
    pub cntvct: u64,
    /// The physical count then (source machine's).
    pub cntpct: u64,
    /// q0..q31.
    pub q: [u128; 32],
}

impl VcpuState {
    /// Reads the state the stub stored at ACT_SAVE.
    pub fn read(mbox: &Mailbox<'_>) -> VcpuState {
        let r = |off: u64| mbox.read(AREA + off);
        VcpuState {
            x: std::array::from_fn(|i| r(8 * i as u64)),
            pc: r(ST_ELR),
            pstate: r(ST_SPSR),
            sys: std::array::from_fn(|i| r(ST_SYS + 8 * i as u64)),
            cntvct: r(ST_CNTVCT),
            cntpct: r(ST_CNTPCT),
            q: std::array::from_fn(|i| {
                let o = ST_FP + 16 * i as u64;
                u128::from(r(o)) | u128::from(r(o + 8)) << 64
            }),
        }
    }

    /// Writes the state for the STATE command, and clears the mark the
    /// stub sets at its ERET.
    pub fn write(&self, mbox: &Mailbox<'_>) {
        let w = |off: u64, v: u64| mbox.write(AREA + off, v);
        for (i, v) in self.x.iter().enumerate() {
            w(8 * i as u64, *v);
        }
        w(ST_ELR, self.pc);
        w(ST_SPSR, self.pstate);
        for (i, v) in self.sys.iter().enumerate() {
            w(ST_SYS + 8 * i as u64, *v);
        }
        w(ST_CNTVCT, self.cntvct);
        w(ST_CNTPCT, 0);
        for (i, v) in self.q.iter().enumerate() {
            let o = ST_FP + 16 * i as u64;
            w(o, *v as u64);
            w(o + 8, (*v >> 64) as u64);
        }
    }

    /// CNTPCT at the restored vCPU's ERET, 0 until then.
    pub fn entered_at(mbox: &Mailbox<'_>) -> u64 {
        mbox.read(AREA + ST_CNTPCT)
    }

    /// Clears the mark [`VcpuState::entered_at`] reads.
    pub fn clear_entered(mbox: &Mailbox<'_>) {
        mbox.write(AREA + ST_CNTPCT, 0);
    }

    /// Whether the stub can load this state: PSTATE must resume AArch64
    /// EL1 or EL0, and the EL2 interrupt registers must hold what a
    /// running vCPU's do.
    ///
    /// # Errors
    /// What is wrong, named.
    pub fn check(&self) -> Result<(), String> {
        // M[4] = 0 (AArch64), M[3:0] one of EL0t, EL1t, EL1h.
        if self.pstate & 0x10 != 0 || !matches!(self.pstate & 0xf, 0 | 4 | 5) {
            return Err(format!(
                "PSTATE {:#x} is not AArch64 EL0 or EL1",
                self.pstate
            ));
        }
        self.check_ich()
    }

    /// The EL2 interrupt registers the stub loads as they are: list
    /// registers and ICH_HCR_EL2 are written only by EL2 (the host's
    /// [`crate::linux::gic::Gic::sync_lrs`] and the hardware), so a state that
    /// holds what neither writes did not come from a running vCPU. A
    /// list register with HW set would have the guest's EOI deactivate a
    /// physical interrupt of the machine the stub runs on; control bits
    /// beyond En and UIE (TALL0/1, TC, TDIR, TSEI, VGrp*IE, ...) would
    /// trap or signal what the host never asked for.
    fn check_ich(&self) -> Result<(), String> {
        let hcr = self.sys[SYS_ICH_HCR];
        if hcr & !ICH_HCR_SAVED != 0 {
            return Err(format!(
                "ICH_HCR_EL2 {hcr:#x} has bits beyond En, UIE and EOIcount"
            ));
        }
        for (i, &lr) in self.sys[SYS_ICH_LR0..SYS_ICH_LR0 + NR_LRS]
            .iter()
            .enumerate()
        {
            if lr & LR_STATE_MASK == 0 {
                continue;
            }
            if lr & LR_HW != 0 || lr & 0xffff_ffff >= u64::from(NR_IRQS) {
                return Err(format!(
                    "ICH_LR{i}_EL2 {lr:#x}: a hardware interrupt or an INTID >= {NR_IRQS}"
                ));
            }
        }
        Ok(())
    }
}

/// Index of ICH_LR0_EL2 in [`VcpuState::sys`].
pub const SYS_ICH_LR0: usize = 41;
/// Index of ICH_HCR_EL2 in [`VcpuState::sys`].
pub const SYS_ICH_HCR: usize = 45;
/// The ICH_HCR_EL2 bits a saved vCPU may hold: En and UIE (the host
/// sets them) and EOIcount (the hardware counts the guest's EOIs).
const ICH_HCR_SAVED: u64 = ICH_HCR_EN | ICH_HCR_UIE | 0x1f << 27;

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> VcpuState {
        let mut s = VcpuState {
            x: [0; 31],
            pc: 0x4020_0000,
            pstate: 5,
            sys: [0; SYSREG_NAMES.len()],
            cntvct: 1,
            cntpct: 2,
            q: [0; 32],
        };
        s.sys[SYS_ICH_HCR] = ICH_HCR_EN | 3 << 27;
        s.sys[SYS_ICH_LR0 + 1] = 1 << 62 | 1 << 60 | 0xa0 << 48 | 33;
        s
    }

    #[test]
    fn names_match_the_indices() {
        assert_eq!(SYSREG_NAMES[SYS_ICH_LR0], "ICH_LR0_EL2");
        assert_eq!(SYSREG_NAMES[SYS_ICH_HCR], "ICH_HCR_EL2");
        assert_eq!(SYSREG_NAMES[SYS_CNTV_CTL], "CNTV_CTL_EL0");
    }

    #[test]
    fn el2_interrupt_registers_no_running_vcpu_holds_are_refused() {
        let good = state();
        assert_eq!(good.check(), Ok(()));
        let mut hw = good.clone();
        hw.sys[SYS_ICH_LR0 + 2] = 1 << 62 | LR_HW | 27 << 32 | 27;
        let mut big = good.clone();
        big.sys[SYS_ICH_LR0 + 3] = 1 << 62 | 1023;
        let mut tall = good.clone();
        tall.sys[SYS_ICH_HCR] |= 1 << 12; // TALL1
        let mut aarch32 = good.clone();
        aarch32.pstate = 0x10;
        let mut el2 = good.clone();
        el2.pstate = 9;
        for (bad, names) in [
            (hw, "ICH_LR2_EL2"),
            (big, "ICH_LR3_EL2"),
            (tall, "ICH_HCR_EL2"),
            (aarch32, "PSTATE"),
            (el2, "PSTATE"),
        ] {
            let e = bad.check().unwrap_err();
            assert!(e.contains(names), "{e}");
        }
        // An invalid list register's other bits are not looked at.
        let mut idle = good.clone();
        idle.sys[SYS_ICH_LR0] = LR_HW | 5000;
        assert_eq!(idle.check(), Ok(()));
    }
}
