//! `s2mmu migrate --guest linux`: Debian's arm64 Linux, booted on one
//! QEMU machine under the engine's stage 2, migrated in this process to a
//! second QEMU machine through the `s2mmu-migrate` library (pre-copy over
//! the engine's dirty log, stop-and-copy, the vCPU and device state, the
//! memories' digests compared, resume), `--runs` times. The guest runs
//! `counter` at one small step a second (near idle); the destination must
//! print the counter's next line.

use super::Params;
use s2mmu_arm64::linux::assets::{self, AssetOptions};
use s2mmu_arm64::linux::dirty::{HarvestConfig, LinuxDirty};
use s2mmu_arm64::linux::migrate::LinuxVm;
use s2mmu_arm64::linux::vm::LinuxConfig;
use s2mmu_migrate::driver::{self, MigrationReport, Policy};
use std::time::{Duration, Instant};

/// Most `--runs`.
pub const MAX_RUNS: u32 = 20;

fn config(p: &Params, a: &assets::LinuxAssets) -> LinuxConfig {
    LinuxConfig {
        vcpus: p.vcpus,
        mem: p.mem,
        kernel: a.image.clone(),
        initrd: a.initramfs.clone(),
        cmdline: "quiet s2mmu.run=counter s2mmu.args=kib=4,ms=1000".into(),
        echo: false,
        timeout: Duration::from_secs(3600),
        dirty: HarvestConfig {
            mode: LinuxDirty::Off,
            period: Duration::from_millis(100),
            drop_invalidations_from: None,
            discard_log: None,
            change: Default::default(),
        },
    }
}

/// The counter's step numbers on a console (lines printed up to their
/// hash at least, so that each number is whole).
fn steps(text: &str) -> Vec<u64> {
    text.lines()
        .filter_map(|l| {
            let (n, _) = l.split("s2mmu-counter: n=").nth(1)?.split_once(" hash=")?;
            n.parse().ok()
        })
        .collect()
}

/// The counter's last whole step number on a console.
fn last_step(text: &str) -> Option<u64> {
    steps(text).last().copied()
}

fn wait_step(vm: &LinuxVm, min: u64, what: &str) -> Result<u64, String> {
    let t = Instant::now();
    loop {
        if let Some(n) = last_step(&vm.console().contents()).filter(|&n| n >= min) {
            return Ok(n);
        }
        if let Some(r) = vm.stopped() {
            return Err(format!("{what}: the guest stopped ({r:?})"));
        }
        if t.elapsed() > Duration::from_secs(900) {
            return Err(format!("{what}: no counter step {min} after 900 s"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One migration: boot, run, migrate, check the destination goes on.
fn one(cfg: &LinuxConfig) -> Result<(MigrationReport, u64), String> {
    let mut a = LinuxVm::boot(cfg).map_err(|e| format!("machine A: {e}"))?;
    let n = wait_step(&a, 2, "machine A")?;
    let mut b = LinuxVm::blank(cfg).map_err(|e| format!("machine B: {e}"))?;
    let r = driver::migrate(&mut a, &mut b, &Policy::default()).map_err(|e| e.to_string())?;
    let a_text = a.console().contents();
    let at_switch = last_step(&a_text).unwrap_or(n);
    wait_step(&b, at_switch + 1, "machine B")?;
    // A line the switch cut in two is whole only in A's text and B's
    // joined: every step once, in order, across the switch.
    let all = steps(&format!("{a_text}{}", b.console().contents()));
    if all.windows(2).any(|w| w[1] != w[0] + 1) {
        return Err(format!(
            "the guest's counter steps across the switch: {all:?}"
        ));
    }
    let next = at_switch + 1;
    b.shut_down().map_err(|e| format!("machine B: {e}"))?;
    Ok((r, next))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Median, least and most.
fn summary(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let mid = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    (mid, v[0], v[v.len() - 1])
}

/// `s2mmu migrate --guest linux`.
///
/// # Errors
/// A bad option, missing assets or QEMU, a failed migration.
pub fn main(p: &Params) -> Result<(), String> {
    if !(1..=MAX_RUNS).contains(&p.runs) {
        return Err(format!("--runs {}: 1 to {MAX_RUNS}", p.runs));
    }
    if p.listen.is_some() || p.to.is_some() {
        return Err("--guest linux migrates in one process: no --listen or --to".into());
    }
    s2mmu_arm64::available().map_err(|e| format!("--guest linux needs the arm64 model: {e}"))?;
    let a = assets::ensure(&AssetOptions::from_env())
        .map_err(|e| format!("--guest linux needs Debian's arm64 kernel: {e}"))?;
    let cfg = config(p, &a);
    let mut runs = Vec::new();
    for i in 0..p.runs {
        let (r, next) = one(&cfg)?;
        if !p.quiet {
            eprintln!(
                "run {}: downtime {:.1} ms (pause {:.1} ms, B's digest {:.1} ms), A's digest \
                 compared after it in {:.1} ms, {} rounds, {} pages at the switch, {} state \
                 bytes; B went on at counter step {next}",
                i + 1,
                ms(r.downtime),
                ms(r.pause_time),
                ms(r.dest_digest_time),
                ms(r.digest_time),
                r.rounds.len(),
                r.final_pages,
                r.state_bytes
            );
        }
        runs.push(r);
    }
    let down = summary(runs.iter().map(|r| ms(r.downtime)).collect());
    let verify = summary(runs.iter().map(|r| ms(r.digest_time)).collect());
    if p.json {
        let v = serde_json::json!({
            "guest": "linux", "vcpus": p.vcpus, "mem": p.mem, "runs": p.runs,
            "downtime_ms": {"median": down.0, "min": down.1, "max": down.2},
            "source_digest_after_resume_ms": {"median": verify.0, "min": verify.1, "max": verify.2},
            "per_run": runs.iter().map(|r| serde_json::json!({
                "downtime_ms": ms(r.downtime), "pause_ms": ms(r.pause_time),
                "dest_digest_ms": ms(r.dest_digest_time),
                "source_digest_ms": ms(r.digest_time), "rounds": r.rounds.len(),
                "round_ms": r.rounds.iter().map(|x| ms(x.time)).collect::<Vec<_>>(),
                "round_pages": r.rounds.iter().map(|x| x.pages).collect::<Vec<_>>(),
                "final_pages": r.final_pages, "state_bytes": r.state_bytes,
            })).collect::<Vec<_>>(),
        });
        println!("{v}");
    } else {
        println!(
            "Linux guest, {} vCPU(s), {} MiB, {} run(s): downtime median {:.1} ms \
             (min {:.1}, max {:.1}); the source's digest, compared after the destination \
             resumed: {:.1} ms (min {:.1}, max {:.1})",
            p.vcpus,
            p.mem >> 20,
            p.runs,
            down.0,
            down.1,
            down.2,
            verify.0,
            verify.1,
            verify.2
        );
        println!(
            "note: QEMU timings are an emulator's (TCG), on this machine: read them as ratios"
        );
    }
    Ok(())
}
