//! Debian's arm64 Linux with the engine at EL2 (`Engine::El2`): the stub
//! links the engine, which answers every stage-2 abort on guest RAM on
//! the faulting CPU; only MMIO and the like exit to the host. `/init`
//! counts every vCPU online, and the guest powers off. Under dirty
//! logging (the write-protection faults marked at EL2, the host harvesting
//! through EL2's commands; under `hw` the CPU's dirty state) every guest
//! page's content is checked against the logs, as for the host placement
//! (`linux_dirty.rs`). The host's changes under the running guest go
//! through EL2's commands: pages moved by the MMU notifier (`REMAP_PAGE`),
//! logging stopped with blocks collapsed in place (`COLLAPSE`), and a
//! logged framebuffer slot moved to other memory (`MEMSLOT_DELETE_LOGGED`
//! or a delete, then `MEMSLOT_SET`), as `linux/changes.rs` runs them for
//! the host placement.

mod common;

use s2mmu::mmu::DirtyMode;
use s2mmu_arm64::linux::changes::{HostChange, FB_IPA, FB_SIZE};
use s2mmu_arm64::linux::dirty::{self, HarvestConfig, HarvestReport};
use s2mmu_arm64::linux::vm::{self, Engine, LinuxConfig, LinuxReport, StopReason};
use s2mmu_arm64::test_support;
use std::time::Duration;

fn run(vcpus: usize, dirty: HarvestConfig, cmdline: &str) -> Option<LinuxReport> {
    let a = test_support::linux_assets();
    let r = vm::run(&LinuxConfig {
        dirty,
        engine: Engine::El2,
        ..test_support::linux_config(&a, vcpus, cmdline)
    })
    .expect("the Linux VM runs with the engine at EL2");
    eprintln!(
        "init after {:?} s, stopped after {:.1} s ({:?}); exits {:?}; EL2 faults {} ({} ns); log {:?}",
        r.init_s, r.total_s, r.reason, r.exits, r.el2_faults, r.el2_fault_ns, r.log
    );
    assert_eq!(r.reason, StopReason::PowerOff, "console:\n{}", r.console);
    assert_eq!(
        r.cpus_online,
        Some(vcpus as u32),
        "init's CPU count; console:\n{}",
        r.console
    );
    // Every RAM fault was answered at EL2: none reached the host.
    assert!(r.el2_faults > 0, "RAM came through EL2's fault path");
    assert_eq!(r.exits[0], 0, "stage-2 faults answered by the host");
    assert!(
        r.exits[1] > 0,
        "the UART and the GIC still exit to the host"
    );
    Some(r)
}

fn boot(vcpus: usize) {
    run(vcpus, HarvestConfig::default(), "quiet");
}

s2mmu_arm64::linux_test! {
    el2
    fn linux_boots_to_init_on_one_vcpu_with_the_engine_at_el2() { boot(1) }
    fn linux_boots_to_init_on_two_vcpus_with_the_engine_at_el2() { boot(2) }
    fn linux_boots_to_init_on_four_vcpus_with_the_engine_at_el2() { boot(4) }
}

fn no_page_lost(mode: DirtyMode) {
    let cfg = HarvestConfig {
        mode: Some(mode),
        period: Duration::from_millis(50),
        drop_invalidations_from: None,
        discard_log: None,
        change: Default::default(),
        cut_after: None,
    };
    let cmdline = "quiet s2mmu.run=dirtier s2mmu.args=mem=48,file=8,secs=30";
    let Some(r) = run(2, cfg, cmdline) else {
        return;
    };
    let d = common::check_dirtier(&r, "ok");
    assert!(d.harvests >= 100, "{} harvests", d.harvests);
    assert!(d.changed > 1000, "the guest changed {} pages", d.changed);
    eprintln!(
        "{mode:?}: {} harvests, {} pages changed, 0 lost",
        d.harvests, d.changed
    );
    let c = r
        .el2_counters
        .expect("EL2's counters")
        .expect("EL2 answers COUNTERS");
    if mode.hardware() {
        // The CPU sets the dirty state (DBM): EL2's GET reads the leaves.
        assert!(d.logged > 0, "{d:?}");
    } else {
        // The dirty marks were made at EL2: its write-protection faults.
        assert!(c.permission > 0 && c.dirtied > 0, "{c:?}");
    }
}

s2mmu_arm64::linux_test! {
    el2
    fn hardware_dirty_logging_at_el2_loses_no_page() { no_page_lost(dirty::HW_GET) }
    fn write_protect_logging_at_el2_loses_no_page() { no_page_lost(dirty::WP_GET) }
    fn manual_protect_logging_at_el2_loses_no_page() { no_page_lost(dirty::MANUAL) }
    fn ring_logging_at_el2_loses_no_page() { no_page_lost(dirty::RING) }
}

/// The dirtier with `args` on 2 vCPUs under `mode` while the host makes
/// `change` through EL2: its line `s2mmu-dirtier: {ok}` must show and no
/// page may be lost; EL2 answered the guest's faults.
fn changed(
    mode: DirtyMode,
    change: HostChange,
    args: &str,
    ok: &str,
) -> Option<(HarvestReport, s2mmu_el2::Counters)> {
    let cfg = HarvestConfig {
        mode: Some(mode),
        period: Duration::from_millis(100),
        drop_invalidations_from: None,
        discard_log: None,
        change,
        cut_after: None,
    };
    let cmdline = format!("quiet s2mmu.run=dirtier s2mmu.args={args}");
    let r = run(2, cfg, &cmdline)?;
    eprintln!("{mode:?} {change:?}: dirty {:?}", r.dirty);
    let d = common::check_dirtier(&r, ok);
    let c = r
        .el2_counters
        .expect("EL2's counters")
        .expect("EL2 answers COUNTERS");
    Some((d, c))
}

s2mmu_arm64::linux_test! {
    el2
    /// The MMU notifier moves 32 of the pages each harvest logged to other
    /// pages (EL2 copies each with its faults held) and the host poisons the
    /// old ones: a stale translation would make the dirtier read poison, a
    /// dropped dirty mark would show as a lost page.
    fn pages_remapped_through_el2_under_the_dirtier() {
        for mode in [dirty::WP_GET, dirty::HW_GET] {
            let args = "mem=48,file=8,secs=10";
            let Some((d, _)) = changed(mode, HostChange::Remap { pages: 32 }, args, "ok") else {
                return;
            };
            assert!(d.changed > 1000, "the guest changed {} pages", d.changed);
            assert!(d.remapped >= 100, "{} pages remapped", d.remapped);
        }
    }
}

s2mmu_arm64::linux_test! {
    el2
    /// Logging stops after the 5th harvest: EL2 collapses the split blocks
    /// back in place; 5 periods later it starts again and the check goes on.
    fn blocks_collapsed_at_el2_when_logging_stops() {
        let change = HostChange::Collapse { at: 5, after: 5 };
        let Some((d, c)) = changed(dirty::WP_GET, change, "mem=48,file=8,secs=10", "ok") else {
            return;
        };
        assert_eq!(d.pauses, 1);
        assert!(d.collapsed > 0, "no block collapsed: {d:?}");
        assert_eq!(c.collapsed, d.collapsed, "EL2 counted what it answered");
        assert!(d.harvests > 10, "{} harvests", d.harvests);
    }
}

s2mmu_arm64::linux_test! {
    el2
    /// A logged framebuffer slot (the dirtier writes and checks it through
    /// `/dev/mem`) moves at the 20th harvest to other memory at the same IPA:
    /// deleted with its last log (bitmap modes) or plainly (rings), copied,
    /// added again logging. The dirtier's check passes and every changed page
    /// is in a log.
    fn framebuffer_slot_moved_through_el2_while_logged() {
        for mode in [dirty::WP_GET, dirty::RING] {
            let args = format!("fb={FB_IPA:#x}:{FB_SIZE:#x},secs=8");
            let change = HostChange::MoveSlot { at: 20 };
            let Some((d, _)) = changed(mode, change, &args, "ok fb") else {
                return;
            };
            assert_eq!(d.moves, 1, "{d:?}");
        }
    }
}

s2mmu_arm64::linux_test! {
    el2
    /// The break-before-make monitor sees EL2: EL2 traces its stores and
    /// invalidations into a ring the host replays into the checker. Two
    /// harvests of the engine's own work replay clean; then EL2 withholds its
    /// invalidations for a harvest (re-protecting and reporting pages), a
    /// collapse (blocks made, table pages freed) and a split, and the replay
    /// catches each rule broken on that table, after the trace's mark.
    fn withheld_invalidations_at_el2_are_caught_by_the_replay() {
        use s2mmu::bbm::{self, Rule};
        use s2mmu::format::arm64::{Arm64Stage2, Granule};
        use s2mmu_el2::trace::{self, Record};
        let cfg = HarvestConfig {
            mode: Some(dirty::WP_GET),
            period: Duration::from_millis(100),
            drop_invalidations_from: Some(4),
            discard_log: None,
            change: Default::default(),
            cut_after: Some(Duration::from_secs(30)),
        };
        let Some(r) = run(
            2,
            cfg,
            "quiet s2mmu.run=dirtier s2mmu.args=mem=48,file=8,secs=6",
        ) else {
            return;
        };
        let d = r.dirty.expect("the harvester ran");
        let t = d.el2_trace.expect("EL2's trace came back");
        assert_eq!(t.dropped, 0, "the ring held the whole window");
        assert!(t.collapsed > 0, "no block collapsed while withheld");
        let recs = trace::decode_all(&t.bytes, t.records as usize)
            .unwrap_or_else(|i| panic!("record {i} of {} does not decode", t.records));
        let fmt = Arm64Stage2::new(Granule::K4, 40).unwrap();
        let (mut before, mut marks, mut table) = (0, 0, 0);
        for rec in &recs {
            match rec {
                Record::Withheld { table: tb } => {
                    // Everything up to here was EL2 running as it does.
                    assert_eq!(bbm::take_violations(), vec![], "EL2 broke a rule");
                    bbm::expect_violations(*tb);
                    (marks, table) = (marks + 1, *tb);
                }
                Record::Event(e) => {
                    before += u64::from(marks == 0);
                    bbm::export::replay(&fmt, e);
                }
            }
        }
        eprintln!(
            "{} records ({} dropped), {before} before the mark, {} blocks collapsed withheld",
            recs.len(),
            t.dropped,
            t.collapsed
        );
        assert_eq!(marks, 1);
        assert!(before > 0, "the clean part of the trace is empty");
        assert_eq!(bbm::take_violations(), vec![], "violations on other tables");
        let caught = bbm::take_table_violations(table);
        for rule in [
            Rule::MakeBeforeInvalidate,
            Rule::ReportBeforeInvalidate,
            Rule::FreeBeforeInvalidate,
        ] {
            let n = caught.iter().filter(|v| v.rule == rule).count();
            eprintln!("{rule:?}: {n} caught");
            assert!(
                n > 0,
                "withheld invalidations not caught as {rule:?}: {caught:?}"
            );
        }
    }
}

s2mmu_arm64::linux_test! {
    el2
    /// The same fixed amount of work in both placements: the dirtier writes
    /// every page of a framebuffer slot only it uses once a pass, each pass
    /// started by the host after the harvest that collected the last. Under
    /// write protection (GET re-protecting, or rings) each page then faults
    /// once a pass, wherever the engine runs: the per-pass counts are the
    /// same, and are the slot's pages.
    fn fixed_work_faults_per_pass_are_the_same_in_both_placements(a) {
        use s2mmu_arm64::linux::compare::{self, CompareSpec, PACED_PASSES};
        let spec = CompareSpec {
            runs: 1,
            cmdline: "quiet".into(),
            dirtier_args: String::new(),
            harvest: Duration::from_millis(100),
        };
        for mode in [dirty::WP_GET, dirty::RING] {
            let mut per = Vec::new();
            for engine in [Engine::Host, Engine::El2] {
                let boot = LinuxConfig {
                    echo: false,
                    engine,
                    ..test_support::linux_config(&a, 2, "")
                };
                let p = compare::fixed_passes(&spec, &boot, mode).expect("the fixed work runs");
                eprintln!("{mode:?} {engine:?}: faults per pass {p:?}");
                per.push(p);
            }
            assert_eq!(per[0], per[1], "{mode:?}: host, then EL2");
            assert_eq!(
                per[0],
                vec![FB_SIZE / 4096; PACED_PASSES as usize],
                "{mode:?}"
            );
        }
    }
}
