//! A KVM guest's RAM for the migration library: one host mapping per
//! region ([`GuestMemory`]), described by [`RamRegions`].

use crate::memory::{Backing, GuestMemory};
use crate::Error;
use s2mmu_migrate::vm::{GuestRam, RamRegion, RamRegions};

/// Guest RAM of several regions, each its own mapping, owned here.
#[derive(Debug)]
pub struct KvmRam {
    maps: Vec<GuestMemory>,
    regions: RamRegions,
}

impl KvmRam {
    /// Maps one region per `(gpa, size)` of `layout` with `backing`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming what [`RamRegions::new`] refused
    /// (overlap, alignment, count, size; checked before anything is
    /// mapped); the mapping's error.
    pub fn new(layout: &[(u64, u64)], backing: Backing) -> Result<KvmRam, Error> {
        // Checked first with a placeholder host address per region, so
        // nothing is mapped for a layout that cannot be used.
        let mut fake =
            Vec::with_capacity(layout.len().min(s2mmu_migrate::vm::regions::MAX_REGIONS));
        let mut host = 0u64;
        for &(gpa, size) in layout
            .iter()
            .take(s2mmu_migrate::vm::regions::MAX_REGIONS + 1)
        {
            fake.push(RamRegion {
                gpa,
                host_addr: host,
                size,
            });
            host = host
                .saturating_add(size.next_multiple_of(4096))
                .min(1 << 62);
        }
        RamRegions::new(&fake).map_err(|e| Error::invalid("regions", e.to_string()))?;
        let maps = layout
            .iter()
            .map(|&(_, size)| GuestMemory::new(size, backing))
            .collect::<Result<Vec<_>, _>>()?;
        let real: Vec<RamRegion> = layout
            .iter()
            .zip(&maps)
            .map(|(&(gpa, size), m)| RamRegion {
                gpa,
                host_addr: m.host_addr(),
                size,
            })
            .collect();
        let regions =
            RamRegions::new(&real).map_err(|e| Error::invalid("regions", e.to_string()))?;
        Ok(KvmRam { maps, regions })
    }

    /// The regions, in guest-physical order (the memslots' order).
    pub fn regions(&self) -> &RamRegions {
        &self.regions
    }

    /// Copies `data` to guest-physical `gpa` (inside one region).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when no region holds all of it.
    pub fn write_gpa(&self, gpa: u64, data: &[u8]) -> Result<(), Error> {
        let (map, off) = self.map_of(gpa, data.len() as u64)?;
        Ok(map.write_bytes(off, data)?)
    }

    /// The mapping holding `len` bytes at `gpa`, and the offset in it.
    fn map_of(&self, gpa: u64, len: u64) -> Result<(&GuestMemory, u64), Error> {
        let k = self
            .regions
            .regions()
            .iter()
            .position(|r| gpa >= r.gpa && gpa - r.gpa < r.size)
            .ok_or_else(|| Error::invalid("gpa", format!("{gpa:#x} is in no RAM region")))?;
        let r = self.regions.regions()[k];
        if gpa - r.gpa + len > r.size {
            return Err(Error::invalid(
                "gpa",
                format!("{len} bytes at {gpa:#x} leave their region"),
            ));
        }
        let map = self
            .maps
            .iter()
            .find(|m| m.host_addr() == r.host_addr)
            .ok_or_else(|| Error::invalid("gpa", "region without its mapping"))?;
        Ok((map, gpa - r.gpa))
    }

    /// A hash of every page of guest RAM, in RAM order (the migration's
    /// page numbering).
    pub fn page_hashes(&self) -> Vec<u64> {
        let pages = self.regions.size() / 4096;
        let mut out = Vec::with_capacity(pages as usize);
        let mut buf = vec![0u8; 4096];
        for p in 0..pages {
            let ok = self.read_into(p * 4096, &mut buf);
            out.push(if ok {
                s2mmu_migrate::hash::page_hash(&buf, p)
            } else {
                0
            });
        }
        out
    }
}

// SAFETY: every region of `regions` is one of `maps` (built from their
// host addresses and sizes, page-aligned mmaps that live as long as
// `self`), so `host_span` names mapped, writable, page-aligned bytes; the
// regions were checked not to overlap; GuestMemory's own accesses are
// atomic per word, and the guest's (KVM's vCPUs) are its CPU's aligned
// loads and stores.
unsafe impl GuestRam for KvmRam {
    fn size(&self) -> u64 {
        self.regions.size()
    }
    fn host_span(&self, offset: u64) -> Option<(u64, u64)> {
        self.regions.host_span(offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_mapped_and_numbered_in_guest_physical_order() {
        let ram = KvmRam::new(&[(1 << 32, 2 << 20), (0, 1 << 20)], Backing::Anonymous).unwrap();
        assert_eq!(ram.size(), 3 << 20);
        let slots = ram.regions().slots();
        assert_eq!(
            (slots[0].gpa, slots[1].gpa, slots[1].mem_offset),
            (0, 1 << 32, 1 << 20)
        );
        ram.write_gpa((1 << 32) + 8, &7u64.to_le_bytes()).unwrap();
        let mut word = [0u8; 8];
        assert!(ram.read_into((1 << 20) + 8, &mut word));
        assert_eq!(u64::from_le_bytes(word), 7);
        assert!(
            ram.write_gpa((1 << 32) + (2 << 20) - 4, &[0u8; 8]).is_err(),
            "leaves the region"
        );
        assert!(ram.write_gpa(1 << 30, &[0u8; 8]).is_err(), "in the hole");
        assert_eq!(ram.page_hashes().len(), 768);
    }

    #[test]
    fn a_bad_layout_is_refused_before_anything_is_mapped() {
        let e = KvmRam::new(&[(0, 2 << 20), (1 << 20, 1 << 20)], Backing::Anonymous).unwrap_err();
        assert!(e.to_string().contains("overlap in guest-physical"), "{e}");
        let e = KvmRam::new(&[(0, 100)], Backing::Anonymous).unwrap_err();
        assert!(e.to_string().contains("size"), "{e}");
        // Far more than this host has: refused by the bound, not by mmap.
        let e = KvmRam::new(&[(0, 1 << 40)], Backing::Anonymous).unwrap_err();
        assert!(e.to_string().contains("at most"), "{e}");
        assert!(KvmRam::new(&[], Backing::Anonymous).is_err());
    }
}
