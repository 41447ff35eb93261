//! Write protection into bitmaps ([`DirtyMode::Bitmap`](crate::mmu::DirtyMode::Bitmap)): the first write
//! to a protected page faults and the fault marks the slot's bitmap; every
//! behaviour is [`DirtyStrategy`]'s default.

use super::mode::DirtyStrategy;
use crate::mmu::policy::Protect;

/// The write-protection strategy.
pub(in crate::mmu) struct WriteProtect {
    pub(in crate::mmu) protect: Protect,
}

impl DirtyStrategy for WriteProtect {
    fn protect(&self) -> Option<Protect> {
        Some(self.protect)
    }
}
