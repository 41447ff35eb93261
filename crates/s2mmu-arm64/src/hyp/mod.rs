//! The EL2 stub's host side: the QEMU process that runs it ([`machine`],
//! its pipes in `qemu_process`), the RAM this process shares with QEMU
//! ([`ram`], its file in `ram_file`, the engine's table pages in it:
//! [`arena`]), the mailbox format and guest-physical layout the two agree
//! on ([`layout`]), the doorbell a guest's exit rings (`doorbell`), the EL2
//! registers that install a table ([`stage2`]) and the TLB maintenance the
//! engine asks the stub for ([`tlbi`]).

pub mod arena;
pub(crate) mod doorbell;
pub mod layout;
pub mod machine;
pub(crate) mod qemu_process;
pub mod ram;
pub(crate) mod ram_file;
pub mod stage2;
pub mod tlbi;
