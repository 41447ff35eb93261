//! Auto-converge on a real KVM guest: the writer guest, re-dirtying a
//! working set faster than a capped link sends it, migrated over TCP in
//! this process
//! (the destination on a thread) with the dirty bitmap. With the
//! throttle (QEMU's cpu_throttle on the vCPU threads, raised per round)
//! the migration must converge, having throttled, with every page equal
//! on both ends; without it the same migration must fail at the round
//! limit, never having throttled (tried up to three times: a host loaded
//! enough to keep the vCPU off the CPU for a round converges it by
//! itself). The verdicts are counts and the library's round records, not
//! timings.
//! Where the build found no usable /dev/kvm the test is ignored with the
//! reason (`build.rs`).

use s2mmu_kvm::migrate::session_vm::KvmDirtyLog;
use s2mmu_kvm::migrate::writer::WriterGuest;
use s2mmu_kvm::migrate::writer_dest::{Started, WriterDest};
use s2mmu_migrate::session::dest::{serve_with, DestConfig};
use s2mmu_migrate::session::policy::{Converge, Harvest};
use s2mmu_migrate::session::source::{run_source, SourceConfig, SourceOutcome};
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::transport::{self, NetConfig};
use s2mmu_migrate::vm::SessionVm;
use s2mmu_migrate::wire::Compression;
use std::sync::mpsc;
use std::time::Duration;

/// The link's cap, bytes per second: 2048 pages a second.
const LINK: u64 = 8 << 20;
/// Pages the guest writes per pass: a round sends them in half a
/// second, eight times the budget's half; unthrottled, the guest
/// re-dirties them many times a round even on a loaded host. At 99 %
/// it runs 10 ms a second, so about every other round sees no write.
const WORKING_SET: u64 = 1024;
/// The downtime budget: the migration ends once a round leaves at most
/// half of it to send (about 120 pages at this link).
const MAX_DOWNTIME: Duration = Duration::from_millis(120);
/// Rounds before the migration gives up: room for the throttle's nine
/// steps (20 % to 99 %) after its two rounds of grace, and a dozen
/// rounds at 99 %.
const MAX_ROUNDS: u32 = 24;

fn net() -> NetConfig {
    NetConfig::plain(Duration::from_secs(20))
}

/// What one migration did.
struct Run {
    out: Result<SourceOutcome, MigrateError>,
    /// Highest throttle the vCPUs took, and the sleeps they made.
    max_pct: u32,
    sleeps: u64,
    /// Pages that differ between the paused source and the destination.
    differ: Option<usize>,
}

fn migrate(converge: Converge) -> Run {
    let (tx, rx) = mpsc::channel();
    let started: Started = Default::default();
    let dest_started = started.clone();
    let dest = std::thread::spawn(move || {
        let listener = transport::bind("127.0.0.1:0").expect("bind");
        tx.send(listener.local()).expect("the address");
        let factory = WriterDest {
            log: KvmDirtyLog::Bitmap,
            started: dest_started,
            drop_xsave: false,
        };
        let cfg = DestConfig::with_run_after(Duration::from_millis(100));
        serve_with(&*listener, &factory, &cfg, &net()).map(|_| ())
    });
    let addr = rx.recv().expect("the destination's address");
    let kvm = s2mmu_kvm::open_kvm().unwrap();
    let guest =
        WriterGuest::start_with_working_set(&kvm, KvmDirtyLog::Bitmap, 1, WORKING_SET).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let cfg = SourceConfig {
        harvest: Harvest::Bitmap,
        bandwidth: LINK,
        converge,
        max_rounds: MAX_ROUNDS,
        max_downtime: MAX_DOWNTIME,
        // The writer's pages compress; the test needs a link the writer
        // outruns, so every page goes raw and the limit paces raw bytes.
        compression: Compression::Off,
        ..SourceConfig::default()
    };
    let n = net();
    let out = run_source(&guest, &cfg, &mut |_| {
        transport::client(transport::connect(&addr, &n)?, &n)
    });
    let dest_result = dest.join().expect("the destination thread");
    assert!(guest.errors().is_empty(), "{:?}", guest.errors());
    let differ = match (&out, dest_result) {
        (Ok(_), Ok(())) => {
            let here = guest.kvm_vm().ram().page_hashes();
            let r = started.lock().unwrap().take().expect("the guest started");
            assert!(r.errors.is_empty(), "{:?}", r.errors);
            Some(here.iter().zip(&r.hashes).filter(|(a, b)| a != b).count())
        }
        _ => None,
    };
    let t = guest.vcpus().throttle();
    Run {
        max_pct: t.max_pct(),
        sleeps: t.sleeps().0,
        out,
        differ,
    }
}

#[test]
#[cfg_attr(
    not(s2mmu_kvm_device),
    ignore = "needs /dev/kvm, read-write (see the build warning)"
)]
fn a_writer_faster_than_the_link_converges_with_the_throttle_and_not_without() {
    if let Some(reason) = s2mmu_kvm::kvm_unusable_reason() {
        panic!("the build opened /dev/kvm but KVM cannot run this crate's guests: {reason}");
    }
    // A host loaded enough to keep the vCPU thread off the CPU for a
    // round slows the guest as a throttle would, and the run converges by
    // itself: the run without is tried up to three times, and must fail to
    // converge at the round limit once, never having throttled.
    let mut verdicts = Vec::new();
    for _ in 0..3 {
        let without = migrate(Converge::None);
        assert_eq!((without.max_pct, without.sleeps), (0, 0));
        match without.out {
            Err(MigrateError::NotConverged { rounds, .. }) => {
                assert_eq!(rounds, MAX_ROUNDS + 1, "it gave up early");
                verdicts.push(format!("not converged after {rounds} rounds"));
                break;
            }
            Ok(out) => verdicts.push(format!(
                "converged (dirty pages per round {:?})",
                out.rounds.iter().map(|r| r.dirty_after).collect::<Vec<_>>()
            )),
            Err(e) => panic!("without a throttle: {e}"),
        }
    }
    assert!(
        verdicts
            .last()
            .is_some_and(|v| v.starts_with("not converged")),
        "without a throttle the guest never outran the link: {verdicts:?}"
    );

    let with = migrate(Converge::Auto);
    let out = with.out.expect("with the throttle the migration converges");
    let throttled: Vec<u32> = out.rounds.iter().map(|r| r.throttle_pct).collect();
    assert!(
        out.max_throttle_pct >= 20,
        "rounds' throttle: {throttled:?}"
    );
    assert!(
        with.max_pct > 0 && with.sleeps > 0,
        "the vCPUs never slept: highest {} %, {} sleeps",
        with.max_pct,
        with.sleeps
    );
    // The throttle only rises round by round until the end.
    assert!(throttled.windows(2).all(|w| w[0] <= w[1]), "{throttled:?}");
    assert_eq!(with.differ, Some(0), "pages differ after the move");
    eprintln!("without the throttle: {verdicts:?}");
    eprintln!(
        "converged in {} rounds, throttle per round {throttled:?} (vCPUs: highest {} %, {} sleeps)",
        out.rounds.len(),
        with.max_pct,
        with.sleeps
    );
}
