//! Limits and page geometry of a memslot store.

/// Page shift of the 4 KiB granule, the default.
pub const PAGE_SHIFT_4K: u32 = 12;

/// KVM's `KVM_MEM_SLOTS_NUM` (`SHRT_MAX`): slot ids 0..32766 exist in total.
pub const KVM_MEM_SLOTS_NUM: u16 = 32767;

/// KVM's `KVM_USER_MEM_SLOTS` on x86 (`KVM_MEM_SLOTS_NUM` minus 3 internal slots), the default.
pub const KVM_USER_MEM_SLOTS: u16 = 32764;

/// KVM's `KVM_MEM_MAX_NR_PAGES`: the largest user slot, in pages.
///
/// The limit exists in KVM because dirty-bitmap operations index pages with 32-bit integers;
/// it is kept so that the dirty-logging work can rely on it.
pub const KVM_MEM_MAX_NR_PAGES: u64 = (1 << 31) - 1;

/// Limits and page geometry of a memslot store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemslotConfig {
    /// log2 of the page size: 12 for 4 KiB, 14 for 16 KiB, 16 for 64 KiB.
    pub page_shift: u32,
    /// Number of user slot ids; ids `0..max_user_slots` are accepted.
    pub max_user_slots: u16,
    /// Largest slot size in pages.
    pub max_npages: u64,
}

impl MemslotConfig {
    /// Page size in bytes.
    pub const fn page_size(&self) -> u64 {
        1u64 << self.page_shift
    }
}

impl Default for MemslotConfig {
    fn default() -> Self {
        Self {
            page_shift: PAGE_SHIFT_4K,
            max_user_slots: KVM_USER_MEM_SLOTS,
            max_npages: KVM_MEM_MAX_NR_PAGES,
        }
    }
}
