//! `s2mmu linux`'s runs from plain settings, without its flags or
//! printing: the guest's configuration ([`RunSpec::config`]), QEMU's own
//! boot of the same kernel for comparison ([`RunSpec::baseline`]), the
//! checks of a finished run ([`verdict`]), the dirtier's write rate from
//! its console ([`dirtier_rate`]), and the runs of the dirtier without
//! logging and under each dirty mode ([`rate_per_mode`]).

use crate::linux::assets::LinuxAssets;
use crate::linux::baseline::{self, BaselineConfig, BaselineReport};
use crate::linux::dirty::{self, HarvestConfig, HarvestReport};
use crate::linux::vm::{self, LinuxConfig, LinuxReport, StopReason};
use s2mmu::mmu::DirtyMode;
use std::path::PathBuf;
use std::time::Duration;

/// One Linux run's settings (checked by the caller: `vm::run` checks the
/// geometry again).
#[derive(Clone, Debug)]
pub struct RunSpec {
    /// vCPUs.
    pub vcpus: usize,
    /// Guest RAM, bytes.
    pub mem: u64,
    /// An arm64 `Image` instead of the asset cache's.
    pub kernel: Option<PathBuf>,
    /// An initramfs instead of the asset cache's.
    pub initrd: Option<PathBuf>,
    /// Kernel command line words after the console settings.
    pub cmdline: String,
    /// The guest program /init runs.
    pub run: String,
    /// Its arguments, comma-separated.
    pub args: String,
    /// Whether the console also goes to stdout.
    pub echo: bool,
    /// How long the guest may run.
    pub timeout: Duration,
    /// Dirty logging from /init on, in the engine's mode (`None`: none).
    pub dirty: Option<DirtyMode>,
    /// Time between harvests.
    pub harvest: Duration,
    /// Where the stage-2 engine runs.
    pub engine: crate::linux::vm::Engine,
}

/// Refuses a word (a program name, its arguments) that would break the
/// kernel command line: over 256 characters, a space or a control
/// character; the error names `flag`.
///
/// # Errors
/// What is wrong with `s`.
pub fn check_word(flag: &str, s: &str) -> Result<(), String> {
    if s.len() > 256 || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{flag} {s:?}: at most 256 characters, no spaces or control characters"
        ));
    }
    Ok(())
}

impl RunSpec {
    /// The guest's configuration: the asset cache's kernel and initramfs
    /// unless the spec names others, the program and its arguments on the
    /// command line.
    pub fn config(&self, a: &LinuxAssets) -> LinuxConfig {
        let mut cmdline = format!("{} s2mmu.run={}", self.cmdline, self.run);
        if !self.args.is_empty() {
            cmdline.push_str(&format!(" s2mmu.args={}", self.args));
        }
        LinuxConfig {
            vcpus: self.vcpus,
            mem: self.mem,
            kernel: self.kernel.clone().unwrap_or_else(|| a.image.clone()),
            initrd: self.initrd.clone().unwrap_or_else(|| a.initramfs.clone()),
            cmdline,
            echo: self.echo,
            timeout: self.timeout,
            dirty: HarvestConfig {
                mode: self.dirty,
                period: self.harvest,
                drop_invalidations_from: None,
                discard_log: None,
                change: Default::default(),
                cut_after: None,
            },
            ram_pages: Default::default(),
            engine: self.engine,
        }
    }

    /// Boots the same kernel and initramfs with QEMU alone (EL1, no stage
    /// 2), for the ratio.
    ///
    /// # Errors
    /// QEMU's run failed (`baseline: ...`).
    pub fn baseline(&self, a: &LinuxAssets) -> Result<BaselineReport, String> {
        baseline::run_baseline(
            a,
            &BaselineConfig {
                cpus: self.vcpus as u32,
                mem_mib: self.mem >> 20,
                run: self.run.clone(),
                args: self.args.clone(),
                extra_append: String::new(),
                timeout: self.timeout,
            },
        )
        .map_err(|e| format!("baseline: {e}"))
    }
}

/// Checks a finished run of `vcpus` vCPUs: it powered off, /init counted
/// every vCPU, no page changed outside the dirty log, the dirtier did not
/// fail.
///
/// # Errors
/// The first of those that does not hold.
pub fn verdict(vcpus: usize, r: &LinuxReport) -> Result<(), String> {
    if r.reason != StopReason::PowerOff {
        return Err(format!("the guest did not power off: {:?}", r.reason));
    }
    if r.cpus_online != Some(vcpus as u32) {
        return Err(format!(
            "/init counted {:?} CPUs online, expected {}",
            r.cpus_online, vcpus
        ));
    }
    if let Some(d) = &r.dirty {
        if d.lost > 0 {
            return Err(format!(
                "{} pages changed in no dirty log (first: {:x?})",
                d.lost, d.lost_examples
            ));
        }
    }
    if r.console.contains("s2mmu-dirtier: FAIL") {
        return Err("the guest's dirtier reported a failure".into());
    }
    Ok(())
}

/// The write rate the dirtier printed on its `ok` line (`pages_per_s=R`).
pub fn dirtier_rate(console: &str) -> Option<f64> {
    console
        .lines()
        .filter(|l| l.contains("s2mmu-dirtier: ok"))
        .find_map(|l| l.split("pages_per_s=").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|r| r.parse::<f64>().ok())
}

/// The dirty modes [`rate_per_mode`] runs, no logging first, by the
/// command's names: `wp` and `hw` the engine's (GET then CLEAR), `wp-get`
/// and `hw-get` the same with GET re-protecting (`KVM_GET_DIRTY_LOG`
/// alone).
pub const RATE_MODES: [(Option<DirtyMode>, &str); 5] = [
    (None, "off"),
    (Some(dirty::WP_GET), "wp-get"),
    (Some(dirty::MANUAL), "wp"),
    (Some(dirty::RING), "ring"),
    (Some(dirty::HW_GET), "hw-get"),
];

/// One mode's runs of the dirtier.
#[derive(Clone, Debug, PartialEq)]
pub struct ModeRates {
    /// The mode's name ([`RATE_MODES`]).
    pub name: &'static str,
    /// The dirtier's rate in each run.
    pub pages_per_s: Vec<f64>,
    /// Harvests in each run.
    pub harvests: Vec<u64>,
    /// Pages lost, all runs together.
    pub lost: u64,
}

/// Runs the dirtier of `cfg` without logging and under each mode, `runs`
/// times each (the modes interleaved, so that the load drifts over all
/// alike); `each` sees every run (its number, the mode's name, the rate,
/// the harvests' report) as it ends.
///
/// # Errors
/// A run that fails, does not power off, loses a page, or whose dirtier
/// prints no rate (each naming the mode).
pub fn rate_per_mode(
    mut cfg: LinuxConfig,
    runs: usize,
    each: &mut dyn FnMut(usize, &str, f64, &HarvestReport),
) -> Result<Vec<ModeRates>, String> {
    let mut rows: Vec<ModeRates> = RATE_MODES
        .iter()
        .map(|&(_, name)| ModeRates {
            name,
            pages_per_s: Vec::new(),
            harvests: Vec::new(),
            lost: 0,
        })
        .collect();
    for run in 1..=runs {
        for (row, &(mode, name)) in rows.iter_mut().zip(RATE_MODES.iter()) {
            cfg.dirty.mode = mode;
            let r = vm::run(&cfg).map_err(|e| format!("{name}: {e}"))?;
            verdict(cfg.vcpus, &r).map_err(|e| format!("{name}: {e}"))?;
            let rate = dirtier_rate(&r.console)
                .ok_or_else(|| format!("{name}: the dirtier printed no ok line with its rate"))?;
            let d = r.dirty.unwrap_or_default();
            each(run, name, rate, &d);
            row.pages_per_s.push(rate);
            row.harvests.push(d.harvests);
            row.lost += d.lost;
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::{check_word, dirtier_rate};

    #[test]
    fn the_dirtier_rate_is_read_from_its_ok_line() {
        let c = "boot\ns2mmu-dirtier: ok pages_per_s=1234.5 secs=2\n";
        assert_eq!(dirtier_rate(c), Some(1234.5));
        assert_eq!(dirtier_rate("s2mmu-dirtier: FAIL pages_per_s=9\n"), None);
        assert_eq!(dirtier_rate("s2mmu-dirtier: ok pages_per_s=x\n"), None);
    }

    #[test]
    fn a_word_with_a_space_is_refused_by_flag() {
        assert!(check_word("--run", "dirtier").is_ok());
        let e = check_word("--args", "a b").unwrap_err();
        assert!(e.starts_with("--args \"a b\""), "{e}");
        assert!(check_word("--run", &"x".repeat(257)).is_err());
    }
}
