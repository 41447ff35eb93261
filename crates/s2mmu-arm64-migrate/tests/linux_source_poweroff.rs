//! A source whose guest powers off in the middle of its migration: the
//! guest program `counter` stops after a few seconds and the guest's
//! /init then powers the machine off (`poweroff -f`, PSCI SYSTEM_OFF)
//! while round 0 still runs (the link is held to 8 MiB/s, so round 0 of
//! a 128 MiB guest, 16 s, outlasts the counter's last 3 s: at 2 MiB/s the
//! test took 64 s more to say the same). The migration must fail with
//! the source's own error naming its guest's power-off
//! (`MigrateError::SourceGuestStopped` on the source's side), not with
//! the destination's refusal of a dead guest's state ("no vCPU was
//! running", which is what it reported before).

mod common;

use s2mmu_arm64_migrate::session_run::{self, GuestProgram, LinuxRunError, RunSettings};
use s2mmu_migrate::session::source::SourceConfig;
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::wire::Compression;

s2mmu_arm64::linux_test! {
    fn a_source_guest_that_powers_off_mid_migration_is_named_as_the_cause(a) {
        let s = RunSettings {
            session: SourceConfig {
                bandwidth: 8 << 20,
                // Raw pages, so the limit holds round 0 for its 16 s (the
                // guest's mostly empty memory would compress).
                compression: Compression::Off,
                ..SourceConfig::default()
            },
            ..common::run_settings(1, 128 << 20, GuestProgram::Counter)
        };
        let mut cfg = session_run::linux_config(&s, &a);
        // Counting for 5 s, then /init powers the guest off.
        cfg.cmdline = "quiet s2mmu.run=counter s2mmu.args=kib=4,ms=1000,secs=5".into();
        let r = session_run::migrate_once(&s, &cfg);
        match r {
            Err(LinuxRunError::Session {
                side: "source",
                error: MigrateError::SourceGuestStopped { why },
            }) => {
                eprintln!("the source said: {why}");
                assert!(why.contains("powered off"), "{why}");
            }
            Err(e) => panic!("the source did not name its guest's power-off: {e}"),
            Ok(r) => panic!("migrated a guest that powered off: {r:?}"),
        }
    }
}
