//! The devices of one Linux VM and the bus that dispatches every exit
//! kind to the device that claims it ([`DeviceSet`]): the GIC (its two
//! frames and its SGI registers), the UART, the timer (its expiry's
//! interrupt) and PSCI (its calls over HVC), each behind
//! [`crate::linux::devices::device::Device`].

use crate::linux::bus::{BusError, MmioBus};
use crate::linux::devices::device::{
    CallDone, Claim, Conduit, Device, DeviceHost, DeviceState, SysReg, SysRegDone,
};
use crate::linux::devices::gic_frames::GicDevice;
use crate::linux::devices::no_address::Psci;
use crate::linux::devices::timer::VirtualTimer;
use crate::linux::devices::uart::UartDevice;
use crate::linux::gic::Gic;
use crate::linux::uart::Uart;
use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::sync::Arc;

/// The guest-physical places of the emulated devices.
#[derive(Clone, Copy, Debug)]
pub struct DeviceLayout {
    /// The distributor's base.
    pub gicd: u64,
    /// The first redistributor's base.
    pub gicr: u64,
    /// The 16550's base.
    pub uart: u64,
    /// The 16550's SPI number (INTID - 32).
    pub uart_spi: u32,
}

/// What a VM's vCPU threads reach besides its memory: every device, and
/// which of them takes each exit.
pub(crate) struct DeviceSet {
    /// The interrupt controller (also a device on the bus): the vCPU
    /// threads load its list registers and raise its interrupts.
    pub(crate) gic: Arc<Gic>,
    /// The MMIO ranges the devices claim: the GIC's frames and the UART.
    pub(crate) bus: MmioBus,
    /// The timer's offset, which every vCPU enters its guest with.
    pub(crate) timer: VirtualTimer,
    devices: Vec<Arc<dyn Device>>,
    sysregs: BTreeMap<SysReg, usize>,
    calls: Vec<(Conduit, RangeInclusive<u32>, usize)>,
    interrupts: BTreeMap<u32, usize>,
}

impl DeviceSet {
    /// `gic` (its distributor and redistributors at `layout`'s places),
    /// `uart` at its place, `timer` and PSCI, each on the bus.
    ///
    /// # Errors
    /// Ranges in `layout` that overlap or overflow ([`BusError`]).
    pub(crate) fn new(
        layout: DeviceLayout,
        gic: Gic,
        uart: Arc<Uart>,
        timer: VirtualTimer,
    ) -> Result<DeviceSet, BusError> {
        let gic = Arc::new(gic);
        let mut set = DeviceSet {
            gic: gic.clone(),
            bus: MmioBus::new(),
            timer,
            devices: Vec::new(),
            sysregs: BTreeMap::new(),
            calls: Vec::new(),
            interrupts: BTreeMap::new(),
        };
        let (gicd, gicr) = (layout.gicd, layout.gicr);
        set.attach(Arc::new(GicDevice { gic, gicd, gicr }))?;
        let base = layout.uart;
        set.attach(Arc::new(UartDevice { uart, base }))?;
        set.attach(Arc::new(timer))?;
        set.attach(Arc::new(Psci))?;
        Ok(set)
    }

    /// Puts `dev` on the bus for every exit it claims.
    ///
    /// # Errors
    /// A claim another device holds, or an MMIO range that overlaps or
    /// overflows; the device's earlier claims stay.
    pub(crate) fn attach(&mut self, dev: Arc<dyn Device>) -> Result<(), BusError> {
        let at = self.devices.len();
        let name = dev.name();
        let taken = |what: String, by: usize| BusError::Claimed {
            name: name.to_string(),
            what,
            existing: self.devices[by].name().to_string(),
        };
        for c in dev.claims() {
            match c {
                Claim::Mmio {
                    range,
                    base,
                    size,
                    regs,
                } => self.bus.insert(range, base, size, regs)?,
                Claim::SysReg(r) => {
                    if let Some(&by) = self.sysregs.get(&r) {
                        return Err(taken(format!("system register {r}"), by));
                    }
                    self.sysregs.insert(r, at);
                }
                Claim::Call { conduit, ids } => {
                    let clash = self.calls.iter().find(|(c, r, _)| {
                        *c == conduit && r.start() <= ids.end() && ids.start() <= r.end()
                    });
                    if let Some(&(_, _, by)) = clash {
                        let what = format!("{conduit:?} calls {ids:#x?}");
                        return Err(taken(what, by));
                    }
                    self.calls.push((conduit, ids, at));
                }
                Claim::Interrupt(i) => {
                    if let Some(&by) = self.interrupts.get(&i) {
                        return Err(taken(format!("interrupt {i}"), by));
                    }
                    self.interrupts.insert(i, at);
                }
            }
        }
        self.devices.push(dev);
        Ok(())
    }

    /// vCPU `vcpu`'s access to system register `reg` (`write` for an MSR):
    /// `None` when no device claims it.
    pub(crate) fn sysreg(
        &self,
        vcpu: usize,
        reg: SysReg,
        write: Option<u64>,
    ) -> Option<SysRegDone> {
        let &d = self.sysregs.get(&reg)?;
        Some(self.devices[d].sysreg(vcpu, reg, write))
    }

    /// vCPU `vcpu`'s SMCCC call over `conduit` with `x0..x3`: `None` when
    /// no device claims its function ID (W0).
    pub(crate) fn call(
        &self,
        conduit: Conduit,
        vcpu: usize,
        x: [u64; 4],
        host: &DeviceHost,
    ) -> Option<CallDone> {
        let id = x[0] as u32;
        let &(_, _, d) = self
            .calls
            .iter()
            .find(|(c, r, _)| *c == conduit && r.contains(&id))?;
        Some(self.devices[d].call(vcpu, x, host))
    }

    /// The physical interrupt `intid` ended vCPU `vcpu`'s run: the
    /// interrupt the device that claims it asks for is made pending for
    /// the vCPU at the GIC (any other interrupt is only a kick).
    pub(crate) fn interrupt(&self, vcpu: usize, intid: u32) {
        let Some(&d) = self.interrupts.get(&intid) else {
            return;
        };
        if let Some(ppi) = self.devices[d].interrupt(intid) {
            self.gic.raise(vcpu, ppi);
        }
    }

    /// Every device's state, each as it reads it out (`vcts`: the virtual
    /// counts the paused vCPUs saw).
    pub(crate) fn save(&self, vcts: &[u64]) -> Vec<DeviceState> {
        self.devices.iter().map(|d| d.save(vcts)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linux::bus::{Served, UnclaimedReason};
    use crate::linux::gic::GICR_STRIDE;
    use crate::linux::uart::UartOutput;

    const VIRT: DeviceLayout = DeviceLayout {
        gicd: 0x800_0000,
        gicr: 0x80a_0000,
        uart: 0x900_0000,
        uart_spi: 1,
    };

    fn uart() -> Arc<Uart> {
        Arc::new(Uart::new(Arc::new(|| {}), UartOutput::Discard))
    }

    #[test]
    fn the_gic_frames_and_the_uart_answer_on_the_bus() {
        let d = DeviceSet::new(VIRT, Gic::new(2), uart(), VirtualTimer::new()).unwrap();
        let gicr = VIRT.gicr;
        // GICR_TYPER's processor number of vCPU 1, through the bus.
        let r = d.bus.access(gicr + GICR_STRIDE + 0x0c, 4, None).unwrap();
        assert_eq!(r, (1, Served::Interrupts));
        // Past the last redistributor: nothing there.
        let e = d.bus.access(gicr + 2 * GICR_STRIDE, 4, None).unwrap_err();
        assert_eq!(e.reason, UnclaimedReason::NoDevice);
        // A distributor write reaches the GIC: EnableGrp1 reads back,
        // with DS and ARE, and only the access's bytes come back.
        d.bus.access(VIRT.gicd, 4, Some(2)).unwrap();
        assert_eq!(d.gic.state().dist.ctlr, 2);
        assert_eq!(d.bus.access(VIRT.gicd, 1, None).unwrap().0, 0x52);
        // The UART's scratch register: a plain device.
        d.bus.access(VIRT.uart + 7, 1, Some(0x5a)).unwrap();
        assert_eq!(
            d.bus.access(VIRT.uart + 7, 1, None).unwrap(),
            (0x5a, Served::Plain)
        );
    }

    #[test]
    fn frames_that_overlap_or_leave_the_address_space_are_refused() {
        let top = DeviceLayout {
            gicd: u64::MAX - 0xffff,
            ..VIRT
        };
        let e = DeviceSet::new(top, Gic::new(1), uart(), VirtualTimer::new()).err();
        assert!(matches!(e, Some(BusError::RangeOverflow { .. })), "{e:?}");
        let over = DeviceLayout {
            uart: VIRT.gicr + 0x100,
            ..VIRT
        };
        let e = DeviceSet::new(over, Gic::new(1), uart(), VirtualTimer::new()).err();
        assert!(matches!(e, Some(BusError::Overlap { .. })), "{e:?}");
        let d = DeviceSet::new(VIRT, Gic::new(1), uart(), VirtualTimer::new()).unwrap();
        for (addr, size) in [(u64::MAX - 3, 8), (u64::MAX, 1), (VIRT.gicd + 0xfffc, 8)] {
            assert!(d.bus.access(addr, size, None).is_err(), "{addr:#x}+{size}");
        }
        assert_eq!(
            d.bus.access(VIRT.gicd, 3, None).unwrap_err().reason,
            UnclaimedReason::BadWidth
        );
    }

    /// A VM of `n` vCPUs whose power states PSCI reads: all on.
    struct AllOn(usize);

    impl crate::linux::psci::PowerControl for AllOn {
        fn vcpus(&self) -> usize {
            self.0
        }
        fn cpu_on(&self, _: u64, _: u64, _: u64) -> i64 {
            crate::linux::psci::RET_ALREADY_ON
        }
        fn power(&self, _: usize) -> crate::linux::psci::PowerState {
            crate::linux::psci::PowerState::On
        }
        fn cpu_off(&self, _: usize) {}
        fn system_off(&self, _: bool) {}
    }

    #[test]
    fn every_exit_kind_reaches_the_device_that_claims_it() {
        use crate::linux::psci;
        use crate::linux::timer::VTIMER_INTID;
        let d = DeviceSet::new(VIRT, Gic::new(2), uart(), VirtualTimer::new()).unwrap();
        let host = AllOn(2);
        // PSCI over HVC; W0 alone names the function.
        let v = d.call(
            Conduit::Hvc,
            0,
            [u64::from(psci::VERSION) | 1 << 32, 0, 0, 0],
            &host,
        );
        assert_eq!(v, Some(CallDone::Resume(psci::VERSION_1_1)));
        let aff = [u64::from(psci::AFFINITY_INFO), 1, 0, 0];
        assert_eq!(
            d.call(Conduit::Hvc, 0, aff, &host),
            Some(CallDone::Resume(0))
        );
        // Another service's call, or PSCI over SMC: no device takes it.
        assert_eq!(d.call(Conduit::Hvc, 0, [0x8600_0000, 0, 0, 0], &host), None);
        assert_eq!(
            d.call(Conduit::Smc, 0, [u64::from(psci::VERSION), 0, 0, 0], &host),
            None
        );
        // The timer's expiry makes its PPI pending for that vCPU only;
        // another interrupt is only a kick.
        d.interrupt(1, VTIMER_INTID);
        d.interrupt(0, 30);
        let gic = d.save(&[]).into_iter().find_map(|s| match s {
            DeviceState::Gic(g) => Some(g),
            _ => None,
        });
        let gic = gic.expect("the GIC saves its state");
        assert_eq!(gic.redists[1].pending, 1 << VTIMER_INTID);
        assert_eq!(gic.redists[0].pending, 0);
        // ICC_SGI1R_EL1 reaches the GIC; another register no device.
        let sgi1r = SysReg::new(3, 0, 12, 11, 5);
        let done = d.sysreg(0, sgi1r, Some(1 << 40 | 3 << 24)).unwrap();
        assert_eq!((done.value, done.raised), (0, vec![1]));
        assert!(d.sysreg(0, SysReg::new(3, 0, 12, 12, 5), Some(1)).is_none());
    }

    #[test]
    fn a_claim_another_device_holds_is_refused_and_each_device_saves_its_state() {
        let mut d = DeviceSet::new(VIRT, Gic::new(1), uart(), VirtualTimer::new()).unwrap();
        let e = d.attach(Arc::new(Psci)).unwrap_err();
        assert!(
            matches!(&e, BusError::Claimed { existing, .. } if existing == "PSCI"),
            "{e}"
        );
        let e = d.attach(Arc::new(VirtualTimer::new())).unwrap_err();
        assert!(e.to_string().contains("interrupt 27"), "{e}");
        let t = VirtualTimer::new();
        let kinds: Vec<&str> = d
            .save(&[5, 9])
            .iter()
            .map(|s| match s {
                DeviceState::Gic(_) => "gic",
                DeviceState::Uart(_) => "uart",
                DeviceState::Timer(v) => {
                    assert_eq!(*v, t.save([5, 9].into_iter()));
                    "timer"
                }
                DeviceState::Stateless => "none",
            })
            .collect();
        assert_eq!(kinds, ["gic", "uart", "timer", "none"]);
    }
}
