//! What the in-process migration test files share: a plain loopback
//! link, a small guest, and a destination that does not prefault.

#![allow(dead_code)]

use s2mmu::mmu::MmuPolicy;
use s2mmu_migrate::session::Progress;
use s2mmu_migrate::sim::dest::SimDestConfig;
use s2mmu_migrate::sim::source::SimRun;
use s2mmu_migrate::transport::NetConfig;
use s2mmu_migrate::wire::{Record, WireReader};
use s2mmu_vm::Backing;
use std::time::Duration;

/// No TLS, a 10 s I/O deadline.
pub fn plain() -> NetConfig {
    NetConfig::plain(Duration::from_secs(10))
}

/// Mutual TLS with an identity made for the test, a 10 s I/O deadline.
pub fn tls() -> NetConfig {
    NetConfig {
        security: s2mmu_migrate::transport::ephemeral_tls().unwrap(),
        ..plain()
    }
}

/// A guest of `mem` bytes in two anonymous slots, short warm-up, no
/// progress output.
pub fn small(mem: u64) -> SimRun {
    anonymous(mem, 2, Duration::from_millis(50))
}

/// A guest of `mem` bytes in `slots` anonymous slots, `warmup` of warm-up,
/// a sample every 20 ms and no progress output.
pub fn anonymous(mem: u64, slots: u32, warmup: Duration) -> SimRun {
    SimRun::default().with(|g, s| {
        g.mem_size = mem;
        g.backing = Backing::Anonymous;
        g.slots = slots;
        s.clear_chunk = 1 << 20;
        s.warmup = warmup;
        s.sample_every = Duration::from_millis(20);
        s.progress = Progress::off();
    })
}

/// The tags of the control records in a destination's `reply` stream.
pub fn reply_tags(reply: &[u8]) -> Vec<u8> {
    let mut rd = WireReader::replies(reply);
    let mut tags = Vec::new();
    while let Ok(Record::Control { tag, .. }) = rd.next_record() {
        tags.push(tag);
    }
    tags
}

/// A destination that lets the stream back the memory (no prefault)
/// and runs the guest on for 50 ms.
pub fn dest_cfg() -> SimDestConfig {
    let mut c = SimDestConfig::new(MmuPolicy::default(), Duration::from_millis(50));
    c.dest.prefault = false;
    c
}

/// A stream's opening with the HEADER `h`, as a source writes it.
pub fn opening(h: &s2mmu_migrate::wire::Header) -> Vec<u8> {
    let w = s2mmu_migrate::wire::WireWriter::new(Vec::new(), h).unwrap();
    w.into_inner()
}

/// A HEADER for a guest of `mem` bytes in one slot at 4 GiB, 2 vCPUs,
/// one channel.
pub fn header(mem: u64) -> s2mmu_migrate::wire::Header {
    s2mmu_migrate::wire::Header {
        mem_size: mem,
        slots: 1,
        gpa_base: 1 << 32,
        vcpus: 2,
        channels: 1,
        backing: "anonymous".into(),
        verify_full: false,
        postcopy: false,
        format: s2mmu::format::FormatId::of::<s2mmu::format::arm64::Arm64Stage2>(),
        image: None,
    }
}

/// The destination's next reply on `s`, its tag and body.
pub fn reply(s: &mut std::net::TcpStream) -> (u8, Vec<u8>) {
    match WireReader::replies(s).next_record().unwrap() {
        s2mmu_migrate::wire::Record::Control { tag, body, .. } => (tag, body),
        other => panic!(
            "expected a reply, got {}",
            s2mmu_migrate::wire::record_name(&other)
        ),
    }
}
