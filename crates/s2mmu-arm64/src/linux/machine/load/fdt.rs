//! The guest's device tree, written with rust-vmm's `vm-fdt`.
//!
//! Nodes and properties follow what QEMU's `virt` machine gives Linux
//! (`-M virt,gic-version=3,dumpdtb=...`), cut to the hardware the host
//! models: memory, CPUs started through PSCI over HVC, a GICv3 (distributor
//! and redistributors; the virtual CPU interface is the ICC system
//! registers, nothing in the tree), the architected timer, a 16550 UART,
//! `/chosen` with the command line and the initrd, and optionally a
//! region outside RAM that the guest maps through `/dev/mem` (no driver
//! binds its `compatible`, so the kernel leaves it to user space).

use std::fmt;

use vm_fdt::FdtWriter;

use crate::linux::uart::UART_CLOCK_HZ;

/// The most vCPUs a tree describes (the stub's mailboxes).
pub const MAX_VCPUS: u32 = 8;
/// The smallest guest RAM a tree describes.
pub const MIN_MEM: u64 = 16 << 20;
/// The largest guest RAM a tree describes.
pub const MAX_MEM: u64 = 1 << 40;
/// One GICv3 redistributor (RD_base + SGI_base frames).
pub const GICR_STRIDE: u64 = 0x2_0000;
/// arm64's `COMMAND_LINE_SIZE`, terminating NUL included.
pub const MAX_BOOTARGS: usize = 2048;

/// The timer's four PPIs as the architecture numbers them (INTID - 16);
/// QEMU's `virt` uses 13, 14, 11, 10.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerPpis {
    /// Secure physical timer.
    pub secure_phys: u32,
    /// Non-secure physical timer.
    pub phys: u32,
    /// Virtual timer (the one an EL1 guest uses).
    pub virt: u32,
    /// EL2 physical timer.
    pub hyp: u32,
}

impl Default for TimerPpis {
    fn default() -> Self {
        TimerPpis {
            secure_phys: 13,
            phys: 14,
            virt: 11,
            hyp: 10,
        }
    }
}

/// Everything the tree describes. Addresses are guest-physical.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FdtConfig {
    /// Guest RAM base (2 MiB aligned).
    pub mem_base: u64,
    /// Guest RAM size (2 MiB multiple, [`MIN_MEM`]..=[`MAX_MEM`]).
    pub mem_size: u64,
    /// vCPUs, 1..=[`MAX_VCPUS`]; CPU n has MPIDR Aff0 = n.
    pub cpus: u32,
    /// GICv3 distributor (base, size).
    pub gicd: (u64, u64),
    /// GICv3 redistributors (base, size): at least `cpus` x [`GICR_STRIDE`].
    pub gicr: (u64, u64),
    /// The 16550: (base, size, SPI number 0..988).
    pub uart: (u64, u64, u32),
    /// The kernel command line.
    pub bootargs: String,
    /// The initrd's guest-physical [start, end), inside RAM.
    pub initrd: Option<(u64, u64)>,
    /// The timer's PPIs.
    pub timer_ppis: TimerPpis,
    /// The GIC maintenance interrupt's PPI (9 on `virt`).
    pub maintenance_ppi: u32,
    /// A region outside RAM for `/dev/mem` (base, size), page aligned.
    pub framebuffer: Option<(u64, u64)>,
}

impl FdtConfig {
    /// QEMU `virt`'s layout: RAM at 1 GiB, GICD at 0x0800_0000, GICR at
    /// 0x080a_0000, a UART at 0x0900_0000 with SPI 1 (where `virt` has its
    /// PL011; the host models a 16550 there instead).
    pub fn virt(mem_size: u64, cpus: u32, bootargs: &str) -> FdtConfig {
        FdtConfig {
            mem_base: 0x4000_0000,
            mem_size,
            cpus,
            gicd: (0x0800_0000, 0x1_0000),
            gicr: (0x080a_0000, 0xf6_0000),
            uart: (0x0900_0000, 0x1000, 1),
            bootargs: bootargs.to_string(),
            initrd: None,
            timer_ppis: TimerPpis::default(),
            maintenance_ppi: 9,
            framebuffer: None,
        }
    }
}

/// A configuration the tree cannot describe (names the field), or the
/// writer's failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FdtError {
    /// vCPUs outside 1..=8.
    Cpus(u32),
    /// RAM size outside the bounds or not a 2 MiB multiple.
    MemSize(u64),
    /// A base not aligned as required (what, base, alignment).
    Misaligned(&'static str, u64, u64),
    /// A region that is empty or wraps past 2^64.
    BadRegion(&'static str, u64, u64),
    /// Two regions overlap.
    Overlap(&'static str, &'static str),
    /// The redistributor region is smaller than `cpus` frames.
    GicrTooSmall {
        /// Its size.
        size: u64,
        /// What `cpus` needs.
        needed: u64,
    },
    /// An interrupt number outside its range (what, number).
    Irq(&'static str, u32),
    /// The command line is too long or holds a NUL.
    Bootargs(String),
    /// The initrd is empty, reversed or not inside RAM.
    Initrd(u64, u64),
    /// `vm-fdt` refused (its message).
    Writer(String),
}

impl fmt::Display for FdtError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FdtError::Cpus(n) => write!(f, "{n} vCPUs: the tree describes 1 to {MAX_VCPUS}"),
            FdtError::MemSize(s) => write!(
                f,
                "RAM of {s:#x} bytes: must be a 2 MiB multiple in [{MIN_MEM:#x}, {MAX_MEM:#x}]"
            ),
            FdtError::Misaligned(w, b, a) => write!(f, "{w} at {b:#x}: not {a:#x}-aligned"),
            FdtError::BadRegion(w, b, s) => {
                write!(f, "{w} [{b:#x}, +{s:#x}): empty or past the address space")
            }
            FdtError::Overlap(a, b) => write!(f, "{a} overlaps {b}"),
            FdtError::GicrTooSmall { size, needed } => write!(
                f,
                "redistributor region of {size:#x} bytes: the vCPUs need {needed:#x}"
            ),
            FdtError::Irq(w, n) => write!(f, "{w} interrupt {n} out of range"),
            FdtError::Bootargs(why) => write!(f, "kernel command line: {why}"),
            FdtError::Initrd(s, e) => write!(f, "initrd [{s:#x}, {e:#x}) is not inside RAM"),
            FdtError::Writer(e) => write!(f, "vm-fdt: {e}"),
        }
    }
}

impl std::error::Error for FdtError {}

impl From<vm_fdt::Error> for FdtError {
    fn from(e: vm_fdt::Error) -> Self {
        FdtError::Writer(e.to_string())
    }
}

const GIC_PHANDLE: u32 = 1;
/// Interrupt specifier cells: type (0 SPI, 1 PPI), number, flags.
const IRQ_SPI: u32 = 0;
const IRQ_PPI: u32 = 1;
const IRQ_LEVEL_HIGH: u32 = 4;

fn region(what: &'static str, base: u64, size: u64) -> Result<(u64, u64), FdtError> {
    match base.checked_add(size) {
        Some(end) if size > 0 => Ok((base, end)),
        _ => Err(FdtError::BadRegion(what, base, size)),
    }
}

fn check_memory(c: &FdtConfig) -> Result<(), FdtError> {
    if !(1..=MAX_VCPUS).contains(&c.cpus) {
        return Err(FdtError::Cpus(c.cpus));
    }
    if !(MIN_MEM..=MAX_MEM).contains(&c.mem_size) || !c.mem_size.is_multiple_of(2 << 20) {
        return Err(FdtError::MemSize(c.mem_size));
    }
    if !c.mem_base.is_multiple_of(2 << 20) {
        return Err(FdtError::Misaligned("RAM", c.mem_base, 2 << 20));
    }
    if c.bootargs.len() >= MAX_BOOTARGS {
        let n = c.bootargs.len();
        return Err(FdtError::Bootargs(format!(
            "{n} bytes, the kernel takes {}",
            MAX_BOOTARGS - 1
        )));
    }
    if c.bootargs.contains('\0') {
        return Err(FdtError::Bootargs("holds a NUL byte".into()));
    }
    Ok(())
}

fn check_irqs(c: &FdtConfig) -> Result<(), FdtError> {
    let t = c.timer_ppis;
    for (w, p) in [
        ("secure physical timer PPI", t.secure_phys),
        ("physical timer PPI", t.phys),
        ("virtual timer PPI", t.virt),
        ("hypervisor timer PPI", t.hyp),
        ("maintenance PPI", c.maintenance_ppi),
    ] {
        if p >= 16 {
            return Err(FdtError::Irq(w, p));
        }
    }
    // SPIs are INTID 32..1020.
    if c.uart.2 >= 988 {
        return Err(FdtError::Irq("UART SPI", c.uart.2));
    }
    Ok(())
}

/// Checks every bound of `c`: the errors [`build`] returns before writing.
///
/// # Errors
/// The first [`FdtError`] found.
pub fn validate(c: &FdtConfig) -> Result<(), FdtError> {
    check_memory(c)?;
    check_irqs(c)?;
    let mut regions = vec![
        ("RAM", region("RAM", c.mem_base, c.mem_size)?),
        (
            "GIC distributor",
            region("GIC distributor", c.gicd.0, c.gicd.1)?,
        ),
        (
            "GIC redistributors",
            region("GIC redistributors", c.gicr.0, c.gicr.1)?,
        ),
        ("UART", region("UART", c.uart.0, c.uart.1)?),
    ];
    for (w, (b, _)) in &regions[1..] {
        if b % 0x1000 != 0 {
            return Err(FdtError::Misaligned(w, *b, 0x1000));
        }
    }
    let needed = u64::from(c.cpus) * GICR_STRIDE;
    if c.gicr.1 < needed {
        return Err(FdtError::GicrTooSmall {
            size: c.gicr.1,
            needed,
        });
    }
    if let Some((b, s)) = c.framebuffer {
        let r = region("framebuffer", b, s)?;
        if b % 0x1000 != 0 || s % 0x1000 != 0 {
            return Err(FdtError::Misaligned("framebuffer", b, 0x1000));
        }
        regions.push(("framebuffer", r));
    }
    for (i, (wa, (a0, a1))) in regions.iter().enumerate() {
        for (wb, (b0, b1)) in &regions[i + 1..] {
            if a0 < b1 && b0 < a1 {
                return Err(FdtError::Overlap(wa, wb));
            }
        }
    }
    if let Some((s, e)) = c.initrd {
        if s >= e || s < c.mem_base || e > c.mem_base + c.mem_size {
            return Err(FdtError::Initrd(s, e));
        }
    }
    Ok(())
}

/// Writes the tree for `c`.
///
/// # Errors
/// [`validate`]'s errors, or [`FdtError::Writer`].
pub fn build(c: &FdtConfig) -> Result<Vec<u8>, FdtError> {
    validate(c)?;
    let mut w = FdtWriter::new()?;
    let root = w.begin_node("")?;
    w.property_string("compatible", "linux,dummy-virt")?;
    w.property_u32("#address-cells", 2)?;
    w.property_u32("#size-cells", 2)?;
    w.property_u32("interrupt-parent", GIC_PHANDLE)?;
    let n = w.begin_node(&format!("memory@{:x}", c.mem_base))?;
    w.property_string("device_type", "memory")?;
    w.property_array_u64("reg", &[c.mem_base, c.mem_size])?;
    w.end_node(n)?;
    cpus(&mut w, c.cpus)?;
    let n = w.begin_node("psci")?;
    w.property_string_list(
        "compatible",
        vec!["arm,psci-1.0".into(), "arm,psci-0.2".into()],
    )?;
    w.property_string("method", "hvc")?;
    w.end_node(n)?;
    gic(&mut w, c)?;
    timer(&mut w, c.timer_ppis)?;
    let uart = uart(&mut w, c)?;
    if let Some((b, s)) = c.framebuffer {
        let n = w.begin_node(&format!("s2mmu-region@{b:x}"))?;
        w.property_string("compatible", "s2mmu,guest-region")?;
        w.property_array_u64("reg", &[b, s])?;
        w.end_node(n)?;
    }
    let n = w.begin_node("chosen")?;
    w.property_string("bootargs", &c.bootargs)?;
    w.property_string("stdout-path", &uart)?;
    if let Some((s, e)) = c.initrd {
        w.property_u64("linux,initrd-start", s)?;
        w.property_u64("linux,initrd-end", e)?;
    }
    w.end_node(n)?;
    w.end_node(root)?;
    Ok(w.finish()?)
}

fn cpus(w: &mut FdtWriter, cpus: u32) -> Result<(), FdtError> {
    let n = w.begin_node("cpus")?;
    w.property_u32("#address-cells", 1)?;
    w.property_u32("#size-cells", 0)?;
    for i in 0..cpus {
        let c = w.begin_node(&format!("cpu@{i:x}"))?;
        w.property_string("device_type", "cpu")?;
        w.property_string("compatible", "arm,armv8")?;
        w.property_string("enable-method", "psci")?;
        w.property_u32("reg", i)?;
        w.end_node(c)?;
    }
    w.end_node(n)?;
    Ok(())
}

fn gic(w: &mut FdtWriter, c: &FdtConfig) -> Result<(), FdtError> {
    let n = w.begin_node(&format!("intc@{:x}", c.gicd.0))?;
    w.property_string("compatible", "arm,gic-v3")?;
    w.property_u32("#interrupt-cells", 3)?;
    w.property_null("interrupt-controller")?;
    w.property_u32("#redistributor-regions", 1)?;
    w.property_array_u64("reg", &[c.gicd.0, c.gicd.1, c.gicr.0, c.gicr.1])?;
    w.property_array_u32("interrupts", &[IRQ_PPI, c.maintenance_ppi, IRQ_LEVEL_HIGH])?;
    w.property_phandle(GIC_PHANDLE)?;
    w.end_node(n)?;
    Ok(())
}

fn timer(w: &mut FdtWriter, t: TimerPpis) -> Result<(), FdtError> {
    let n = w.begin_node("timer")?;
    w.property_string_list(
        "compatible",
        vec!["arm,armv8-timer".into(), "arm,armv7-timer".into()],
    )?;
    let mut cells = Vec::with_capacity(12);
    for p in [t.secure_phys, t.phys, t.virt, t.hyp] {
        cells.extend_from_slice(&[IRQ_PPI, p, IRQ_LEVEL_HIGH]);
    }
    w.property_array_u32("interrupts", &cells)?;
    w.property_null("always-on")?;
    w.end_node(n)?;
    Ok(())
}

/// Writes the UART node; returns its path for `stdout-path`.
fn uart(w: &mut FdtWriter, c: &FdtConfig) -> Result<String, FdtError> {
    let (base, size, spi) = c.uart;
    let name = format!("uart@{base:x}");
    let n = w.begin_node(&name)?;
    w.property_string("compatible", "ns16550a")?;
    w.property_array_u64("reg", &[base, size])?;
    w.property_array_u32("interrupts", &[IRQ_SPI, spi, IRQ_LEVEL_HIGH])?;
    w.property_u32("clock-frequency", UART_CLOCK_HZ)?;
    w.property_u32("reg-shift", 0)?;
    w.property_u32("reg-io-width", 1)?;
    w.end_node(n)?;
    Ok(format!("/{name}"))
}
