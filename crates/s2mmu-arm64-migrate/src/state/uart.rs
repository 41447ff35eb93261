//! The 16550's own state: vm-superio's `SerialState` (its registers and
//! receive FIFO) saved and loaded as one section's bytes.

use super::device::DeviceState;
use s2mmu_migrate::state::{Fields, StateError};
use vm_superio::serial::SerialState;

use s2mmu_arm64::linux::vm_state::UART_FIFO_BYTES as UART_FIFO;

impl DeviceState for SerialState {
    /// Appends the 16550's registers and its receive FIFO.
    fn save(&self, out: &mut Vec<u8>) {
        let s = self;
        out.extend_from_slice(&[
            s.baud_divisor_low,
            s.baud_divisor_high,
            s.interrupt_enable,
            s.interrupt_identification,
            s.line_control,
            s.line_status,
            s.modem_control,
            s.modem_status,
            s.scratch,
        ]);
        out.extend_from_slice(&(s.in_buffer.len() as u32).to_le_bytes());
        out.extend_from_slice(&s.in_buffer);
    }

    /// The registers and FIFO [`DeviceState::save`] wrote; a FIFO longer
    /// than the device's is refused.
    fn load(bytes: &[u8], _vcpus: usize, tag: u32) -> Result<SerialState, StateError> {
        let mut f = Fields::new(bytes, "UART");
        let r: [u8; 9] = f.array("the 16550's registers")?;
        let n = f.u32("the receive FIFO's length")? as usize;
        if n > UART_FIFO {
            return Err(StateError::BadSection {
                tag,
                what: format!("receive FIFO of {n} bytes, the device holds {UART_FIFO}"),
            });
        }
        let in_buffer = f.bytes(n, "the receive FIFO")?.to_vec();
        f.finish(tag)?;
        Ok(SerialState {
            baud_divisor_low: r[0],
            baud_divisor_high: r[1],
            interrupt_enable: r[2],
            interrupt_identification: r[3],
            line_control: r[4],
            line_status: r[5],
            modem_control: r[6],
            modem_status: r[7],
            scratch: r[8],
            in_buffer,
        })
    }
}
