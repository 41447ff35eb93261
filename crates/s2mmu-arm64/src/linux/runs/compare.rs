//! The two placements of the engine back to back ([`engine_compare`]):
//! per run and placement, the boot to init, then the dirtier under each
//! logging mode of [`COMPARED_MODES`] (its write rate, the stage-2 fault
//! cost from the abort to the return to the guest, the faults and logged
//! pages per harvest), with QEMU booting the same kernel alone as the
//! outside reference; and per mode a fixed amount of work
//! ([`HostChange::Paced`]: [`PACED_PASSES`] passes over a framebuffer
//! slot only the dirtier writes), whose per-pass fault counts must be the
//! same in both placements. [`EngineComparison`] keeps every sample; its
//! medians and ratios are what a report prints.

use crate::linux::changes::{HostChange, FB_IPA, FB_SIZE};
use crate::linux::dirty;
use crate::linux::run::{dirtier_rate, verdict};
use crate::linux::vm::{self, Engine, LinuxConfig, LinuxReport};
use s2mmu::mmu::DirtyMode;
use std::collections::BTreeMap;
use std::time::Duration;

/// The logging modes compared, by the command's names: `wp-get` re-protects
/// on GET, `wp` is GET then CLEAR, `ring` the dirty ring.
pub const COMPARED_MODES: [(&str, DirtyMode); 3] = [
    ("wp-get", dirty::WP_GET),
    ("wp", dirty::MANUAL),
    ("ring", dirty::RING),
];

/// The dirtier's arguments when the caller names none.
pub const DIRTIER_ARGS: &str = "mem=48,file=8,secs=10";

/// Passes of the fixed-work run.
pub const PACED_PASSES: u64 = 8;

/// What [`engine_compare`] runs.
#[derive(Clone, Debug)]
pub struct CompareSpec {
    /// Runs of both placements (each run boots each placement once per
    /// mode, plus once without logging).
    pub runs: usize,
    /// The kernel command line before the dirtier's words.
    pub cmdline: String,
    /// The dirtier's `s2mmu.args`.
    pub dirtier_args: String,
    /// The time between harvests.
    pub harvest: Duration,
}

/// Every sample of a comparison, keyed `placement.mode.quantity` (or
/// `placement.boot_to_init_s`, `qemu_alone.boot_to_init_s`).
#[derive(Clone, Debug, Default)]
pub struct EngineComparison {
    /// The samples, one per run.
    pub samples: BTreeMap<String, Vec<f64>>,
    /// The fixed-work run's faults per pass, keyed `placement.mode`, one
    /// list per run: the framebuffer pages each pass got logged, which
    /// under write protection are its write faults (each page faults once
    /// a pass, the pass after a harvest re-protected it).
    pub per_pass: BTreeMap<String, Vec<Vec<u64>>>,
}

impl EngineComparison {
    fn add(&mut self, key: String, v: Option<f64>) {
        if let Some(v) = v.filter(|v| v.is_finite()) {
            self.samples.entry(key).or_default().push(v);
        }
    }

    /// The median of each quantity over the runs.
    pub fn medians(&self) -> BTreeMap<String, f64> {
        self.samples
            .iter()
            .filter_map(|(k, v)| s2mmu_stats::median(v).map(|m| (k.clone(), m)))
            .collect()
    }

    /// Per mode: whether every run's per-pass fault counts were the same
    /// in both placements (`false` where a placement has none).
    pub fn per_pass_equal(&self) -> BTreeMap<String, bool> {
        COMPARED_MODES
            .iter()
            .map(|(mn, _)| {
                let h = self.per_pass.get(&format!("host.{mn}"));
                let e = self.per_pass.get(&format!("el2.{mn}"));
                let same = h.zip(e).is_some_and(|(h, e)| !h.is_empty() && h == e);
                (mn.to_string(), same)
            })
            .collect()
    }

    /// Ratios of the medians: the EL2 placement over the host's per mode
    /// (write rate, fault cost, faults per logged page) and each
    /// placement's boot over QEMU alone's; `None` where a side has no
    /// sample.
    pub fn ratios(&self) -> BTreeMap<String, Option<f64>> {
        let m = self.medians();
        let ratio = |a: &str, b: &str| m.get(a).zip(m.get(b)).map(|(a, b)| a / b);
        let mut out = BTreeMap::new();
        for (mn, _) in COMPARED_MODES {
            for (q, name) in [
                ("pages_per_s", "write_rate"),
                ("fault_us", "fault_cost"),
                ("faults_per_logged_page", "faults_per_logged_page"),
            ] {
                out.insert(
                    format!("{mn}.{name}_el2_over_host"),
                    ratio(&format!("el2.{mn}.{q}"), &format!("host.{mn}.{q}")),
                );
            }
        }
        for en in ["host", "el2"] {
            out.insert(
                format!("{en}.boot_over_qemu_alone"),
                ratio(&format!("{en}.boot_to_init_s"), "qemu_alone.boot_to_init_s"),
            );
        }
        out
    }
}

/// The placement's name in sample keys.
pub fn engine_name(e: Engine) -> &'static str {
    match e {
        Engine::Host => "host",
        Engine::El2 => "el2",
    }
}

/// The mean stage-2 fault cost of a run in µs, from the abort's vector
/// entry to the `ERET`: at EL2 without an exit, or the host's round trip.
fn fault_us(e: Engine, r: &LinuxReport) -> Option<f64> {
    let (n, ns) = match e {
        Engine::Host => (r.s2_round_trips, r.s2_round_trip_ns),
        Engine::El2 => (r.el2_faults, r.el2_fault_ns),
    };
    (n > 0).then(|| ns as f64 / n as f64 / 1e3)
}

/// Stage-2 faults of a run, wherever they were answered.
fn faults(r: &LinuxReport) -> u64 {
    r.exits[0] + r.el2_faults
}

fn run_one(cfg: &LinuxConfig) -> Result<LinuxReport, String> {
    let r = vm::run(cfg).map_err(|e| format!("{:?}: {e}", cfg.engine))?;
    verdict(cfg.vcpus, &r).map_err(|e| format!("{:?}: {e}", cfg.engine))?;
    Ok(r)
}

/// One mode's run of the dirtier on `boot`'s placement.
fn one_mode(
    spec: &CompareSpec,
    boot: &LinuxConfig,
    (mn, mode): (&str, DirtyMode),
    out: &mut EngineComparison,
    progress: &mut dyn FnMut(&str),
) -> Result<(), String> {
    let (e, en) = (boot.engine, engine_name(boot.engine));
    let mut cfg = boot.clone();
    cfg.cmdline = format!(
        "{} s2mmu.run=dirtier s2mmu.args={}",
        spec.cmdline, spec.dirtier_args
    );
    cfg.dirty.mode = Some(mode);
    cfg.dirty.period = spec.harvest;
    let r = run_one(&cfg)?;
    let d = r.dirty.clone().unwrap_or_default();
    let h = d.harvests.max(1) as f64;
    let (rate, cost, n) = (dirtier_rate(&r.console), fault_us(e, &r), faults(&r));
    out.add(format!("{en}.{mn}.pages_per_s"), rate);
    out.add(format!("{en}.{mn}.fault_us"), cost);
    out.add(format!("{en}.{mn}.faults_per_harvest"), Some(n as f64 / h));
    out.add(
        format!("{en}.{mn}.logged_per_harvest"),
        Some(d.logged as f64 / h),
    );
    out.add(
        format!("{en}.{mn}.faults_per_logged_page"),
        (d.logged > 0).then(|| n as f64 / d.logged as f64),
    );
    out.add(format!("{en}.{mn}.lost_pages"), Some(d.lost as f64));
    progress(&format!(
        "  {en} {mn}: {:.0} pages/s, fault {:.2} us, {n} faults, {} logged, {} harvests, {} lost",
        rate.unwrap_or(0.0),
        cost.unwrap_or(0.0),
        d.logged,
        d.harvests,
        d.lost
    ));
    Ok(())
}

/// The fixed-work run of mode `mn` on `boot`'s placement: the framebuffer
/// pages logged per pass.
///
/// # Errors
/// As [`fixed_passes`].
fn one_paced(
    spec: &CompareSpec,
    boot: &LinuxConfig,
    (mn, mode): (&str, DirtyMode),
    out: &mut EngineComparison,
    progress: &mut dyn FnMut(&str),
) -> Result<(), String> {
    let per = fixed_passes(spec, boot, mode)?;
    let en = engine_name(boot.engine);
    progress(&format!("  {en} {mn} fixed work: faults per pass {per:?}"));
    out.per_pass
        .entry(format!("{en}.{mn}"))
        .or_default()
        .push(per);
    Ok(())
}

/// Runs the dirtier's fixed amount of work ([`PACED_PASSES`] passes over
/// the framebuffer, [`HostChange::Paced`]) on `boot`'s placement under
/// `mode`, harvested every `spec.harvest`: the framebuffer pages logged
/// in each pass.
///
/// # Errors
/// A run that fails, does not power off or fails its verdict; a dirtier
/// that does not report its fixed passes done, or a pass count short.
pub fn fixed_passes(
    spec: &CompareSpec,
    boot: &LinuxConfig,
    mode: DirtyMode,
) -> Result<Vec<u64>, String> {
    let mut cfg = boot.clone();
    cfg.cmdline = format!(
        "{} s2mmu.run=dirtier s2mmu.args=fb={FB_IPA:#x}:{FB_SIZE:#x},paced={PACED_PASSES},secs=300",
        spec.cmdline
    );
    cfg.dirty.mode = Some(mode);
    cfg.dirty.period = spec.harvest;
    cfg.dirty.change = HostChange::Paced {
        passes: PACED_PASSES,
    };
    let r = run_one(&cfg)?;
    if !r.console.contains("s2mmu-dirtier: ok fb") {
        return Err(format!(
            "{:?}: the fixed-work dirtier did not finish:\n{}",
            cfg.engine, r.console
        ));
    }
    let per = r.dirty.map(|d| d.per_pass).unwrap_or_default();
    if per.len() as u64 != PACED_PASSES {
        return Err(format!(
            "{:?}: {} of {PACED_PASSES} fixed passes recorded: {per:?}",
            cfg.engine,
            per.len()
        ));
    }
    Ok(per)
}

/// Runs both placements `spec.runs` times from `base` (its engine and
/// logging are replaced), with `qemu_alone` (QEMU booting the same kernel
/// alone, its boot-to-init seconds) once per run. `progress` gets a line
/// per run and per mode.
///
/// # Errors
/// A run that fails, does not power off, or fails its verdict; the
/// reference's failure.
pub fn engine_compare(
    spec: &CompareSpec,
    base: &LinuxConfig,
    qemu_alone: &mut dyn FnMut() -> Result<f64, String>,
    progress: &mut dyn FnMut(&str),
) -> Result<EngineComparison, String> {
    let mut out = EngineComparison::default();
    for run in 1..=spec.runs {
        progress(&format!("run {run}:"));
        for e in [Engine::Host, Engine::El2] {
            let boot = LinuxConfig {
                engine: e,
                cmdline: spec.cmdline.clone(),
                echo: false,
                dirty: Default::default(),
                ..base.clone()
            };
            let r = run_one(&boot)?;
            out.add(format!("{}.boot_to_init_s", engine_name(e)), r.init_s);
            for m in COMPARED_MODES {
                one_mode(spec, &boot, m, &mut out, progress)?;
                one_paced(spec, &boot, m, &mut out, progress)?;
            }
        }
        out.add("qemu_alone.boot_to_init_s".into(), Some(qemu_alone()?));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_are_medians_over_medians() {
        let mut c = EngineComparison::default();
        for (k, v) in [
            ("el2.wp.pages_per_s", [30.0, 10.0, 20.0]),
            ("host.wp.pages_per_s", [1.0, 2.0, 4.0]),
            ("el2.boot_to_init_s", [5.0, 5.0, 6.0]),
            ("qemu_alone.boot_to_init_s", [10.0, 10.0, 10.0]),
        ] {
            for x in v {
                c.add(k.into(), Some(x));
            }
        }
        c.add("host.wp.fault_us".into(), Some(f64::NAN));
        let r = c.ratios();
        assert_eq!(r["wp.write_rate_el2_over_host"], Some(10.0));
        assert_eq!(r["el2.boot_over_qemu_alone"], Some(0.5));
        assert_eq!(r["wp.fault_cost_el2_over_host"], None);
        assert_eq!(r["host.boot_over_qemu_alone"], None);
        assert!(!c.samples.contains_key("host.wp.fault_us"));
    }

    #[test]
    fn per_pass_counts_are_equal_only_when_every_run_matches() {
        let mut c = EngineComparison::default();
        let runs = |a: &[u64], b: &[u64]| vec![a.to_vec(), b.to_vec()];
        c.per_pass
            .insert("host.wp".into(), runs(&[256, 256], &[256, 256]));
        c.per_pass
            .insert("el2.wp".into(), runs(&[256, 256], &[256, 256]));
        c.per_pass
            .insert("host.ring".into(), runs(&[256, 256], &[256, 256]));
        c.per_pass
            .insert("el2.ring".into(), runs(&[256, 256], &[256, 255]));
        c.per_pass
            .insert("host.wp-get".into(), runs(&[256], &[256]));
        let eq = c.per_pass_equal();
        assert!(eq["wp"]);
        assert!(!eq["ring"], "one pass of one run differs");
        assert!(!eq["wp-get"], "no EL2 runs");
    }
}
