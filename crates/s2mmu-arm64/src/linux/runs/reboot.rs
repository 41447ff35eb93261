//! What the host does with a guest's PSCI SYSTEM_RESET: stop the VM and
//! report the reset ([`OnReset::Stop`], as [`vm::run`] does), or reboot it
//! ([`OnReset::Reboot`]) as a machine's reset button does: a cold boot on
//! a new machine, so that every vCPU starts from its reset state, every
//! device (interrupt controller, UART, timers, PSCI's power states) from
//! its own, and the RAM from zero, with the kernel, initramfs and device
//! tree loaded again; the guest's deadline runs on across the boots.

use crate::linux::vm::{self, LinuxConfig, LinuxReport, StopReason};
use crate::{Arm64Error, Result};
use std::time::{Duration, Instant};

/// Most reboots [`OnReset::Reboot`] takes.
pub const MAX_REBOOTS: u32 = 100;

/// Bytes of console [`run_rebooting`] keeps across the boots: the last.
const CONSOLE_KEPT: usize = 4 << 20;

/// What a PSCI SYSTEM_RESET from the guest does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnReset {
    /// The VM stops with [`StopReason::Reset`].
    #[default]
    Stop,
    /// The guest boots again, at most `max` times (1..=[`MAX_REBOOTS`]);
    /// a reset past that stops the VM with [`StopReason::Reset`].
    Reboot {
        /// Reboots allowed.
        max: u32,
    },
}

/// Runs the guest of `cfg` as [`vm::run`] does, a SYSTEM_RESET doing what
/// `on_reset` says. The report is the last boot's, but for its console
/// (every boot's, in order: the last 4 MiB), its `total_s` (all boots)
/// and its `reboots`.
///
/// # Errors
/// [`Arm64Error::Config`] for a reboot bound outside 1..=[`MAX_REBOOTS`];
/// as [`vm::run`] for each boot.
pub fn run_rebooting(cfg: &LinuxConfig, on_reset: OnReset) -> Result<LinuxReport> {
    let max = match on_reset {
        OnReset::Stop => 0,
        OnReset::Reboot { max } if (1..=MAX_REBOOTS).contains(&max) => max,
        OnReset::Reboot { max } => {
            return Err(Arm64Error::Config(format!(
                "{max} reboots: use 1 to {MAX_REBOOTS}"
            )))
        }
    };
    let t0 = Instant::now();
    let mut console = String::new();
    let mut reboots = 0;
    loop {
        // The deadline is the whole run's: a boot that starts past it
        // stops at once, as a timeout.
        let left = cfg.timeout.saturating_sub(t0.elapsed());
        let boot = LinuxConfig {
            timeout: left.max(Duration::from_millis(1)),
            ..cfg.clone()
        };
        let mut r = vm::run(&boot)?;
        console.push_str(&r.console);
        if console.len() > CONSOLE_KEPT {
            let mut cut = console.len() - CONSOLE_KEPT;
            while !console.is_char_boundary(cut) {
                cut += 1;
            }
            console.drain(..cut);
        }
        if r.reason == StopReason::Reset && reboots < max {
            reboots += 1;
            continue;
        }
        r.console = console;
        r.total_s = t0.elapsed().as_secs_f64();
        r.reboots = reboots;
        return Ok(r);
    }
}
