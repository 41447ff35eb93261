//! The migration destination against hostile streams (format version 6):
//! records are generated from the fuzzer's bytes and written with valid
//! checksums (so they get past the checksum checks and reach the decoders),
//! then optionally damaged; pages go raw or LZ4-compressed (a flipped
//! byte then lands in a compressed page's length or bytes too). The
//! destination may reject a stream, but it must never panic, and it must
//! never resume a guest from a stream that lacked a page or the vCPU state.
#![no_main]

use libfuzzer_sys::fuzz_target;
use s2mmu::format::FormatId;
use s2mmu::mmu::MmuPolicy;
use s2mmu_migrate::sim::dest::{receive_from, SimDestConfig};
use s2mmu_migrate::wire::{tag, Compression, Header, WireWriter, PAGE_SIZE};
use std::time::Duration;

fuzz_target!(|data: &[u8]| {
    let mut bytes = data.iter().copied();
    let mut next = || bytes.next().unwrap_or(0);
    // A tiny guest: 0 to 4 pages of 4 KiB, one or two slots.
    let pages = u64::from(next() % 5);
    let formats = FormatId::ALL;
    let header = Header {
        mem_size: pages * PAGE_SIZE as u64,
        slots: u32::from(next() % 3),
        gpa_base: u64::from(next()) << 20,
        vcpus: u32::from(next() % 3),
        channels: u16::from(next() % 2) + 1,
        backing: ["anonymous", "anonymous_thp", "bogus"][usize::from(next() % 3)].into(),
        verify_full: next() & 1 == 1,
        postcopy: false,
        // The destination runs arm64: a stream of another format is
        // refused by name.
        format: formats[usize::from(next()) % formats.len()],
        // Some streams name a guest image the destination was not told of.
        image: (next() & 1 == 1).then(|| [next(); 32]),
    };
    let mut stream = Vec::new();
    let Ok(mut w) = WireWriter::new(&mut stream, &header) else {
        return;
    };
    if next() & 1 == 1 {
        w.set_compression(Compression::Lz4);
    }
    // The link probe (a destination expects it first).
    if next() & 1 == 1 {
        let _ = w.probe(u64::from(next() % 64), &[0x55; 64], &mut |_| {});
    }
    let records = next() % 12;
    for _ in 0..records {
        match next() % 4 {
            0 => {
                let page = u64::from(next() % 6);
                let gpa = header.gpa_base + page * PAGE_SIZE as u64 + u64::from(next() & 1);
                // A page of runs (compresses) or of the fuzzer's bytes
                // (compresses or not, as they come).
                let mut data = [next(); PAGE_SIZE];
                if next() & 1 == 1 {
                    for b in data.iter_mut().step_by(61) {
                        *b = next();
                    }
                }
                let _ = w.page(gpa, &data);
            }
            1 => {
                let t = [
                    tag::ROUND,
                    tag::STATE,
                    tag::VERIFY,
                    tag::END,
                    tag::ABORT,
                    tag::JOIN,
                    0x7f,
                ][usize::from(next() % 7)];
                let len = usize::from(next() % 96);
                let body: Vec<u8> = (0..len).map(|_| next()).collect();
                let _ = w.control(t, &body);
            }
            2 => {
                let _ = w.end();
            }
            _ => {}
        }
    }
    let _ = w.flush();
    drop(w);
    // Damage: flip a byte or cut the stream.
    match next() % 3 {
        0 if !stream.is_empty() => {
            let at = usize::from(next()) * 31 % stream.len();
            stream[at] ^= next() | 1;
        }
        1 if !stream.is_empty() => {
            let at = usize::from(next()) * 31 % stream.len();
            stream.truncate(at);
        }
        _ => {}
    }
    let mut cfg = SimDestConfig::new(MmuPolicy::default(), Duration::from_millis(1));
    cfg.dest.prefault = false;
    let mut reply = Vec::new();
    if let Ok(out) = receive_from(stream.as_slice(), &mut reply, &cfg) {
        assert!(
            out.resumed_at.is_some() || header.mem_size == 0,
            "accepted stream without resuming"
        );
    }
});
