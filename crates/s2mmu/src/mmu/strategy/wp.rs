//! Write protection into bitmaps ([`DirtyMode::Bitmap`]): the first write
//! to a protected page faults and the fault marks the slot's bitmap; every
//! behaviour is [`DirtyStrategy`]'s default.

use super::*;

/// The write-protection strategy.
pub(in crate::mmu) struct WriteProtect {
    pub(in crate::mmu) protect: Protect,
}

impl<P: Platform> DirtyStrategy<P> for WriteProtect {
    fn protect(&self) -> Option<Protect> {
        Some(self.protect)
    }
}
