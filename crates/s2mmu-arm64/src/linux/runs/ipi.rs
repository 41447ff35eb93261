//! SGIs a second between the Linux VM's vCPUs (`s2mmu linux --run ipi`):
//! the EL1 guest of `asm/el1_tests.S` (its IPI scenario) as the VM's
//! kernel turns every vCPU on, each waiting in WFI with its SGIs enabled;
//! vCPU 0 then sends 20,000 SGIs, each to every vCPU (itself included),
//! and prints the counter ticks they took. Each write is trapped, raised
//! for every target and kicked only to those in their guest that need it,
//! whichever placement runs the engine (the SGI writes trap to the host's
//! GIC in both; with the engine at EL2 its stage-2 faults on the image's
//! RAM are answered there). The same image under QEMU alone (its own GICv3 and PSCI, no EL2: the
//! writes are not trapped) is the outside reference.

use crate::linux::vm::{self, Engine, LinuxConfig};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// The assembled EL1 test image (empty where binutils was missing when
/// the crate was built).
const IMAGE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/el1_tests.bin"));

/// The IPI scenario's number in the image's table (written into the
/// header's word at byte 64).
const IPI_SCENARIO: u64 = 10;

/// One run's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct IpiRun {
    /// SGI writes a second, as the guest's counter timed them.
    pub sgis_per_s: f64,
    /// Interrupt exits of every vCPU but 0: the kicks that woke a target
    /// (0 under QEMU alone, which has no exits).
    pub kicked_exits: u64,
}

/// The image and a one-page initrd in a directory of their own, removed
/// when dropped.
pub struct IpiFiles {
    dir: PathBuf,
    /// The EL1 image with the IPI scenario.
    pub kernel: PathBuf,
    initrd: PathBuf,
}

impl Drop for IpiFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl IpiFiles {
    /// Writes the image under the system's temporary directory.
    ///
    /// # Errors
    /// The image was not assembled (binutils for aarch64 missing at build
    /// time), or the files cannot be written.
    pub fn new() -> Result<IpiFiles, String> {
        if IMAGE.len() <= 72 {
            return Err(
                "the EL1 test image was not assembled (binutils-aarch64-linux-gnu was \
                 missing when s2mmu-arm64 was built)"
                    .into(),
            );
        }
        let dir = std::env::temp_dir().join(format!("s2mmu-ipi-{}", std::process::id()));
        let io = |e: std::io::Error| format!("{}: {e}", dir.display());
        std::fs::create_dir_all(&dir).map_err(io)?;
        let mut img = IMAGE.to_vec();
        img[64..72].copy_from_slice(&IPI_SCENARIO.to_le_bytes());
        let (kernel, initrd) = (dir.join("Image"), dir.join("initrd"));
        std::fs::write(&kernel, img).map_err(io)?;
        std::fs::write(&initrd, [0u8; 4096]).map_err(io)?;
        Ok(IpiFiles {
            dir,
            kernel,
            initrd,
        })
    }

    /// One run on the Linux VM with `vcpus` vCPUs (1..=[`vm::MAX_VCPUS`])
    /// and its engine where `engine` says, stopped after `timeout` at
    /// most.
    ///
    /// # Errors
    /// The VM failed, or the guest printed no well-formed result.
    pub fn run(&self, vcpus: usize, engine: Engine, timeout: Duration) -> Result<IpiRun, String> {
        let r = vm::run(&LinuxConfig {
            vcpus,
            mem: vm::MIN_MEM,
            kernel: self.kernel.clone(),
            initrd: self.initrd.clone(),
            cmdline: String::new(),
            echo: false,
            timeout,
            dirty: Default::default(),
            ram_pages: Default::default(),
            engine,
        })
        .map_err(|e| format!("the VM: {e}"))?;
        Ok(IpiRun {
            sgis_per_s: rate(&r.console, vcpus)?,
            kicked_exits: r.vcpu_exits.iter().skip(1).map(|e| e[4]).sum(),
        })
    }

    /// One run of the same image under QEMU alone with `vcpus` CPUs
    /// (`S2MMU_QEMU`, or `qemu-system-aarch64` on the path), killed after
    /// `timeout`.
    ///
    /// # Errors
    /// QEMU did not run, or printed no well-formed result.
    pub fn qemu_alone(&self, vcpus: usize, timeout: Duration) -> Result<IpiRun, String> {
        let qemu = std::env::var_os("S2MMU_QEMU")
            .map_or_else(|| PathBuf::from("qemu-system-aarch64"), PathBuf::from);
        let qemu = qemu.as_path();
        let out = Command::new("timeout")
            .arg(format!("{}s", timeout.as_secs().max(1)))
            .arg(qemu)
            .args(["-M", "virt,gic-version=3", "-cpu", "max", "-m", "128"])
            .args(["-smp", &vcpus.to_string(), "-display", "none"])
            .args(["-serial", "stdio", "-monitor", "none", "-kernel"])
            .arg(&self.kernel)
            .output()
            .map_err(|e| format!("{}: {e}", qemu.display()))?;
        let console = String::from_utf8_lossy(&out.stdout);
        Ok(IpiRun {
            sgis_per_s: rate(&console, vcpus)?,
            kicked_exits: 0,
        })
    }
}

/// SGI writes a second from the guest's `el1: ipi` line: vCPUs, SGIs
/// sent, ticks, ticks a second, SGIs vCPU 0 took (all of them: it is a
/// target of every one), in hexadecimal.
///
/// # Errors
/// No such line, or one that does not fit `vcpus`.
pub fn rate(console: &str, vcpus: usize) -> Result<f64, String> {
    let line = console
        .lines()
        .find_map(|l| l.trim_end().strip_prefix("el1: ipi "))
        .ok_or_else(|| format!("the guest printed no \"el1: ipi\" line; console:\n{console}"))?;
    let w: Vec<u64> = line
        .split_whitespace()
        .map(|x| u64::from_str_radix(x, 16))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the ipi line {line:?}: {e}"))?;
    if w.len() != 5 || w[0] != vcpus as u64 || w[2] == 0 || w[3] == 0 || w[4] != w[1] {
        return Err(format!("the ipi line {line:?} does not fit {vcpus} vCPUs"));
    }
    Ok(w[1] as f64 * w[3] as f64 / w[2] as f64)
}

#[cfg(test)]
mod tests {
    use super::rate;

    #[test]
    fn the_rate_is_read_from_the_ipi_line_and_checked() {
        // 2 vCPUs, 0x4e20 SGIs in 0x3b9aca0 ticks at 62.5 MHz.
        let c = "boot\nel1: ipi 2 4e20 3b9aca0 3b9aca0 4e20\n";
        assert_eq!(rate(c, 2), Ok(20_000.0));
        assert!(rate(c, 4).unwrap_err().contains("does not fit 4 vCPUs"));
        assert!(rate("el1: ipi 2 4e20 0 3b9aca0 4e20\n", 2).is_err());
        assert!(rate("el1: ipi 2 4e20 10 3b9aca0 4e1f\n", 2).is_err());
        assert!(rate("el1: ipi 2 zz 10 10 zz\n", 2).is_err());
        assert!(rate("nothing\n", 1)
            .unwrap_err()
            .contains("no \"el1: ipi\""));
    }
}
