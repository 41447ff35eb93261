//! `s2mmu migrate --guest linux`: Debian's arm64 Linux, booted on one
//! QEMU machine under the engine's stage 2, migrated in this process to a
//! second QEMU machine through the migration library's session (pre-copy
//! over the engine's dirty log, stop-and-copy, the vCPU and device state,
//! the memories' digests compared, resume; loopback TLS unless
//! `--no-tls`; two processes with `--listen`/`--to`, see [`super::linux_net`])
//! or with `--postcopy` by the arm64 crate's post-copy (the destination's
//! stage-2 fault on a missing page is its request), `--runs` times. The guest runs `counter` (one
//! small step a second: the destination must print the next step) or
//! `dirtier` (`--linux-run dirtier`: writes as fast as it can and
//! re-checks every page: the destination must print its `ok`).

use super::linux_net;
use super::net::NetConfig;
use super::params::PostcopyArg;
use super::Params;
use s2mmu_arm64::linux::assets::{self, AssetOptions};
use s2mmu_arm64::linux::dirty::{HarvestConfig, LinuxDirty};
use s2mmu_arm64::linux::migrate::LinuxVm;
use s2mmu_arm64::linux::postcopy::{migrate_postcopy, PostcopyPolicy};
use s2mmu_arm64::linux::session_source::LinuxSource;
use s2mmu_arm64::linux::vm::LinuxConfig;
use s2mmu_migrate::driver::Policy;
use s2mmu_migrate::session::guest::SourceGuest;
use s2mmu_migrate::session::source::SourceOutcome;
use s2mmu_migrate::MigratableVm;
use std::time::{Duration, Instant};

/// Most `--runs`.
pub const MAX_RUNS: u32 = 20;

/// The dirtier's arguments: 64 MiB of anonymous memory and 8 of tmpfs,
/// written as fast as it can (rate 0) for 30 s.
const DIRTIER_ARGS: &str = "mem=64,file=8,rate=0,secs=30";

fn config(p: &Params, a: &assets::LinuxAssets) -> LinuxConfig {
    let run = if p.linux_run == "dirtier" {
        format!("s2mmu.run=dirtier s2mmu.args={DIRTIER_ARGS}")
    } else {
        "s2mmu.run=counter s2mmu.args=kib=4,ms=1000".to_string()
    };
    LinuxConfig {
        vcpus: p.vcpus,
        mem: p.mem,
        kernel: a.image.clone(),
        initrd: a.initramfs.clone(),
        cmdline: format!("quiet {run}"),
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

/// Waits until `vm`'s console shows what `done` finds (its value), failing
/// on a FAIL line of a guest program, the guest stopping, or 900 s.
pub(super) fn wait_for<T>(
    vm: &LinuxVm,
    what: &str,
    done: impl Fn(&str) -> Option<T>,
) -> Result<T, String> {
    let t = Instant::now();
    loop {
        let text = vm.console().contents();
        if let Some(l) = text.lines().find(|l| l.contains(": FAIL")) {
            return Err(format!("{what}: the guest program failed its check: {l}"));
        }
        if let Some(v) = done(&text) {
            return Ok(v);
        }
        if let Some(r) = vm.stopped() {
            return Err(format!("{what}: the guest stopped ({r:?})"));
        }
        if t.elapsed() > Duration::from_secs(900) {
            return Err(format!("{what}: not seen after 900 s"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One run's figures.
struct Run {
    downtime: Duration,
    round_pages: Vec<u64>,
    round_ms: Vec<f64>,
    final_pages: u64,
    state_bytes: usize,
    extra: serde_json::Value,
    line: String,
}

/// A run's figures from the session's outcome; `state_bytes`: the STATE
/// body's size.
fn session_run(s: &SourceOutcome, state_bytes: usize, net: &NetConfig) -> Run {
    let (pre, fin): (Vec<_>, Vec<_>) = s.rounds.iter().partition(|r| !r.final_round);
    Run {
        downtime: s.downtime,
        round_pages: pre.iter().map(|r| r.pages).collect(),
        round_ms: pre.iter().map(|r| (r.end_s - r.start_s) * 1e3).collect(),
        final_pages: fin.iter().map(|r| r.pages).sum(),
        state_bytes,
        extra: serde_json::json!({"security": net.security.describe(),
            "channels": s.channels, "link_bytes_per_s": s.link,
            "page_records": s.page_records, "zero_pages": s.zero_pages}),
        line: format!(
            "through the session, {} over {} channel(s); the destination's digests equal the \
             source's",
            net.security.describe(),
            s.channels
        ),
    }
}

/// Moves A's guest to B by post-copy as `p` says.
fn switch_postcopy(p: &Params, a: &mut LinuxVm, b: &mut LinuxVm) -> Result<Run, String> {
    let pc = Policy::default();
    let policy = match p.postcopy {
        Some(PostcopyArg::On) | None => PostcopyPolicy {
            precopy_passes: 1,
            switch_below_pages: 0,
        },
        Some(PostcopyArg::Auto) => PostcopyPolicy {
            precopy_passes: 1 + pc.max_rounds,
            switch_below_pages: pc.switch_below_pages,
        },
    };
    let r = migrate_postcopy(a, b, &policy).map_err(|e| e.to_string())?;
    Ok(Run {
        downtime: r.downtime,
        round_pages: r.rounds.iter().map(|x| x.0).collect(),
        round_ms: r.rounds.iter().map(|x| ms(x.1)).collect(),
        final_pages: r.final_pages,
        state_bytes: r.state_bytes,
        extra: serde_json::json!({"converged": r.converged, "missing": r.missing,
            "remote_faults": r.remote_faults, "by_fault": r.by_fault,
            "by_background": r.by_background, "postcopy_ms": ms(r.complete)}),
        line: format!(
            "pre-copy {}; {} pages missing at the resume, {} remote faults, {} pages by fault \
             and {} by the background copy in {:.1} ms",
            if r.converged {
                "converged"
            } else {
                "did not converge"
            },
            r.missing,
            r.remote_faults,
            r.by_fault,
            r.by_background,
            ms(r.complete)
        ),
    })
}

/// Boots machine A and waits until its guest program runs.
fn boot_a(p: &Params, cfg: &LinuxConfig) -> Result<LinuxVm, String> {
    let a = LinuxVm::boot(cfg).map_err(|e| format!("machine A: {e}"))?;
    if p.linux_run == "dirtier" {
        wait_for(&a, "machine A", |t| {
            t.contains("s2mmu-dirtier: start").then_some(())
        })?;
        std::thread::sleep(Duration::from_secs(2));
    } else {
        wait_for(&a, "machine A", |t| {
            steps(t).last().filter(|&&n| n >= 2).copied()
        })?;
    }
    Ok(a)
}

/// One migration: boot, run, migrate, check the destination goes on.
fn one(p: &Params, cfg: &LinuxConfig, net: &NetConfig) -> Result<Run, String> {
    let mut a = boot_a(p, cfg)?;
    if p.postcopy.is_some() {
        let mut b = LinuxVm::blank(cfg).map_err(|e| format!("machine B: {e}"))?;
        let run = switch_postcopy(p, &mut a, &mut b)?;
        return goes_on(p, &a, &mut b, run);
    }
    let src = LinuxSource::new(a);
    let (s, _d, b) = linux_net::in_process(p, &src, cfg, net)?;
    let mut a = src.vm().lock();
    let state_bytes = a.save_state().map_or(0, |v| v.len());
    let run = session_run(&s, state_bytes, net);
    let mut b = b.lock();
    // The session ran B's guest for --run-after, then paused it.
    s2mmu_migrate::Pausable::resume(&mut *b).map_err(|e| format!("machine B: {e}"))?;
    goes_on(p, &a, &mut b, run)
}

/// Checks that B's guest goes on from where A's stopped, and A's not.
fn goes_on(p: &Params, a: &LinuxVm, b: &mut LinuxVm, mut run: Run) -> Result<Run, String> {
    let dirtier = p.linux_run == "dirtier";
    let a_text = a.console().contents();
    if dirtier {
        let ok = wait_for(b, "machine B", |t| {
            // Whole lines only: the console may be read mid-line.
            t[..t.rfind('\n').map_or(0, |i| i + 1)]
                .lines()
                .find(|l| l.contains("s2mmu-dirtier: ok"))
                .map(str::to_string)
        })?;
        run.line += &format!("; B: {}", ok.trim());
    } else {
        let at_switch = steps(&a_text).last().copied().unwrap_or(0);
        wait_for(b, "machine B", |t| {
            steps(t).last().filter(|&&n| n > at_switch).copied()
        })?;
        // A line the switch cut in two is whole only in A's text and B's
        // joined: every step once, in order, across the switch.
        let all = steps(&format!("{a_text}{}", b.console().contents()));
        if all.windows(2).any(|w| w[1] != w[0] + 1) {
            return Err(format!(
                "the guest's counter steps across the switch: {all:?}"
            ));
        }
        run.line += &format!("; B went on at counter step {}", at_switch + 1);
    }
    if a.console().contents() != a_text {
        return Err("A's guest printed after the switch".into());
    }
    b.shut_down().map_err(|e| format!("machine B: {e}"))?;
    Ok(run)
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

/// Round 0's pages per second.
fn round0_rate(r: &Run) -> f64 {
    match (r.round_pages.first(), r.round_ms.first()) {
        (Some(&n), Some(&t)) if t > 0.0 => n as f64 / (t / 1e3),
        _ => 0.0,
    }
}

/// The options the Linux guest takes (`--guest auto` picks it only when
/// no other is given).
const LINUX_OPTIONS: &[&str] = &[
    "--mem",
    "--vcpus",
    "-v",
    "--runs",
    "--json",
    "-q",
    "--quiet",
    "--postcopy",
    "--linux-run",
    "--guest",
];

/// The first option in `args` (migrate's, after the subcommand) that the
/// Linux guest does not take.
fn other_option(args: impl Iterator<Item = String>) -> Option<String> {
    args.filter(|a| a.starts_with('-'))
        .map(|a| a.split('=').next().unwrap_or_default().to_string())
        .find(|a| !LINUX_OPTIONS.contains(&a.as_str()))
}

/// Whether `migrate` runs the Linux guest: `--guest linux`, or `--guest
/// auto` (the default) with only options it takes and its prerequisites
/// (QEMU, the EL2 image, the kernel and initramfs) there. When only the
/// prerequisites are missing, says so and how to get them.
pub fn chosen(p: &Params, args: impl Iterator<Item = String>) -> bool {
    match p.guest.as_str() {
        "linux" => return true,
        "sim" => return false,
        _ => {}
    }
    if other_option(args).is_some() {
        return false;
    }
    let why = match s2mmu_arm64::available() {
        Err(e) => format!(
            "{e} (apt-get install qemu-system-arm binutils-aarch64-linux-gnu, then rebuild)"
        ),
        Ok(()) => match assets::ensure(&AssetOptions::from_env()) {
            Err(e) => e.to_string(),
            Ok(_) => {
                if !p.quiet {
                    eprintln!(
                        "migrate: the Linux guest (Debian arm64 on two QEMU machines in this \
                         process); --guest sim for the simulated VM"
                    );
                }
                return true;
            }
        },
    };
    eprintln!("migrate: the simulated guest, because the Linux guest cannot run here: {why}");
    false
}

/// `s2mmu migrate --guest linux`.
///
/// # Errors
/// A bad option, missing assets or QEMU, a failed migration.
pub fn main(p: &Params) -> Result<(), String> {
    if !(1..=MAX_RUNS).contains(&p.runs) {
        return Err(format!("--runs {}: 1 to {MAX_RUNS}", p.runs));
    }
    if p.postcopy.is_some() && (p.listen.is_some() || p.to.is_some()) {
        return Err(
            "--postcopy with --guest linux runs in one process: no --listen or --to".into(),
        );
    }
    if p.runs != 1 && (p.listen.is_some() || p.to.is_some()) {
        return Err(format!(
            "--runs {} with --listen or --to: two processes run one migration",
            p.runs
        ));
    }
    // Every flag the session takes is checked before anything starts.
    linux_net::session_config(p)?;
    let net = p.net_config()?;
    s2mmu_arm64::available().map_err(|e| format!("--guest linux needs the arm64 model: {e}"))?;
    let a = assets::ensure(&AssetOptions::from_env())
        .map_err(|e| format!("--guest linux needs Debian's arm64 kernel: {e}"))?;
    let cfg = config(p, &a);
    if let Some(addr) = &p.listen {
        return linux_net::listen(p, &cfg, addr);
    }
    let mut runs = Vec::new();
    for i in 0..p.runs {
        let r = match &p.to {
            Some(addr) => {
                let (s, state_bytes) = linux_net::source_to(p, addr, boot_a(p, &cfg)?)?;
                session_run(&s, state_bytes, &net)
            }
            None => one(p, &cfg, &net)?,
        };
        if !p.quiet {
            eprintln!(
                "run {}: downtime {:.1} ms, round 0 {:.0} pages/s, {} rounds, {} pages at the \
                 switch, {} state bytes; {}",
                i + 1,
                ms(r.downtime),
                round0_rate(&r),
                r.round_pages.len(),
                r.final_pages,
                r.state_bytes,
                r.line
            );
        }
        runs.push(r);
    }
    report(p, &runs);
    Ok(())
}

fn report(p: &Params, runs: &[Run]) {
    let down = summary(runs.iter().map(|r| ms(r.downtime)).collect());
    let rate = summary(runs.iter().map(round0_rate).collect());
    let mode = match p.postcopy {
        None => "pre-copy",
        Some(PostcopyArg::On) => "post-copy after round 0",
        Some(PostcopyArg::Auto) => "pre-copy, post-copy if it does not converge",
    };
    if p.json {
        let v = serde_json::json!({
            "guest": "linux", "program": p.linux_run, "mode": mode, "vcpus": p.vcpus,
            "mem": p.mem, "runs": p.runs,
            "downtime_ms": {"median": down.0, "min": down.1, "max": down.2},
            "round0_pages_per_s": {"median": rate.0, "min": rate.1, "max": rate.2},
            "per_run": runs.iter().map(|r| serde_json::json!({
                "downtime_ms": ms(r.downtime), "rounds": r.round_pages.len(),
                "round_pages": r.round_pages, "round_ms": r.round_ms,
                "final_pages": r.final_pages, "state_bytes": r.state_bytes,
                "details": r.extra,
            })).collect::<Vec<_>>(),
        });
        println!("{v}");
    } else {
        println!(
            "Linux guest ({}, {mode}), {} vCPU(s), {} MiB, {} run(s): downtime median {:.1} ms \
             (min {:.1}, max {:.1}); round 0 median {:.0} pages/s",
            p.linux_run,
            p.vcpus,
            p.mem >> 20,
            p.runs,
            down.0,
            down.1,
            down.2,
            rate.0
        );
        println!(
            "note: QEMU timings are an emulator's (TCG), on this machine: read them as ratios"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::other_option;

    fn args(a: &[&str]) -> impl Iterator<Item = String> {
        a.iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .into_iter()
    }

    #[test]
    fn auto_takes_linux_only_with_its_options() {
        assert_eq!(other_option(args(&[])), None);
        assert_eq!(
            other_option(args(&[
                "--mem",
                "1G",
                "-v",
                "2",
                "--json",
                "--postcopy=auto"
            ])),
            None
        );
        assert_eq!(
            other_option(args(&["--mem=1G", "--no-tls"])).as_deref(),
            Some("--no-tls")
        );
        assert_eq!(
            other_option(args(&["--dirty-rate", "0"])).as_deref(),
            Some("--dirty-rate")
        );
    }
}
