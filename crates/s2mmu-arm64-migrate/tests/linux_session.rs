//! A running Linux guest migrated through the migration LIBRARY's session
//! (`run_source` on machine A, `serve_with` building machine B from the
//! HEADER) over a real loopback connection secured with mutual TLS.
//! First a source whose STATE is damaged in flight: the destination
//! refuses it by name before any vCPU starts there, and A's guest goes on
//! counting. Then the real migration: the memories agree by digest at the
//! switch, A prints nothing and runs no guest code after it, and B's
//! console continues the counter's exact sequence.

mod common;

use common::counter::{check_lives, config, counter_lines, wait_lines};
use s2mmu_arm64::linux::migrate::LinuxVm;
use s2mmu_arm64_migrate::session_dest::LinuxDest;
use s2mmu_arm64_migrate::session_source::{LinuxSessionVm, LinuxSource};
use s2mmu_migrate::session::dest::DestOutcome;
use s2mmu_migrate::session::guest::{GuestShape, NoHook, SourceGuest};
use s2mmu_migrate::session::source::{SourceConfig, SourceOutcome};
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::vm::{GuestCounters, GuestRun};
use std::sync::Arc;

type Outcomes = (
    Result<SourceOutcome, MigrateError>,
    Result<DestOutcome, MigrateError>,
);

/// One migration of `guest` into a Linux destination built by `dest`,
/// both ends in this process over loopback TLS.
fn migrate<G: SourceGuest>(guest: &G, dest: &Arc<LinuxDest>) -> Outcomes {
    let ends = common::migrate_here(guest, dest, &SourceConfig::default(), &common::tls());
    (ends.source, ends.dest)
}

/// A's guest, with one byte of its STATE body changed on the way (the
/// fault the destination's check must catch).
struct DamagedState<'a>(&'a LinuxSource);

impl GuestRun for DamagedState<'_> {
    fn pause(&self) {
        self.0.pause()
    }
    fn resume(&self) {
        self.0.resume()
    }
    fn counters(&self) -> GuestCounters {
        self.0.counters()
    }
    fn set_throttle_ns(&self, ns: u64) {
        self.0.set_throttle_ns(ns)
    }
    fn pace(&self) -> u64 {
        self.0.pace()
    }
    fn set_pace(&self, p: u64) {
        self.0.set_pace(p)
    }
}

impl SourceGuest for DamagedState<'_> {
    type Vm = LinuxSessionVm;
    type Hook = NoHook;
    fn vm(&self) -> &Arc<LinuxSessionVm> {
        self.0.vm()
    }
    fn shape(&self) -> GuestShape {
        self.0.shape()
    }
    fn counter_source(&self) -> Arc<dyn Fn() -> GuestCounters + Send + Sync> {
        self.0.counter_source()
    }
    fn state(&self, pace: u64) -> Result<Vec<u8>, MigrateError> {
        let mut s = self.0.state(pace)?;
        let mid = s.len() / 2;
        s[mid] ^= 0x40;
        Ok(s)
    }
    fn begin_hook(&self) -> Result<NoHook, MigrateError> {
        Ok(NoHook)
    }
}

s2mmu_arm64::linux_test! {
    fn linux_guest_migrates_through_the_session_over_tls(a) {
        let cfg = config(&a, 1);
        let vm_a = LinuxVm::boot(&cfg).expect("A boots");
        wait_lines(&vm_a, 0, 3, "A");
        let src = LinuxSource::new(vm_a);
        let dest = Arc::new(LinuxDest::new(cfg.echo, cfg.timeout));

        // Damaged STATE: refused by name at the destination, A goes on.
        let (s, d) = migrate(&DamagedState(&src), &dest);
        let d_err = d.expect_err("the destination refuses a damaged STATE");
        eprintln!("damaged STATE: destination {d_err}; source {s:?}");
        assert!(s.is_err(), "the source reports the refusal");
        assert!(
            matches!(&d_err, MigrateError::Malformed { record: "STATE", why, .. }
                if why.contains("Linux guest's state")),
            "{d_err}"
        );
        let refused = dest.built().expect("C was built");
        assert_eq!(
            refused.lock().stub_exits(),
            0,
            "C's vCPUs never ran the refused guest"
        );
        drop(refused);
        let n0 = counter_lines(&src.vm().lock().console().contents()).len();
        wait_lines(&src.vm().lock(), 0, n0 + 2, "A after the refusal");

        // The real migration, A -> B.
        let (s, d) = migrate(&src, &dest);
        let (s, d) = (s.expect("the source's side"), d.expect("B's side"));
        eprintln!(
            "A -> B through the session: downtime {:?}, {} rounds, {} page records",
            s.downtime,
            s.rounds.len(),
            s.page_records
        );
        assert_eq!(s.slot_digests, d.slot_digests, "the memories at the switch");
        assert!(!s.slot_digests.is_empty());
        let (a_text, a_exits) = {
            let a = src.vm().lock();
            (a.console().contents(), a.stub_exits())
        };
        let b = dest.built().expect("B was built");
        // The session let B run for its run_after, then paused it: run it on.
        let mut bvm = b.lock();
        bvm.resume_vcpus().expect("B runs on");
        let b1 = wait_lines(&bvm, 0, 5, "B");
        check_lives(&[&a_text, &b1]);
        let a = src.vm().lock();
        assert_eq!(a.console().contents(), a_text, "A printed after the switch");
        assert_eq!(a.stub_exits(), a_exits, "A's guest ran after the switch");
        bvm.shut_down().expect("B's threads end cleanly");
    }
}
