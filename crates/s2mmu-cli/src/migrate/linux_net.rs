//! `s2mmu migrate --guest linux` through the migration library's session
//! (pre-copy): in one process (machine A's source and machine B's
//! destination as two threads over loopback, mutual TLS with an ephemeral
//! identity unless `--no-tls`), or in two (`--listen ADDR` starts its own
//! QEMU machine from the HEADER; `--to ADDR` boots the guest and sends
//! it), secured as the simulated guest's two processes are. The flags,
//! limits, deadlines and refusals are the simulated guest's
//! ([`Params::source_config`], [`Params::dest_config`],
//! [`Params::net_config`]).

use super::net::{self, NetConfig};
use super::Params;
use s2mmu_arm64::linux::migrate::LinuxVm;
use s2mmu_arm64::linux::session_dest::LinuxDest;
use s2mmu_arm64::linux::session_source::{LinuxSessionVm, LinuxSource};
use s2mmu_arm64::linux::vm::LinuxConfig;
use s2mmu_migrate::session::dest::{serve_with, DestConfig, DestOutcome};
use s2mmu_migrate::session::guest::SourceGuest;
use s2mmu_migrate::session::source::{run_source, Harvest, SourceConfig, SourceOutcome};
use s2mmu_migrate::{MigratableVm, Pausable};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// The counter steps whose lines began on a console: `n` of every
/// `s2mmu-counter: n=<n> ` (the number whole: a space follows it).
pub fn begun_steps(text: &str) -> Vec<u64> {
    text.split("s2mmu-counter: n=")
        .skip(1)
        .filter_map(|r| r.split_once(' ')?.0.parse().ok())
        .collect()
}

/// The session's settings from the flags: the simulated guest's, with the
/// harvest the Linux VM's dirty log needs (GET and CLEAR of bitmaps).
///
/// # Errors
/// A flag out of range, by name.
pub fn session_config(p: &Params) -> Result<SourceConfig, String> {
    let mut cfg = p.source_config(p.baseline)?.session;
    cfg.harvest = Harvest::Bitmap;
    Ok(cfg)
}

fn dest_config(p: &Params) -> DestConfig {
    let mut d = p.dest_config(p.baseline);
    // The Linux destination's RAM is QEMU's file, mapped already.
    d.prefault = false;
    d
}

fn dest_factory(cfg: &LinuxConfig) -> Arc<LinuxDest> {
    Arc::new(LinuxDest::new(cfg.echo, cfg.timeout))
}

/// One migration of `src` in this process: B built by the session from the
/// HEADER, both ends over loopback secured as `net` says.
///
/// # Errors
/// The first side's error, as text.
pub fn in_process(
    p: &Params,
    src: &LinuxSource,
    cfg: &LinuxConfig,
    net: &NetConfig,
) -> Result<(SourceOutcome, DestOutcome, Arc<LinuxSessionVm>), String> {
    let scfg = session_config(p)?;
    let listener = net::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = listener.local();
    let dcfg = dest_config(p);
    let factory = dest_factory(cfg);
    let (d2, n2, f2) = (dcfg.clone(), net.clone(), factory.clone());
    let served = std::thread::Builder::new()
        .name("linux-destination".into())
        .spawn(move || serve_with(&*listener, &*f2, &d2, &n2))
        .map_err(|e| format!("the destination's thread: {e}"))?;
    let s = run_source(src, &scfg, &mut |_| {
        net::client(net::connect(&addr, net)?, net)
    });
    if s.is_err() {
        dcfg.stop.store(true, Ordering::SeqCst);
    }
    let d = served
        .join()
        .map_err(|_| "the destination's thread panicked".to_string())?;
    let s = s.map_err(|e| format!("source: {e}"))?;
    let d = d.map_err(|e| format!("destination: {e}"))?;
    let b = factory.built().ok_or("the destination built no guest")?;
    Ok((s, d, b))
}

/// `--to ADDR`: migrates the guest `a` (booted here) to `addr`. Returns
/// the outcome and the bytes of the guest's state.
///
/// # Errors
/// A flag out of range, the guest not booting, a failed migration.
pub fn source_to(p: &Params, addr: &str, a: LinuxVm) -> Result<(SourceOutcome, usize), String> {
    let scfg = session_config(p)?;
    let net = p.net_config()?;
    let src = LinuxSource::new(a);
    let s = run_source(&src, &scfg, &mut |_| {
        net::client(net::connect(addr, &net)?, &net)
    })
    .map_err(|e| format!("source: {e}"))?;
    let mut a = src.vm().lock();
    let text = a.console().contents();
    let last = begun_steps(&text).last().copied().unwrap_or(0);
    eprintln!(
        "source: migrated to {addr} ({}); downtime {:.1} ms; counter step {last} was the \
         last the source's guest began",
        net.security.describe(),
        s.downtime.as_secs_f64() * 1e3
    );
    // The source's guest stays paused: it must never run again.
    std::thread::sleep(Duration::from_millis(500));
    if a.console().contents() != text {
        return Err("the source's guest printed after the switch".into());
    }
    let state_bytes = a.save_state().map_or(0, |v| v.len());
    drop(a);
    Ok((s, state_bytes))
}

/// `--listen ADDR`: serves one migration into a QEMU machine this process
/// starts from the HEADER (up to `--attempts` sources), runs the guest on
/// and checks its counter goes on step by step.
///
/// # Errors
/// A bad flag, every attempt failing, the guest not going on.
pub fn listen(p: &Params, cfg: &LinuxConfig, addr: &str) -> Result<(), String> {
    session_config(p)?;
    let net = p.net_config()?;
    let dcfg = dest_config(p);
    let listener = net::bind(addr).map_err(|e| e.to_string())?;
    eprintln!(
        "destination listening on {} ({}); accepts a Linux guest with at most {} MiB of memory, \
         {} vCPUs",
        listener.local(),
        net.security.describe(),
        dcfg.limits.max_mem >> 20,
        dcfg.limits.max_vcpus
    );
    let factory = dest_factory(cfg);
    let mut failures = 0;
    let d = loop {
        match serve_with(&*listener, &*factory, &dcfg, &net) {
            Ok(d) => break d,
            Err(e) => {
                failures += 1;
                if failures >= p.attempts {
                    return Err(format!(
                        "the migration failed ({failures} of --attempts {}): {e}",
                        p.attempts
                    ));
                }
                eprintln!("the migration failed ({failures} of --attempts {}): {e}; the guest was not resumed, serving the next source", p.attempts);
            }
        }
    };
    let b = factory.built().ok_or("the destination built no guest")?;
    let mut vm = b.lock();
    vm.resume()
        .map_err(|e| format!("the destination's guest: {e}"))?;
    let first = super::linux::wait_for(&vm, "the destination", |t| {
        let s = begun_steps(t);
        (s.len() >= 2).then(|| s[0])
    })?;
    let steps = begun_steps(&vm.console().contents());
    if steps.windows(2).any(|w| w[1] != w[0] + 1) {
        return Err(format!("the destination's counter skips: {steps:?}"));
    }
    vm.shut_down()
        .map_err(|e| format!("the destination's guest: {e}"))?;
    let digests: Vec<String> = d
        .slot_digests
        .iter()
        .map(|(id, v)| format!("slot {id}: {v:#018x}"))
        .collect();
    println!(
        "destination: received {} page records over {} channel(s), resumed the Linux guest \
         (memory digests {}); counter step {first} was the first the destination's guest began, \
         then {} more in order",
        d.page_records,
        d.channels,
        digests.join(", "),
        steps.len() - 1
    );
    Ok(())
}
