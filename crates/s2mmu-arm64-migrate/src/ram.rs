//! A Linux VM's guest RAM ([`LinuxRam`]) as the migration library's
//! [`GuestRam`]: the session's sending threads read pages, and a
//! destination's stream writes them, straight through the mapping of the
//! file QEMU uses as its memory.

use s2mmu_arm64::linux::memory::LinuxRam;
use s2mmu_migrate::vm::GuestRam;
use std::ops::Deref;

/// [`LinuxRam`] behind the session's [`GuestRam`].
#[derive(Clone)]
pub struct LinuxGuestRam(LinuxRam);

impl LinuxGuestRam {
    /// `ram` as the session sees it.
    pub fn new(ram: LinuxRam) -> LinuxGuestRam {
        LinuxGuestRam(ram)
    }
}

impl Deref for LinuxGuestRam {
    type Target = LinuxRam;
    fn deref(&self) -> &LinuxRam {
        &self.0
    }
}

// SAFETY: `host_addr()..+size()` is the page-aligned mapping `LinuxRam`
// keeps alive as long as itself (checked in `LinuxRam::new`); the guest's
// accesses through QEMU are its CPUs' loads and stores (naturally aligned
// accesses of at most 8 bytes, single-copy atomic on the host), and
// s2mmu-arm64's own are atomic words or byte copies.
unsafe impl GuestRam for LinuxGuestRam {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn host_span(&self, offset: u64) -> Option<(u64, u64)> {
        let size = self.0.size();
        (offset < size).then(|| (self.0.host_addr() + offset, size - offset))
    }
    fn read_into(&self, offset: u64, out: &mut [u8]) -> bool {
        self.0.read_into(offset, out)
    }
    fn write_from(&self, offset: u64, data: &[u8]) -> bool {
        self.0.write_from(offset, data)
    }
}

#[cfg(test)]
mod tests {
    use s2mmu_arm64::linux::memory;
    use s2mmu_migrate::hash;

    /// A Linux VM's digests are compared with the stream's: the platform
    /// crate's page hash and digest must be the migration library's.
    #[test]
    fn the_vms_page_hash_and_digest_are_the_streams() {
        let mut page = vec![0u8; memory::PAGE];
        for (i, b) in page.iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        let mut hashes = Vec::new();
        for gpa in [0u64, 0x4000_0000, 0x4000_1000, !0xfff] {
            let h = memory::page_hash(&page, gpa);
            assert_eq!(h, hash::page_hash(&page, gpa), "gpa {gpa:#x}");
            hashes.push(h);
        }
        assert_eq!(memory::page_hash(&[], 5), hash::page_hash(&[], 5));
        // More hashes than one chunk of the stream's digest.
        hashes.extend((0..1500u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
        assert_eq!(memory::digest_of(&hashes), hash::digest_of(&hashes));
        assert_eq!(memory::digest_of(&[]), hash::digest_of(&[]));
    }
}
