//! The VM's state as a migration or a snapshot carries it: each vCPU's
//! registers and the devices' state, as plain values.

pub mod vcpu_state;
pub mod vm_state;
