//! A blank Linux VM loaded with a guest: the kernel, the initramfs and
//! the device tree in its RAM (`load/`), and the boot vCPU's registers.

use super::config::LinuxConfig;
use super::LinuxVm;
use crate::layout;
use crate::linux::assets::LinuxAssets;
use crate::linux::boot;
use crate::linux::fdt::FdtConfig;
use crate::linux::gic::GICR_STRIDE;
use crate::linux::loader::LoadTarget;
use crate::linux::psci::PowerState;
use crate::linux::shared::{Power, RAM_IPA};
use crate::machine::SharedRam;
use crate::{Arm64Error, Result};

/// Guest RAM as the loader writes it: the shared RAM behind the memslot.
struct SlotRam<'a> {
    ram: &'a SharedRam,
    size: u64,
}

impl LoadTarget for SlotRam<'_> {
    fn range(&self) -> (u64, u64) {
        (RAM_IPA, self.size)
    }
    fn write(&mut self, gpa: u64, data: &[u8]) {
        // The loader writes only inside `range`, which the RAM holds.
        let pa = layout::DATA + (gpa - RAM_IPA);
        self.ram
            .write_bytes(pa, data)
            .expect("guest RAM lies inside the machine's data region");
    }
}

impl LinuxVm {
    /// Loads `cfg`'s kernel, initramfs and device tree into this blank
    /// VM's RAM (the device tree with the framebuffer the engine's host
    /// change maps): the power state to start from, vCPU 0 at the
    /// kernel's entry with the device tree's address in x0.
    ///
    /// # Errors
    /// [`Arm64Error::Config`] for files that do not load; the engine's
    /// refusal of the framebuffer's slot.
    pub(in crate::linux) fn load(&mut self, cfg: &LinuxConfig) -> Result<Power> {
        let bootargs = format!(
            "console=ttyS0 earlycon=uart8250,mmio,{:#x} {}",
            self.layout.uart, cfg.cmdline
        );
        let mut f = FdtConfig::virt(self.mem, self.vcpus as u32, &bootargs);
        f.gicr.1 = GICR_STRIDE * self.vcpus as u64;
        crate::linux::changes::add_framebuffer(
            self.placement(),
            self.spec.change,
            self.mem,
            &mut f,
        )?;
        let files = LinuxAssets {
            image: cfg.kernel.clone(),
            initramfs: cfg.initrd.clone(),
            kernel_version: String::new(),
        };
        let mut ram = SlotRam {
            ram: self.machine.ram(),
            size: self.mem,
        };
        let boot = boot::load_linux(&mut ram, &files, &f)
            .map_err(|e| Arm64Error::Config(format!("loading the kernel: {e}")))?;
        let mut power = Power {
            state: vec![PowerState::Off; self.vcpus],
            start: vec![None; self.vcpus],
        };
        power.state[0] = PowerState::OnPending;
        power.start[0] = Some((boot.entry, boot.dtb));
        Ok(power)
    }
}
