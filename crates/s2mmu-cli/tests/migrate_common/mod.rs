//! What the in-process migration test files share: a plain loopback
//! link, a small guest, and a destination that does not prefault.

#![allow(dead_code)]

use s2mmu::mmu::MmuPolicy;
use s2mmu_cli::migrate::dest::DestConfig;
use s2mmu_cli::migrate::net::NetConfig;
use s2mmu_cli::migrate::source::SourceConfig;
use s2mmu_cli::progress::Progress;
use s2mmu_vm::Backing;
use std::sync::Arc;
use std::time::Duration;

/// No TLS, a 10 s I/O deadline.
pub fn plain() -> NetConfig {
    NetConfig::plain(Duration::from_secs(10))
}

/// A guest of `mem` bytes in two anonymous slots, short warm-up, no
/// progress output.
pub fn small(mem: u64) -> SourceConfig {
    SourceConfig {
        mem_size: mem,
        backing: Backing::Anonymous,
        slots: 2,
        clear_chunk: 1 << 20,
        warmup: Duration::from_millis(50),
        sample_every: Duration::from_millis(20),
        progress: Arc::new(Progress::off()),
        ..SourceConfig::default()
    }
}

/// A destination that lets the stream back the memory (no prefault)
/// and runs the guest on for 50 ms.
pub fn dest_cfg() -> DestConfig {
    DestConfig {
        prefault: false,
        ..DestConfig::new(MmuPolicy::default(), Duration::from_millis(50))
    }
}
