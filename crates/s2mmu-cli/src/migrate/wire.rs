//! The migration stream ([`s2mmu_migrate::wire`]), and the simulated
//! guest's STATE body (`s2mmu_migrate::sim::state`).

pub use s2mmu_migrate::sim::state::GuestState;
pub use s2mmu_migrate::wire::*;
