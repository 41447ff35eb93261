//! The Linux VM behind the migration library's session, and its vCPU and
//! device state in the migration encoding.

pub(crate) mod console_watch;
pub mod run_error;
pub mod session_dest;
pub mod session_postcopy;
pub mod session_run;
pub mod session_source;
pub mod vcpu_state;
pub mod vm_state;
