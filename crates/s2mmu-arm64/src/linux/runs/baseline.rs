//! The reference boot: QEMU running the same kernel and initramfs itself,
//! at EL1, with no stage 2 of ours (`-M virt,gic-version=3 -cpu
//! max,pauth-impdef=on`, no `virtualization=on`).
//!
//! [`run_baseline`] measures host seconds from QEMU's start to `/init`'s
//! `s2mmu-init: cpus online N` line and to QEMU's exit after `poweroff -f`
//! (PSCI SYSTEM_OFF). The benchmark compares the engine's boot with these
//! on the same machine; this module only measures and reports.

use s2mmu_stats::median;
use std::fmt;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::linux::assets::LinuxAssets;

/// The line `/init` prints once the vCPUs are counted.
pub const INIT_LINE: &str = "s2mmu-init: cpus online ";
/// The most console bytes a run keeps (the rest is dropped from the front).
const CONSOLE_CAP: usize = 1 << 20;

/// One direct-QEMU boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaselineConfig {
    /// vCPUs, 1..=8.
    pub cpus: u32,
    /// RAM in MiB, 128..=4096.
    pub mem_mib: u64,
    /// The guest program `/init` runs (`s2mmu.run=`), or `none`.
    pub run: String,
    /// Its arguments, comma-separated (`s2mmu.args=`); `+` separates
    /// those of each program when `run` names several (`a+b`).
    pub args: String,
    /// More kernel parameters, space-separated (e.g. `mem=448M`).
    pub extra_append: String,
    /// Give up (and kill QEMU) after this long; at most 30 minutes.
    pub timeout: Duration,
}

/// What a boot printed and how long it took.
#[derive(Debug, Clone, PartialEq)]
pub struct BaselineReport {
    /// Seconds from QEMU's start to the `s2mmu-init: cpus online` line.
    pub init_s: f64,
    /// Seconds from QEMU's start to its exit.
    pub poweroff_s: f64,
    /// The count that line gave.
    pub cpus_online: u32,
    /// QEMU's exit status was success.
    pub exit_ok: bool,
    /// The console (its last MiB).
    pub console: String,
}

/// Why a baseline boot could not run or finish.
#[derive(Debug)]
pub enum BaselineError {
    /// A configuration value out of range (names it).
    Config(String),
    /// QEMU is not installed (with the package to install).
    NoQemu(String),
    /// No init line, or no exit, before the timeout (the console's tail).
    Timeout(String),
    /// QEMU exited before `/init` printed its line (the console's tail).
    NoInit(String),
}

impl fmt::Display for BaselineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BaselineError::Config(w) => write!(f, "baseline boot: {w}"),
            BaselineError::NoQemu(e) => write!(
                f,
                "qemu-system-aarch64 could not start ({e}): run `apt-get install qemu-system-arm`"
            ),
            BaselineError::Timeout(t) => write!(f, "baseline boot timed out; console ends:\n{t}"),
            BaselineError::NoInit(t) => {
                write!(f, "QEMU exited before /init's line; console ends:\n{t}")
            }
        }
    }
}

impl std::error::Error for BaselineError {}

/// A `s2mmu.run` or `s2mmu.args` value: one command-line word, no quotes.
fn check_word(what: &str, v: &str) -> Result<(), BaselineError> {
    let ok = v.len() <= 256
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.,=:/+".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(BaselineError::Config(format!(
            "{what} {v:?}: up to 256 of [A-Za-z0-9_-.,=:/+]"
        )))
    }
}

impl BaselineConfig {
    /// Checks every bound.
    ///
    /// # Errors
    /// [`BaselineError::Config`] naming the value.
    pub fn validate(&self) -> Result<(), BaselineError> {
        if !(1..=8).contains(&self.cpus) {
            return Err(BaselineError::Config(format!(
                "{} vCPUs: 1 to 8",
                self.cpus
            )));
        }
        if !(128..=4096).contains(&self.mem_mib) {
            return Err(BaselineError::Config(format!(
                "{} MiB: 128 to 4096",
                self.mem_mib
            )));
        }
        if self.timeout > Duration::from_secs(1800) || self.timeout.is_zero() {
            return Err(BaselineError::Config(format!(
                "timeout {:?}: up to 30 min",
                self.timeout
            )));
        }
        check_word("s2mmu.run", &self.run)?;
        check_word("s2mmu.args", &self.args)?;
        if self.extra_append.len() > 1024 {
            return Err(BaselineError::Config(
                "extra kernel parameters over 1024 bytes".into(),
            ));
        }
        self.extra_append
            .split_whitespace()
            .try_for_each(|w| check_word("kernel parameter", w))
    }

    /// The kernel command line (console on the `virt` PL011).
    pub fn append(&self) -> String {
        let mut a = format!("console=ttyAMA0 quiet s2mmu.run={}", self.run);
        if !self.args.is_empty() {
            a.push_str(&format!(" s2mmu.args={}", self.args));
        }
        for w in self.extra_append.split_whitespace() {
            a.push(' ');
            a.push_str(w);
        }
        a
    }
}

/// The number on `/init`'s count line in `console`, once the whole line
/// is there.
pub fn cpus_online(console: &str) -> Option<u32> {
    let at = console.find(INIT_LINE)? + INIT_LINE.len();
    let (digits, _) = console[at..].split_once('\n')?;
    digits.trim_end_matches('\r').parse().ok()
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

fn spawn(assets: &LinuxAssets, cfg: &BaselineConfig) -> Result<Child, BaselineError> {
    Command::new("qemu-system-aarch64")
        .args(["-M", "virt,gic-version=3", "-cpu", "max,pauth-impdef=on"])
        .args([
            "-smp",
            &cfg.cpus.to_string(),
            "-m",
            &format!("{}M", cfg.mem_mib),
        ])
        .args(["-nographic", "-no-reboot", "-kernel"])
        .arg(&assets.image)
        .arg("-initrd")
        .arg(&assets.initramfs)
        .args(["-append", &cfg.append()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| BaselineError::NoQemu(e.to_string()))
}

type Readers = (
    mpsc::Receiver<Vec<u8>>,
    std::thread::JoinHandle<()>,
    std::thread::JoinHandle<String>,
);

/// QEMU's stdout as chunks on a channel (closed at its exit), and its
/// stderr drained on its own thread so a chatty QEMU cannot block on a full
/// pipe (the first 64 KiB kept).
fn readers(child: &mut Child) -> Readers {
    let mut out = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = out.read(&mut buf) {
            if tx.send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    });
    let mut err_pipe = child.stderr.take().expect("piped stderr");
    let errors = std::thread::spawn(move || {
        let mut e = Vec::new();
        let _partial = err_pipe.by_ref().take(1 << 16).read_to_end(&mut e);
        let _rest = std::io::copy(&mut err_pipe, &mut std::io::sink());
        String::from_utf8_lossy(&e).into_owned()
    });
    (rx, reader, errors)
}

/// Boots `assets` under QEMU directly and times it.
///
/// # Errors
/// [`BaselineError::Config`] before anything starts; the others when QEMU
/// is missing, exits early, or runs past the timeout (it is killed).
pub fn run_baseline(
    assets: &LinuxAssets,
    cfg: &BaselineConfig,
) -> Result<BaselineReport, BaselineError> {
    cfg.validate()?;
    let start = Instant::now();
    let mut child = spawn(assets, cfg)?;
    let (rx, reader, errors) = readers(&mut child);
    let deadline = start + cfg.timeout;
    let mut console = String::new();
    let mut init_s = None;
    let exited = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(chunk) => {
                console.push_str(&String::from_utf8_lossy(&chunk));
                if init_s.is_none() {
                    if let Some(n) = cpus_online(&console) {
                        init_s = Some((start.elapsed().as_secs_f64(), n));
                    }
                }
                if console.len() > CONSOLE_CAP {
                    let cut = console.len() - CONSOLE_CAP / 2;
                    let cut = (cut..console.len())
                        .find(|&i| console.is_char_boundary(i))
                        .unwrap_or(0);
                    console.drain(..cut);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break true,
            Err(mpsc::RecvTimeoutError::Timeout) => break false,
        }
    };
    if !exited {
        let _gone = child.kill();
        let _reaped = child.wait();
        let _done = reader.join();
        let _done = errors.join();
        return Err(BaselineError::Timeout(tail(&console)));
    }
    let status = child
        .wait()
        .map_err(|e| BaselineError::NoQemu(e.to_string()))?;
    let poweroff_s = start.elapsed().as_secs_f64();
    let _done = reader.join();
    let err = errors.join().unwrap_or_default();
    let Some((init_s, cpus_online)) = init_s else {
        return Err(BaselineError::NoInit(format!(
            "{}\n{}",
            tail(&console),
            tail(&err)
        )));
    };
    Ok(BaselineReport {
        init_s,
        poweroff_s,
        cpus_online,
        exit_ok: status.success(),
        console,
    })
}

/// Several boots of one configuration, back to back.
#[derive(Debug, Clone, PartialEq)]
pub struct BaselineSummary {
    /// Each run's (seconds to the init line, seconds to QEMU's exit).
    pub runs: Vec<(f64, f64)>,
    /// The median of the first.
    pub median_init_s: f64,
    /// The median of the second.
    pub median_poweroff_s: f64,
}

/// Boots `cfg` `runs` times (1..=20) and takes the medians. Every run must
/// reach init with all vCPUs online and exit cleanly.
///
/// # Errors
/// [`BaselineError::Config`] for `runs` out of range or a run with vCPUs
/// missing or an unclean exit; [`run_baseline`]'s errors.
pub fn measure(
    assets: &LinuxAssets,
    cfg: &BaselineConfig,
    runs: u32,
) -> Result<BaselineSummary, BaselineError> {
    if !(1..=20).contains(&runs) {
        return Err(BaselineError::Config(format!("{runs} runs: 1 to 20")));
    }
    cfg.validate()?;
    let mut out = Vec::with_capacity(runs as usize);
    for _ in 0..runs {
        let r = run_baseline(assets, cfg)?;
        if r.cpus_online != cfg.cpus || !r.exit_ok {
            return Err(BaselineError::Config(format!(
                "a run had {} of {} vCPUs online, exit ok: {}; console ends:\n{}",
                r.cpus_online,
                cfg.cpus,
                r.exit_ok,
                tail(&r.console)
            )));
        }
        out.push((r.init_s, r.poweroff_s));
    }
    Ok(BaselineSummary {
        median_init_s: median(&out.iter().map(|r| r.0).collect::<Vec<_>>()).unwrap_or(0.0),
        median_poweroff_s: median(&out.iter().map(|r| r.1).collect::<Vec<_>>()).unwrap_or(0.0),
        runs: out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_init_line_counts_only_when_complete() {
        assert_eq!(
            cpus_online("boot\ns2mmu-init: cpus online 2\r\nmore"),
            Some(2)
        );
        assert_eq!(
            cpus_online("s2mmu-init: cpus online 1"),
            None,
            "more digits may follow"
        );
        assert_eq!(cpus_online("s2mmu-init: cpus online x\n"), None);
        assert_eq!(cpus_online("nothing\n"), None);
    }

    #[test]
    fn bad_configurations_are_refused_by_name() {
        let ok = BaselineConfig {
            cpus: 2,
            mem_mib: 512,
            run: "dirtier+counter".into(),
            args: "mem=32,secs=4+secs=2".into(),
            extra_append: "mem=448M".into(),
            timeout: Duration::from_secs(60),
        };
        ok.validate().unwrap();
        assert_eq!(
            ok.append(),
            "console=ttyAMA0 quiet s2mmu.run=dirtier+counter s2mmu.args=mem=32,secs=4+secs=2 mem=448M"
        );
        let bad: [fn(&mut BaselineConfig); 6] = [
            |c| c.cpus = 9,
            |c| c.mem_mib = 64,
            |c| c.run = "a b".into(),
            |c| c.args = "x\"y".into(),
            |c| c.extra_append = "init=/bin/sh;reboot".into(),
            |c| c.timeout = Duration::ZERO,
        ];
        for f in bad {
            let mut c = ok.clone();
            f(&mut c);
            assert!(
                matches!(c.validate(), Err(BaselineError::Config(_))),
                "{c:?}"
            );
        }
    }
}
