//! The two devices with no address, on the bus by the other exits they
//! claim: the virtual timer (the physical interrupt of its expiry) and
//! PSCI (its SMCCC function IDs over HVC).

use crate::linux::devices::device::{CallDone, Claim, Conduit, Device, DeviceHost, DeviceState};
use crate::linux::devices::psci;
use crate::linux::devices::timer::{self, VirtualTimer};

/// SMCCC's bit of a 64-bit call.
const SMC64: u32 = 1 << 30;

/// The timer as the bus's device: it takes the physical interrupt of its
/// expiry, and saves the guest's count.
impl Device for VirtualTimer {
    fn name(&self) -> &'static str {
        "virtual timer"
    }

    fn claims(&self) -> Vec<Claim> {
        vec![Claim::Interrupt(timer::VTIMER_INTID)]
    }

    fn interrupt(&self, intid: u32) -> Option<u32> {
        VirtualTimer::interrupt(self, intid)
    }

    fn save(&self, vcts: &[u64]) -> DeviceState {
        DeviceState::Timer(VirtualTimer::save(self, vcts.iter().copied()))
    }
}

/// PSCI as the bus's device: the SMCCC function IDs PSCI owns (0x00 to
/// 0x1f of the standard service, 32- and 64-bit) over HVC, the conduit
/// the device tree names.
pub(crate) struct Psci;

impl Device for Psci {
    fn name(&self) -> &'static str {
        "PSCI"
    }

    fn claims(&self) -> Vec<Claim> {
        [psci::VERSION, psci::VERSION | SMC64]
            .into_iter()
            .map(|first| Claim::Call {
                conduit: Conduit::Hvc,
                ids: first..=first + 0x1f,
            })
            .collect()
    }

    fn call(&self, vcpu: usize, x: [u64; 4], host: &DeviceHost) -> CallDone {
        match psci::serve(x, vcpu, host) {
            psci::Served::Resume(x0) => CallDone::Resume(x0),
            psci::Served::Off => CallDone::Off,
        }
    }
}
