//! The Linux guest's migration with the engine at EL2 logging by hardware
//! dirty state (`RunSettings::hardware_dirty`: DBM leaves, the guest's
//! writes never fault). The dirtier, writing as fast as it can, is faster
//! than a capped link: without help pre-copy gives up at its round limit;
//! with auto-converge the session's throttle, which no write fault can
//! carry here, is a share of each vCPU's time slept at its exits, and
//! pre-copy converges with the dirtier's own check of every page passing
//! on the destination.

mod common;

use s2mmu_arm64_migrate::session_run::{self, RunDetails, WentOn};
use s2mmu_migrate::session::source::Converge;

s2mmu_arm64::linux_test! {
    /// Without help the hardware-logged dirtier does not converge over the
    /// capped link; with auto-converge it does, by time slept, not faults.
    fn a_hardware_dirty_log_converges_by_a_share_of_time_and_not_without_help(a) {
        // No convergence help: pre-copy gives up at the round limit, so the
        // run below converges by its throttle.
        let s = common::capped(Converge::None, 6, true);
        let cfg = session_run::linux_config(&s, &a);
        let e = session_run::migrate_once(&s, &cfg).expect_err("no help: no convergence");
        let text = e.to_string();
        assert!(text.contains("did not converge"), "{text}");

        let s = common::capped(Converge::Auto, 30, true);
        let cfg = session_run::linux_config(&s, &a);
        assert!(cfg.dirty.mode.is_some_and(|m| m.hardware()));
        let r = session_run::migrate_once(&s, &cfg).expect("auto-converge moves the dirtier");
        let RunDetails::Session { outcome, limit, .. } = &r.details else {
            panic!("pre-copy ran: {r:?}");
        };
        eprintln!(
            "hardware dirty state at EL2: downtime {:?}, rounds {:?}, throttle up to {}%, {limit:?}",
            r.downtime, r.round_pages, outcome.max_throttle_pct
        );
        // The log found the dirtier's pages round after round.
        assert!(r.round_pages.len() > 2, "{:?}", r.round_pages);
        assert!(r.round_pages[1] > 0, "{:?}", r.round_pages);
        assert!(outcome.max_throttle_pct > 0, "no throttle was needed");
        // The vCPUs slept their share, and no write fault carried a brake.
        assert!(limit.throttled_ns > 0, "no vCPU slept: {limit:?}");
        assert_eq!(limit.el2_paced_exits, 0, "{limit:?}");
        assert_eq!(limit.el2_refused, 0);
        match &r.went_on {
            Some(WentOn::DirtierOk(ok)) => assert!(ok.contains("s2mmu-dirtier: ok"), "{ok}"),
            other => panic!("B's dirtier: {other:?}"),
        }
    }
}
