//! The s2mmu engine placed at EL2, where a hypervisor keeps stage 2.
//!
//! This crate is `#![no_std]` and builds for `aarch64-unknown-none`. It
//! links the engine's [`s2mmu::mmu::Mmu`] facade (the engine without its
//! `std` feature) with an EL2 platform:
//!
//! - [`El2Platform`]: `spin`'s locks behind `lock_api`, the generic timer
//!   (`CNTVCT_EL0` / `CNTFRQ_EL0`) as the clock ([`GenericTimer`]);
//! - [`PagePool`]: stage-2 table pages from a carve-out of RAM that no
//!   guest mapping can reach, and [`heap`], the global allocator's heap over
//!   the same carve-out (`linked_list_allocator`);
//! - [`El2Tlb`]: the sink of the engine's arm64 TLB backend
//!   ([`El2Tlbi`]), executing its invalidation sequences on the CPU
//!   running the operation and counting them (`DSB ISHST`, `TLBI
//!   IPAS2LE1IS` with the level hint for a leaf, `IPAS2E1IS`, `RIPAS2E1IS`
//!   where the CPU has FEAT_TLBIRANGE, `VMALLS12E1IS` for the whole VMID,
//!   `DSB ISH`, `ISB`).
//!
//! Above the platform, [`Hyp`] is EL2's state for one VM and its command
//! interface, in the spirit of pKVM's host hypercalls: the host fills a
//! [`Command`] block ([`Op`] and arguments), EL2 checks every argument
//! against its [`Layout`] (the carve-out, the RAM a guest may be backed by,
//! the area shared with the host) and its own slot table before acting, and
//! answers with a result or an [`HypError`] code, its state unchanged.
//! [`Hyp::handle_abort`] answers a guest's stage-2 aborts on the faulting
//! CPU: a first touch maps from the memslot's backing, a write-protection
//! fault under logging marks the page dirty, and an abort outside every
//! slot (the carve-out included) is refused, never mapped.
//!
//! The checks and the engine calls are target-independent, so the host's
//! unit tests drive the same dispatcher with bad arguments; only the
//! instructions ([`tlb::cpu`], the timer and ID registers) are gated on
//! `target_arch = "aarch64"`. `image/` is a bare-metal EL2 program on this
//! crate that QEMU boots (`tests/qemu_image.rs`); `docs/el2.md` describes
//! what runs at EL2, the command interface and what is measured.
#![no_std]
#![warn(missing_docs)]
extern crate alloc;

pub mod abi;
pub mod abort;
pub mod check;
mod el2_host;
pub mod heap;
mod hyp;
mod hyp_dirty;
mod hyp_postcopy;
mod hyp_remap;
mod hyp_slots;
pub mod pace;
pub mod platform;
pub mod pool;
pub mod tlb;
pub mod trace;

pub use abi::{Command, Counters, HypError, LogMode, Op, RingEntry};
pub use abort::{AbortOutcome, Refusal, Stage2Abort};
pub use check::{Layout, Region};
pub use hyp::{El2Mmu, Hyp, SlotRecord, FLAG_LOG, FLAG_POSTCOPY, FLAG_READONLY, MAX_SLOTS};
pub use platform::{El2Platform, GenericTimer};
pub use pool::{PagePool, PoolMmOps};
pub use tlb::{El2Tlb, El2Tlbi, TlbiCounts};
