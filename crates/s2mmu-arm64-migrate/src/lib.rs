//! The arm64 model's Linux guest ([`s2mmu_arm64::linux::migrate::LinuxVm`])
//! behind the migration library's session (`s2mmu_migrate::session`): what
//! joins the two crates, so that the platform crate knows nothing of
//! migration and the library nothing of arm64.
//!
//! - [`session_source`] and [`session_dest`]: the VM as the session's
//!   source and destination, over any connection (TLS by default in the
//!   CLI); [`session_postcopy`] what a post-copy destination reports in
//!   FINAL and the source's check of it;
//! - [`session_run`]: a whole run of `s2mmu migrate --guest linux`: boot,
//!   migrate, check that the guest went on ([`run_error`] why it failed);
//! - [`state`]: the VM's state in the migration encoding (a STATE body);
//!   [`ram`]: its guest RAM as the session's `GuestRam`;
//! - [`console_gap`]: the guest's console across a migration, and its
//!   largest gap.
//!
//! A migration between two machines in one process (QEMU, the EL2 image
//! and the Linux guest's packages needed, so not run here):
//!
//! ```no_run
//! use s2mmu_arm64_migrate::session_run::{self, RunSettings};
//!
//! fn run(settings: &RunSettings) {
//!     let cfg = session_run::linux_config(settings, &settings_assets());
//!     match session_run::migrate_once(settings, &cfg) {
//!         Ok(run) => println!("downtime {:?}", run.downtime),
//!         Err(e) => eprintln!("{e}"),
//!     }
//! }
//! # fn settings_assets() -> s2mmu_arm64::linux::assets::LinuxAssets { unimplemented!() }
//! # let _ = run;
//! ```

pub mod console_gap;
mod console_watch;
mod fault_hook;
pub mod ram;
pub mod run_error;
mod run_figures;
pub mod session_dest;
pub mod session_postcopy;
pub mod session_run;
pub mod session_source;
mod source_resume;
pub mod state;
