//! Shared helpers of the Linux guest's migration checks.
#![allow(dead_code)]

pub mod counter;
pub mod cut_proxy;
pub mod pure_postcopy;

use s2mmu_arm64::linux::assets::{ensure, AssetOptions, LinuxAssets};
use std::sync::{Arc, Mutex, MutexGuard};

/// One QEMU at a time per test binary: the machine has 2 cores.
static ONE: Mutex<()> = Mutex::new(());

/// Serialises the tests of one binary.
pub fn serial() -> MutexGuard<'static, ()> {
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The Linux guest's kernel and initramfs. Each test that needs them is
/// `#[cfg_attr(not(s2mmu_linux_runnable), ignore = ...)]`: where the build
/// found no model, no cross compiler or no kernel packages
/// (`scripts/setup.sh`) the runner reports it as ignored; where it found
/// them, a failure here fails the test with the reason. Always `Some`.
pub fn linux_assets() -> Option<LinuxAssets> {
    if let Err(why) = s2mmu_arm64::available() {
        panic!("the build found the arm64 model but it cannot run now: {why}");
    }
    match ensure(&AssetOptions::from_env()) {
        Ok(a) => Some(a),
        Err(e) => panic!("the Linux guest's kernel and initramfs: {e}"),
    }
}

/// One migration of `guest` into a machine `dest` builds, both ends in
/// this process over loopback secured as `net` says (the library's
/// `run_both_ends`); the destination's guest runs 300 ms after the
/// switch, and its memory is not prefaulted.
pub fn migrate_here<G: s2mmu_migrate::session::guest::SourceGuest>(
    guest: &G,
    dest: &Arc<s2mmu_arm64_migrate::session_dest::LinuxDest>,
    source: &s2mmu_migrate::session::source::SourceConfig,
    net: &s2mmu_migrate::transport::NetConfig,
) -> s2mmu_migrate::session::both_ends::BothEnds {
    use s2mmu_migrate::session::dest::DestConfig;
    let dest_cfg = DestConfig {
        prefault: false,
        ..DestConfig::with_run_after(std::time::Duration::from_millis(300))
    };
    let listener = s2mmu_migrate::transport::bind("127.0.0.1:0").expect("a loopback listener");
    s2mmu_migrate::session::both_ends::run_both_ends(
        listener,
        dest.clone(),
        guest,
        source,
        &dest_cfg,
        net,
    )
    .expect("the destination thread starts")
}

/// A Linux run's settings as the one-process session tests use them:
/// `program` on `vcpus` vCPUs and `mem` bytes of RAM, pre-copy with the
/// session's defaults, B run for 300 ms before its pause, ephemeral TLS
/// with a 120 s deadline, one attempt. Tests change what they test with
/// `RunSettings { .., ..run_settings(..) }`.
pub fn run_settings(
    vcpus: usize,
    mem: u64,
    program: s2mmu_arm64_migrate::session_run::GuestProgram,
) -> s2mmu_arm64_migrate::session_run::RunSettings {
    use s2mmu_migrate::transport::{self, NetConfig};
    use std::time::Duration;
    s2mmu_arm64_migrate::session_run::RunSettings {
        vcpus,
        mem,
        program,
        postcopy: None,
        session: s2mmu_migrate::session::source::SourceConfig::default(),
        dest: s2mmu_migrate::session::dest::DestConfig::with_run_after(Duration::from_millis(300)),
        net: NetConfig {
            io_timeout: Duration::from_secs(120),
            security: transport::ephemeral_tls().expect("an ephemeral identity"),
        },
        attempts: 1,
        ram_pages: Default::default(),
        engine: Default::default(),
        hardware_dirty: false,
    }
}
