//! The checksums of the stream: XXH3-64 of every page, seeded with the
//! page's guest-physical address, and of every record, seeded with its
//! tag. A flipped bit or a page delivered to the wrong address is caught.
//! These checksums detect damage, not attacks: a peer is authenticated by
//! TLS ([`crate::transport`]).
//!
//! The hashing is `twox-hash`'s, which chooses AVX2 at run time where the
//! CPU has it (SSE2, NEON or portable code elsewhere); the values are
//! XXH3-64's, the same as `xxhash-rust`'s (which the rest of the crate
//! still uses for its files: it picks its SIMD at compile time, SSE2 only
//! for the default x86-64 target, which cost a 4 KiB page about twice the
//! time; see `examples/page_hash_cost.rs`).

use crate::vm::PAGE_SIZE;
use twox_hash::XxHash3_64;

/// The checksum of `data` with `seed`.
pub fn checksum(data: &[u8], seed: u64) -> u64 {
    XxHash3_64::oneshot_with_seed(seed, data)
}

/// The hash of the page at `gpa` holding `data` (what every page record
/// carries and what the per-slot digests are made of).
pub fn page_hash(data: &[u8], gpa: u64) -> u64 {
    checksum(data, gpa)
}

/// A page of zeros.
pub static ZERO_PAGE: [u8; PAGE_SIZE] = [0; PAGE_SIZE];

/// Whether every byte of `data` is zero (16 bytes at a time: the
/// compiler turns the fold into vector ORs).
pub fn is_zero(data: &[u8]) -> bool {
    let words = data.chunks_exact(16);
    let tail = words.remainder();
    tail.iter().all(|&b| b == 0)
        && words.fold(0u128, |acc, w| {
            acc | u128::from_ne_bytes(w.try_into().expect("16 bytes"))
        }) == 0
}

/// The digest of a run of page hashes (a slot's memory): XXH3 of their
/// little-endian bytes in page order.
pub fn digest_of(page_hashes: &[u64]) -> u64 {
    digest_of_iter(page_hashes.iter().copied())
}

/// [`digest_of`] the hashes `page_hashes` yields, streamed 4 KiB at a
/// time: no copy of them all is made (a destination takes the digest of
/// its 1 GiB guest, 2 MiB of hashes, inside the downtime; the copies and
/// their fresh pages cost more than the hashing).
pub fn digest_of_iter(page_hashes: impl IntoIterator<Item = u64>) -> u64 {
    use std::hash::Hasher;
    const CHUNK: usize = 512;
    let mut h = XxHash3_64::with_seed(0);
    let mut buf = [0u8; CHUNK * 8];
    let mut n = 0;
    for v in page_hashes {
        buf[n * 8..n * 8 + 8].copy_from_slice(&v.to_le_bytes());
        n += 1;
        if n == CHUNK {
            h.write(&buf);
            n = 0;
        }
    }
    h.write(&buf[..n * 8]);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_digest_is_the_one_shot_checksum_of_the_bytes() {
        for n in [0usize, 1, 511, 512, 513, 1024, 5000] {
            let h: Vec<u64> = (0..n as u64)
                .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .collect();
            let bytes: Vec<u8> = h.iter().flat_map(|v| v.to_le_bytes()).collect();
            assert_eq!(digest_of(&h), checksum(&bytes, 0), "{n} hashes");
        }
        assert_ne!(digest_of(&[1, 2]), digest_of(&[2, 1]));
    }

    #[test]
    fn reference_vectors() {
        // XXH3-64 of the empty input and of "a" with seed 0 (the reference
        // implementation's values).
        assert_eq!(checksum(b"", 0), 0x2D06_8005_38D3_94C2);
        assert_eq!(checksum(b"a", 0), 0xE6C6_32B6_1E96_4E1F);
    }

    /// The values are XXH3-64's, the same as the other implementation's
    /// (xxhash-rust, which the stream used before and the files still
    /// use): every length from 0 to 300 bytes (the short-input paths and
    /// past the 240-byte cutoff where the seed derives a secret), pages
    /// and a whole batch's entries, each with several seeds.
    #[test]
    fn values_are_xxh3_64s() {
        let data: Vec<u8> = (0..(1u32 << 20))
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let mut lens: Vec<usize> = (0..=300).collect();
        lens.extend([1024, 4095, 4096, 4097, 16 * 256 + 2, 1 << 20]);
        for len in lens {
            for seed in [0, 1, 7, 0x7fff_f000, u64::MAX] {
                let want = xxhash_rust::xxh3::xxh3_64_with_seed(&data[..len], seed);
                assert_eq!(
                    checksum(&data[..len], seed),
                    want,
                    "{len} bytes, seed {seed:#x}"
                );
            }
        }
    }

    #[test]
    fn seed_and_every_byte_matter() {
        let page = vec![7u8; 4096];
        let h = page_hash(&page, 1);
        assert_ne!(h, page_hash(&page, 2));
        let mut flipped = page.clone();
        flipped[4095] ^= 1;
        assert_ne!(h, page_hash(&flipped, 1));
    }

    #[test]
    fn zero_pages_are_found() {
        let mut p = vec![0u8; 4096 + 3];
        assert!(is_zero(&p[1..4097]));
        p[4000] = 1;
        assert!(!is_zero(&p[1..4097]));
        assert!(!is_zero(&p));
    }
}
