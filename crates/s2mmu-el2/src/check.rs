//! The argument checks of the command interface: pure functions over the
//! machine's [`Layout`], the same on every target, so the host's tests
//! exercise exactly what EL2 runs.
//!
//! Each check answers the first rule a request breaks, in a fixed order
//! (documented per function), so a test can expect the exact code.

use crate::abi::HypError;

/// Bytes in a page (the 4 KiB granule).
pub const PAGE: u64 = 4096;
/// The IPA space of the VM's stage 2, in bits.
pub const IPA_BITS: u32 = 40;

/// `[base, base + size)` of physical or guest-physical memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// First byte.
    pub base: u64,
    /// Length in bytes.
    pub size: u64,
}

impl Region {
    /// `[base, base + size)`.
    pub const fn new(base: u64, size: u64) -> Self {
        Region { base, size }
    }

    /// One past the last byte, or `None` if it wraps.
    pub fn end(&self) -> Option<u64> {
        self.base.checked_add(self.size)
    }

    /// Whether `[base, base + size)` (not wrapping) lies inside.
    pub fn contains(&self, base: u64, size: u64) -> bool {
        match (self.end(), base.checked_add(size)) {
            (Some(e), Some(end)) => base >= self.base && end <= e,
            _ => false,
        }
    }

    /// Whether `[base, base + size)` shares a byte with this region (a
    /// range that wraps counts as reaching the top of memory).
    pub fn overlaps(&self, base: u64, size: u64) -> bool {
        if size == 0 || self.size == 0 {
            return false;
        }
        let end = base.saturating_add(size);
        let my_end = self.base.saturating_add(self.size);
        base < my_end && self.base < end
    }
}

/// The machine as EL2 sees it.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// EL2's own memory: its image, stacks, heap and table pages. No guest
    /// stage-2 entry may map any of it.
    pub carve_out: Region,
    /// The RAM guest memory may be backed by.
    pub ram: Region,
    /// The area shared with the host: every buffer a command names lies
    /// inside it.
    pub shared: Region,
    /// Where EL2 reaches the shared area.
    pub shared_va: *mut u8,
    /// Where EL2 reaches `ram` (it copies a page the host remaps).
    pub ram_va: *mut u8,
}

impl Layout {
    /// Checks the layout itself: the shared area page aligned, nothing
    /// wrapping, the shared area outside the carve-out.
    ///
    /// # Errors
    /// [`HypError::Misaligned`], [`HypError::Overflow`],
    /// [`HypError::CarveOut`].
    pub fn validate(&self) -> Result<(), HypError> {
        if !self.shared.base.is_multiple_of(PAGE)
            || !(self.shared_va as usize).is_multiple_of(PAGE as usize)
        {
            return Err(HypError::Misaligned);
        }
        for r in [self.carve_out, self.ram, self.shared] {
            r.end().ok_or(HypError::Overflow)?;
        }
        if self.carve_out.overlaps(self.shared.base, self.shared.size) {
            return Err(HypError::CarveOut);
        }
        Ok(())
    }

    /// Checks a range of backing memory a guest mapping would reach, in
    /// this order: size zero or not whole pages ([`HypError::BadSize`]),
    /// base not page aligned ([`HypError::Misaligned`]), wrapping
    /// ([`HypError::Overflow`]), touching the carve-out
    /// ([`HypError::CarveOut`]), outside RAM ([`HypError::NotRam`]).
    ///
    /// # Errors
    /// As listed.
    pub fn check_backing(&self, base: u64, size: u64) -> Result<(), HypError> {
        pages(base, size)?;
        if self.carve_out.overlaps(base, size) {
            return Err(HypError::CarveOut);
        }
        if !self.ram.contains(base, size) {
            return Err(HypError::NotRam);
        }
        Ok(())
    }

    /// Checks a buffer in shared memory of `bytes` bytes at `pa` that must
    /// hold `need` bytes, in this order: `pa` not 8-byte aligned
    /// ([`HypError::Misaligned`]), `bytes < need` ([`HypError::TooSmall`]),
    /// wrapping ([`HypError::Overflow`]), not inside the shared area
    /// ([`HypError::OutsideShared`]). Returns the buffer's offset in the
    /// shared area.
    ///
    /// # Errors
    /// As listed.
    pub fn check_shared(&self, pa: u64, bytes: u64, need: u64) -> Result<usize, HypError> {
        if !pa.is_multiple_of(8) {
            return Err(HypError::Misaligned);
        }
        if bytes < need {
            return Err(HypError::TooSmall);
        }
        pa.checked_add(need).ok_or(HypError::Overflow)?;
        if !self.shared.contains(pa, need) {
            return Err(HypError::OutsideShared);
        }
        usize::try_from(pa - self.shared.base).map_err(|_| HypError::OutsideShared)
    }
}

/// Checks a page range, in this order: size zero or not whole pages
/// ([`HypError::BadSize`]), base not page aligned
/// ([`HypError::Misaligned`]), wrapping ([`HypError::Overflow`]). Returns
/// its end.
///
/// # Errors
/// As listed.
pub fn pages(base: u64, size: u64) -> Result<u64, HypError> {
    if size == 0 || !size.is_multiple_of(PAGE) {
        return Err(HypError::BadSize);
    }
    if !base.is_multiple_of(PAGE) {
        return Err(HypError::Misaligned);
    }
    base.checked_add(size).ok_or(HypError::Overflow)
}

/// Checks a guest range as [`pages`] does, and that it ends inside the
/// IPA space ([`HypError::Overflow`]).
///
/// # Errors
/// As [`pages`].
pub fn guest_range(ipa: u64, size: u64) -> Result<u64, HypError> {
    let end = pages(ipa, size)?;
    if end > 1 << IPA_BITS {
        return Err(HypError::Overflow);
    }
    Ok(end)
}

/// Bytes of a bitmap with one bit per page of `npages` pages, in whole
/// 64-bit words.
pub fn bitmap_bytes(npages: u64) -> u64 {
    npages.div_ceil(64) * 8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_overlap_and_contain_without_wrapping() {
        let r = Region::new(0x1000, 0x2000);
        assert!(r.overlaps(0x2fff, 1));
        assert!(!r.overlaps(0x3000, 1));
        assert!(!r.overlaps(0, 0x1000));
        let top = Region::new(u64::MAX - 0xfff, 0x1000);
        assert!(
            top.overlaps(u64::MAX - 10, 100),
            "a wrapping range reaches the top"
        );
        assert!(
            !r.overlaps(u64::MAX - 10, 100),
            "and does not wrap to the bottom"
        );
        assert!(r.contains(0x1000, 0x2000));
        assert!(!r.contains(0x1000, 0x2001));
        assert!(!r.contains(u64::MAX, 2));
    }

    #[test]
    fn page_ranges_are_checked_in_order() {
        assert_eq!(pages(0x1000, 0), Err(HypError::BadSize));
        assert_eq!(pages(0x1001, 0x1001), Err(HypError::BadSize));
        assert_eq!(pages(0x1001, 0x1000), Err(HypError::Misaligned));
        assert_eq!(pages(!0xfff, 0x2000), Err(HypError::Overflow));
        assert_eq!(guest_range(1 << 40, 0x1000), Err(HypError::Overflow));
        assert_eq!(guest_range((1 << 40) - 0x1000, 0x1000), Ok(1 << 40));
        assert_eq!(bitmap_bytes(1), 8);
        assert_eq!(bitmap_bytes(65), 16);
    }
}
