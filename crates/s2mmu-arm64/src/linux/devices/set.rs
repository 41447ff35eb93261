//! The devices of one Linux VM, as its vCPU threads reach them: the GIC
//! (whose frames sit on the bus beside the UART), the bus and the timer. PSCI is no device here: an HVC has no address, so the
//! vCPU loop serves it through [`crate::linux::psci::PowerControl`],
//! the machine's power states.

use crate::linux::bus::{BusError, MmioBus};
use crate::linux::devices::gic_frames::{GicDistributor, GicRedistributors};
use crate::linux::devices::timer::VirtualTimer;
use crate::linux::gic::Gic;
use crate::linux::uart::{Uart, UART_REGS};
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

/// What a VM's vCPU threads reach besides its memory.
pub(crate) struct DeviceSet {
    /// The interrupt controller, also on the bus (its two frames).
    pub(crate) gic: Arc<Gic>,
    /// Every MMIO device, at its place in the layout: the GIC's frames
    /// and the UART.
    pub(crate) bus: MmioBus,
    /// The timer's offset and interrupt.
    pub(crate) timer: VirtualTimer,
}

impl DeviceSet {
    /// `gic`'s distributor and redistributors and `uart` on a bus at
    /// `layout`'s places, with `timer`.
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
        let mut bus = MmioBus::new();
        let dist = GicDistributor(gic.clone());
        bus.insert("GIC distributor", layout.gicd, dist.size(), Arc::new(dist))?;
        let redist = GicRedistributors(gic.clone());
        let size = redist.size();
        bus.insert("GIC redistributors", layout.gicr, size, Arc::new(redist))?;
        bus.insert("uart", layout.uart, UART_REGS, uart)?;
        Ok(DeviceSet { gic, bus, timer })
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
}
