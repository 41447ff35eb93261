//! What a 4 KiB page costs the stream's CPU, per step: the
//! stream's checksum (XXH3-64) by the crate it uses now (`twox-hash`,
//! AVX2 chosen at run time) and by the one it used before (`xxhash-rust`,
//! SIMD chosen at compile time: SSE2 for the default x86-64 target),
//! from L1 and from memory, against `memcpy` of the same page (the
//! floor: the kernel's copy on each side of a socket costs at least that);
//! and the source's and destination's page pipelines with the hash taken
//! at different distances from the copy that brought the page in.
//!
//! `cargo run --release -p s2mmu-migrate --example page_hash_cost --
//! [--mib N] [--reps R] [--json]`: N MiB of memory (16 to 4096, default
//! 256: larger than the last-level cache), each case run R times (1 to
//! 50, default 5) over every page of it; prints each case's median, min
//! and max nanoseconds a page.

use s2mmu_migrate::hash::page_hash;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const PAGE: usize = 4096;
/// Pages of a PAGES record (the stream's batch).
const BATCH: usize = 256;

struct Mem {
    bytes: Vec<u8>,
    words: Vec<AtomicU64>,
    batch: Vec<u8>,
    pages: usize,
}

fn old_hash(p: &[u8], seed: u64) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(p, seed)
}

/// The source's copy out of guest memory: word by word, atomically per
/// word (the guest may be writing), with the zero check.
fn copy_page(words: &[AtomicU64], dst: &mut [u8]) -> bool {
    let mut acc = 0u64;
    for (w, d) in words.iter().zip(dst.chunks_exact_mut(8)) {
        let v = w.load(Ordering::Relaxed);
        acc |= v;
        d.copy_from_slice(&v.to_le_bytes());
    }
    acc == 0
}

/// The source's pipeline: each page copied into the batch, the batch's
/// pages hashed every `ahead` pages (`ahead` = BATCH: all at write time).
fn source(m: &mut Mem, hash: fn(&[u8], u64) -> u64, ahead: usize) -> u64 {
    let mut x = 0u64;
    let mut hashed = 0;
    for i in 0..m.pages {
        let slot = i % BATCH;
        let words = &m.words[i * PAGE / 8..(i + 1) * PAGE / 8];
        x ^= u64::from(copy_page(
            words,
            &mut m.batch[slot * PAGE..(slot + 1) * PAGE],
        ));
        if slot + 1 - hashed >= ahead || slot + 1 == BATCH {
            for k in hashed..=slot {
                x ^= hash(&m.batch[k * PAGE..(k + 1) * PAGE], (i - slot + k) as u64);
            }
            hashed = (slot + 1) % BATCH;
        }
    }
    x
}

/// The destination's pipeline: a record's pages copied into memory (as
/// the kernel's copy out of the socket does), `chunk` pages at a time,
/// each chunk's pages hashed right after it (`chunk` = BATCH: the whole
/// 1 MiB record first).
fn dest(m: &mut Mem, hash: fn(&[u8], u64) -> u64, chunk: usize) -> u64 {
    let mut x = 0u64;
    for r in (0..m.pages).step_by(BATCH) {
        for c in (r..(r + BATCH).min(m.pages)).step_by(chunk) {
            let end = (c + chunk).min(r + BATCH).min(m.pages);
            for i in c..end {
                let s = (i % BATCH) * PAGE;
                m.bytes[i * PAGE..(i + 1) * PAGE].copy_from_slice(&m.batch[s..s + PAGE]);
            }
            for i in c..end {
                x ^= hash(&m.bytes[i * PAGE..(i + 1) * PAGE], i as u64);
            }
        }
    }
    x
}

type Case = (&'static str, fn(&mut Mem) -> u64);

fn cases() -> Vec<Case> {
    vec![
        ("memcpy of a page from memory (the floor)", |m: &mut Mem| {
            for i in 0..m.pages {
                let s = (i % BATCH) * PAGE;
                m.batch[s..s + PAGE].copy_from_slice(&m.bytes[i * PAGE..(i + 1) * PAGE]);
            }
            u64::from(m.batch[7])
        }),
        (
            "the source's copy out of guest memory with the zero check",
            |m: &mut Mem| source(m, |_, _| 0, BATCH),
        ),
        ("xxh3 twox-hash (now), one page in L1", |m: &mut Mem| {
            (0..m.pages).fold(0, |x, i| {
                x ^ page_hash(black_box(&m.batch[..PAGE]), i as u64)
            })
        }),
        (
            "xxh3 xxhash-rust (before), one page in L1",
            |m: &mut Mem| {
                (0..m.pages).fold(0, |x, i| {
                    x ^ old_hash(black_box(&m.batch[..PAGE]), i as u64)
                })
            },
        ),
        (
            "xxh3 twox-hash (now), every page from memory",
            |m: &mut Mem| {
                let p = m.bytes.chunks_exact(PAGE);
                p.enumerate()
                    .fold(0, |x, (i, p)| x ^ page_hash(p, i as u64))
            },
        ),
        (
            "xxh3 xxhash-rust (before), every page from memory",
            |m: &mut Mem| {
                let p = m.bytes.chunks_exact(PAGE);
                p.enumerate().fold(0, |x, (i, p)| x ^ old_hash(p, i as u64))
            },
        ),
        (
            "source: copy, hash every 8 pages, twox-hash",
            |m: &mut Mem| source(m, page_hash, 8),
        ),
        (
            "source: copy, hash every 8 pages, xxhash-rust",
            |m: &mut Mem| source(m, old_hash, 8),
        ),
        (
            "source: copy, hash each page after its copy, twox-hash",
            |m: &mut Mem| source(m, page_hash, 1),
        ),
        (
            "source: copy 256 pages, then hash them, twox-hash",
            |m: &mut Mem| source(m, page_hash, BATCH),
        ),
        (
            "dest: copy in 1 MiB, then hash its pages, twox-hash",
            |m: &mut Mem| dest(m, page_hash, BATCH),
        ),
        (
            "dest: copy in 1 MiB, then hash its pages, xxhash-rust",
            |m: &mut Mem| dest(m, old_hash, BATCH),
        ),
        (
            "dest: copy in 128 KiB, hash each, twox-hash",
            |m: &mut Mem| dest(m, page_hash, 32),
        ),
        (
            "dest: copy in 128 KiB, hash each, xxhash-rust",
            |m: &mut Mem| dest(m, old_hash, 32),
        ),
    ]
}

fn arg(
    args: &[String],
    name: &str,
    default: usize,
    range: std::ops::RangeInclusive<usize>,
) -> usize {
    let Some(i) = args.iter().position(|a| a == name) else {
        return default;
    };
    let v = args.get(i + 1).and_then(|v| v.parse().ok());
    match v {
        Some(v) if range.contains(&v) => v,
        _ => {
            eprintln!("{name}: a number from {} to {}", range.start(), range.end());
            std::process::exit(2)
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mib = arg(&args, "--mib", 256, 16..=4096);
    let reps = arg(&args, "--reps", 5, 1..=50);
    let json = args.iter().any(|a| a == "--json");
    let pages = mib << 8;
    // Pseudo-random, no zero page: every page hashed and sent.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed | 1
    };
    let words: Vec<AtomicU64> = (0..pages * PAGE / 8)
        .map(|_| AtomicU64::new(next()))
        .collect();
    let bytes = words
        .iter()
        .flat_map(|w| w.load(Ordering::Relaxed).to_le_bytes())
        .collect();
    let mut m = Mem {
        bytes,
        words,
        batch: vec![1u8; BATCH * PAGE],
        pages,
    };
    let mut out = Vec::new();
    for (name, f) in cases() {
        let mut ns: Vec<f64> = (0..reps)
            .map(|_| {
                let t = Instant::now();
                black_box(f(&mut m));
                t.elapsed().as_nanos() as f64 / pages as f64
            })
            .collect();
        ns.sort_by(f64::total_cmp);
        // `reps` is at least 1, so every figure exists.
        let med = s2mmu_stats::median(&ns).unwrap_or(0.0);
        let (min, max) = (ns[0], ns[ns.len() - 1]);
        if !json {
            println!("{med:8.1} ns a page (min {min:.1}, max {max:.1})  {name}");
        }
        out.push(format!(
            "{{\"case\":\"{name}\",\"median_ns\":{med:.1},\"min_ns\":{min:.1},\"max_ns\":{max:.1}}}"
        ));
    }
    #[cfg(target_arch = "x86_64")]
    let avx2 = std::is_x86_feature_detected!("avx2");
    #[cfg(not(target_arch = "x86_64"))]
    let avx2 = false;
    if json {
        println!(
            "{{\"mib\":{mib},\"reps\":{reps},\"avx2\":{avx2},\"cases\":[{}]}}",
            out.join(",")
        );
    } else {
        println!("{mib} MiB, {reps} runs a case, median of the runs; this CPU has AVX2: {avx2}");
    }
}
