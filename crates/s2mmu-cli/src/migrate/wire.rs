//! The migration stream ([`s2mmu_migrate::wire`]), and the simulated
//! guest's STATE body ([`super::guest_state`]).

pub use super::guest_state::GuestState;
pub use s2mmu_migrate::wire::*;
