//! Guest RAM as several regions, each a (guest-physical address, host
//! mapping, length) triple: [`RamRegions`] checks them and numbers their
//! pages. Guest RAM's offsets (and so page indices, which the stream's
//! channels and the destination's bitmaps count in) run over the regions
//! in guest-physical order, back to back: region `k` starts at the sum of
//! the sizes of the regions below it. The memslot of region `k`
//! ([`RamRegions::slots`]) has id `k` and that offset as its
//! [`RamSlot::mem_offset`], so the dirty log's bit `i` of slot `k` is page
//! `mem_offset / PAGE_SIZE + i` of guest RAM.

use std::fmt;

/// Bytes of one guest page as migration moves it.
pub const PAGE_SIZE: usize = 4096;

/// One memslot of guest RAM as the network session moves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RamSlot {
    /// The slot's id in the dirty log.
    pub id: u16,
    /// Guest-physical base.
    pub gpa: u64,
    /// Bytes.
    pub size: u64,
    /// Offset of its memory in guest RAM (`SessionVm::ram`).
    pub mem_offset: u64,
}

/// The most regions guest RAM may have (one memslot each; the stream's
/// own bound on memslots, `wire::MAX_SLOTS`, is the same).
pub const MAX_REGIONS: usize = 4096;

/// The most bytes all regions together may hold (the largest guest the
/// stream carries, `wire::MAX_MEM`, is the same).
pub const MAX_RAM: u64 = 64 << 30;

/// One region of guest RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RamRegion {
    /// Guest-physical address of its first byte.
    pub gpa: u64,
    /// Host virtual address of its first byte.
    pub host_addr: u64,
    /// Bytes.
    pub size: u64,
}

/// Why a set of regions was refused. Indices are positions in the slice
/// given to [`RamRegions::new`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegionError {
    /// No region at all.
    Empty,
    /// More regions than [`MAX_REGIONS`].
    TooMany {
        /// Regions given.
        count: usize,
        /// The bound.
        max: usize,
    },
    /// A field that is not a multiple of the page size.
    Unaligned {
        /// The region.
        index: usize,
        /// `gpa`, `host_addr` or `size`.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// A region of no bytes.
    ZeroSize {
        /// The region.
        index: usize,
    },
    /// A region whose end does not fit in 64 bits (`gpa` or `host_addr`
    /// plus `size`).
    Wraps {
        /// The region.
        index: usize,
        /// `gpa` or `host_addr`.
        field: &'static str,
    },
    /// More bytes in all than [`MAX_RAM`].
    TooLarge {
        /// Bytes given (saturated).
        total: u64,
        /// The bound.
        max: u64,
    },
    /// Two regions share guest-physical addresses.
    GuestOverlap {
        /// One region.
        first: usize,
        /// The other.
        second: usize,
    },
    /// Two regions share host memory.
    HostOverlap {
        /// One region.
        first: usize,
        /// The other.
        second: usize,
    },
}

impl fmt::Display for RegionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegionError::Empty => f.write_str("guest RAM needs at least one region"),
            RegionError::TooMany { count, max } => {
                write!(f, "{count} RAM regions, at most {max}")
            }
            RegionError::Unaligned {
                index,
                field,
                value,
            } => write!(
                f,
                "RAM region {index}: {field} {value:#x} is not a multiple of {PAGE_SIZE}"
            ),
            RegionError::ZeroSize { index } => write!(f, "RAM region {index} has no bytes"),
            RegionError::Wraps { index, field } => {
                write!(f, "RAM region {index}: {field} + size overflows")
            }
            RegionError::TooLarge { total, max } => {
                write!(f, "{total} bytes of guest RAM, at most {max}")
            }
            RegionError::GuestOverlap { first, second } => write!(
                f,
                "RAM regions {first} and {second} overlap in guest-physical addresses"
            ),
            RegionError::HostOverlap { first, second } => {
                write!(f, "RAM regions {first} and {second} overlap in host memory")
            }
        }
    }
}

impl std::error::Error for RegionError {}

/// Checked regions of guest RAM, in guest-physical order, with the RAM
/// offset of each and the memslots they make. A description only: it
/// maps nothing and owns no memory (a VMM's [`super::GuestRam`] holds one
/// beside its mappings and answers [`super::GuestRam::host_span`] with
/// [`RamRegions::host_span`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RamRegions {
    regions: Vec<RamRegion>,
    slots: Vec<RamSlot>,
    size: u64,
}

impl RamRegions {
    /// Checks `regions` (any order): at least one and at most
    /// [`MAX_REGIONS`]; every address and size a positive multiple of the
    /// page size; no end past 2^64; at most [`MAX_RAM`] bytes in all; no
    /// two sharing guest-physical addresses or host memory.
    ///
    /// # Errors
    /// The first [`RegionError`] found.
    pub fn new(regions: &[RamRegion]) -> Result<RamRegions, RegionError> {
        if regions.is_empty() {
            return Err(RegionError::Empty);
        }
        if regions.len() > MAX_REGIONS {
            return Err(RegionError::TooMany {
                count: regions.len(),
                max: MAX_REGIONS,
            });
        }
        let mut total = 0u64;
        for (index, r) in regions.iter().enumerate() {
            check_one(index, r)?;
            total = total.saturating_add(r.size);
        }
        if total > MAX_RAM {
            return Err(RegionError::TooLarge {
                total,
                max: MAX_RAM,
            });
        }
        let by_gpa = disjoint(regions, |r| r.gpa)
            .map_err(|(first, second)| RegionError::GuestOverlap { first, second })?;
        disjoint(regions, |r| r.host_addr)
            .map_err(|(first, second)| RegionError::HostOverlap { first, second })?;
        let mut offset = 0u64;
        let mut slots = Vec::with_capacity(regions.len());
        for (id, &i) in by_gpa.iter().enumerate() {
            let r = regions[i];
            slots.push(RamSlot {
                id: id as u16, // below MAX_REGIONS
                gpa: r.gpa,
                size: r.size,
                mem_offset: offset,
            });
            offset += r.size; // at most MAX_RAM in all
        }
        Ok(RamRegions {
            regions: by_gpa.iter().map(|&i| regions[i]).collect(),
            slots,
            size: total,
        })
    }

    /// One region: `size` bytes at guest-physical `gpa`, mapped at
    /// `host_addr`.
    ///
    /// # Errors
    /// As [`RamRegions::new`].
    pub fn single(gpa: u64, host_addr: u64, size: u64) -> Result<RamRegions, RegionError> {
        RamRegions::new(&[RamRegion {
            gpa,
            host_addr,
            size,
        }])
    }

    /// The regions, in guest-physical order.
    pub fn regions(&self) -> &[RamRegion] {
        &self.regions
    }

    /// The memslots, one per region in guest-physical order: id `k` for
    /// the `k`-th, its RAM offset as `mem_offset`.
    pub fn slots(&self) -> &[RamSlot] {
        &self.slots
    }

    /// Bytes of all regions together.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The index (in guest-physical order) of the region holding RAM
    /// offset `offset`.
    fn index_of_offset(&self, offset: u64) -> Option<usize> {
        if offset >= self.size {
            return None;
        }
        // The last slot starting at or below `offset`.
        Some(self.slots.partition_point(|s| s.mem_offset <= offset) - 1)
    }

    /// The RAM offset of guest-physical address `gpa`, if a region holds it.
    pub fn offset_of(&self, gpa: u64) -> Option<u64> {
        let k = self
            .slots
            .partition_point(|s| s.gpa <= gpa)
            .checked_sub(1)?;
        let s = &self.slots[k];
        (gpa - s.gpa < s.size).then(|| s.mem_offset + (gpa - s.gpa))
    }

    /// The guest-physical address of RAM offset `offset`.
    pub fn gpa_of(&self, offset: u64) -> Option<u64> {
        let s = &self.slots[self.index_of_offset(offset)?];
        Some(s.gpa + (offset - s.mem_offset))
    }

    /// The host address of RAM offset `offset` and the bytes mapped from
    /// there to its region's end; `None` past the last byte.
    pub fn host_span(&self, offset: u64) -> Option<(u64, u64)> {
        let k = self.index_of_offset(offset)?;
        let into = offset - self.slots[k].mem_offset;
        let r = &self.regions[k];
        Some((r.host_addr + into, r.size - into))
    }
}

/// One region's own checks.
fn check_one(index: usize, r: &RamRegion) -> Result<(), RegionError> {
    let page = PAGE_SIZE as u64;
    for (field, value) in [("gpa", r.gpa), ("host_addr", r.host_addr), ("size", r.size)] {
        if !value.is_multiple_of(page) {
            return Err(RegionError::Unaligned {
                index,
                field,
                value,
            });
        }
    }
    if r.size == 0 {
        return Err(RegionError::ZeroSize { index });
    }
    for (field, start) in [("gpa", r.gpa), ("host_addr", r.host_addr)] {
        if start.checked_add(r.size).is_none() {
            return Err(RegionError::Wraps { index, field });
        }
    }
    Ok(())
}

/// The indices of `regions` in the order of `start`, or the first two
/// (by `start`) whose ranges `[start, start + size)` overlap.
fn disjoint(
    regions: &[RamRegion],
    start: impl Fn(&RamRegion) -> u64,
) -> Result<Vec<usize>, (usize, usize)> {
    let mut order: Vec<usize> = (0..regions.len()).collect();
    order.sort_by_key(|&i| start(&regions[i]));
    for w in order.windows(2) {
        let (a, b) = (&regions[w[0]], &regions[w[1]]);
        // Ends were checked not to wrap.
        if start(a) + a.size > start(b) {
            return Err((w[0].min(w[1]), w[0].max(w[1])));
        }
    }
    Ok(order)
}
