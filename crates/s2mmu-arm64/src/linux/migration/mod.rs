//! The Linux VM behind the migration library's session.

pub mod console_gap;
pub(crate) mod console_watch;
mod fault_hook;
pub mod run_error;
pub mod session_dest;
pub mod session_postcopy;
pub mod session_run;
pub mod session_source;
mod source_resume;
