//! Shared helpers of the Linux guest's migration checks.
#![allow(dead_code)]

pub mod counter;
pub mod cut_proxy;
pub mod pure_postcopy;

use std::sync::Arc;

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
    use std::time::Duration;
    s2mmu_arm64_migrate::session_run::RunSettings {
        vcpus,
        mem,
        program,
        postcopy: None,
        session: s2mmu_migrate::session::source::SourceConfig::default(),
        dest: s2mmu_migrate::session::dest::DestConfig::with_run_after(Duration::from_millis(300)),
        net: tls(),
        attempts: 1,
        ram_pages: Default::default(),
        engine: Default::default(),
        hardware_dirty: false,
    }
}

/// Mutual TLS with an identity made for this test, a 120 s deadline on
/// every read and write.
pub fn tls() -> s2mmu_migrate::transport::NetConfig {
    s2mmu_migrate::transport::NetConfig {
        io_timeout: std::time::Duration::from_secs(120),
        security: s2mmu_migrate::transport::ephemeral_tls().expect("an ephemeral identity"),
    }
}

/// The source's settings of the post-copy checks: a bitmap harvest and
/// post-copy after round 0.
pub fn postcopy_on() -> s2mmu_migrate::session::source::SourceConfig {
    s2mmu_migrate::session::source::SourceConfig {
        harvest: s2mmu_migrate::session::source::Harvest::Bitmap,
        postcopy: s2mmu_migrate::session::postcopy::Postcopy::On,
        ..Default::default()
    }
}

/// What a source's machine had printed and run at the switch: its console
/// and its stub's exit count.
pub fn at_switch(vm: &s2mmu_arm64_migrate::session_source::LinuxSessionVm) -> (String, u64) {
    let vm = vm.lock();
    (vm.console().contents(), vm.stub_exits())
}

/// Checks that a source's machine stayed silent after the switch: it
/// printed nothing and ran nothing since [`at_switch`] gave `before`.
pub fn check_silent(
    vm: &s2mmu_arm64_migrate::session_source::LinuxSessionVm,
    before: &(String, u64),
    what: &str,
) {
    let vm = vm.lock();
    assert_eq!(
        vm.console().contents(),
        before.0,
        "{what}: the source printed after"
    );
    assert_eq!(vm.stub_exits(), before.1, "{what}: the source ran after");
}

/// The capped link of the auto-converge checks, bytes a second: the
/// dirtier's working set takes over a second a round at it, in which the
/// dirtier writes all of it again, so pre-copy alone cannot converge.
pub const CAPPED_LINK: u64 = 64 << 20;

/// The dirtier on 2 vCPUs and 256 MiB with the engine at EL2, logging by
/// hardware dirty state where `hardware_dirty`, over [`CAPPED_LINK`] with
/// `converge` and at most `max_rounds` rounds.
pub fn capped(
    converge: s2mmu_migrate::session::source::Converge,
    max_rounds: u32,
    hardware_dirty: bool,
) -> s2mmu_arm64_migrate::session_run::RunSettings {
    let mut s = s2mmu_arm64_migrate::session_run::RunSettings {
        engine: s2mmu_arm64::linux::vm::Engine::El2,
        hardware_dirty,
        ..run_settings(
            2,
            256 << 20,
            s2mmu_arm64_migrate::session_run::GuestProgram::Dirtier,
        )
    };
    s.session.bandwidth = CAPPED_LINK;
    // The raw form: the dirtier's pages compress about tenfold, and a link
    // that compression widens that much lets pre-copy converge unhelped.
    s.session.compression = s2mmu_migrate::wire::Compression::Off;
    s.session.converge = converge;
    s.session.max_rounds = max_rounds;
    s
}
