//! One call from the asset files to a bootable guest RAM: the kernel and
//! initramfs read (sizes checked against the RAM before anything is
//! allocated), placed by [`loader::load`], and the device tree written for
//! the final initrd range.

use std::fmt;
use std::io::Read;
use std::path::Path;

use crate::linux::assets::LinuxAssets;
use crate::linux::fdt::{self, FdtConfig};
use crate::linux::loader::{self, BootLayout, LoadError, LoadTarget};

/// Why the guest could not be loaded.
#[derive(Debug)]
pub enum BootError {
    /// A file could not be read, or is larger than the guest RAM.
    File(String),
    /// The device tree's RAM differs from the RAM being loaded.
    RamMismatch {
        /// The tree's (base, size).
        fdt: (u64, u64),
        /// The RAM's (base, size).
        ram: (u64, u64),
    },
    /// Placement or the device tree failed.
    Load(LoadError),
}

impl fmt::Display for BootError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BootError::File(e) => write!(f, "{e}"),
            BootError::RamMismatch { fdt, ram } => write!(
                f,
                "device tree describes RAM [{:#x}, +{:#x}) but the guest RAM is [{:#x}, +{:#x})",
                fdt.0, fdt.1, ram.0, ram.1
            ),
            BootError::Load(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for BootError {}

impl From<LoadError> for BootError {
    fn from(e: LoadError) -> Self {
        BootError::Load(e)
    }
}

/// Reads `path` whole, refusing files over `limit` bytes before
/// allocating; the allocation itself is fallible.
///
/// # Errors
/// [`BootError::File`] naming the path.
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, BootError> {
    let err = |e: &dyn fmt::Display| BootError::File(format!("{}: {e}", path.display()));
    let f = std::fs::File::open(path).map_err(|e| err(&e))?;
    let len = f.metadata().map_err(|e| err(&e))?.len();
    if len > limit {
        return Err(err(&format_args!(
            "{len} bytes, more than the {limit} it may take"
        )));
    }
    let mut v = Vec::new();
    v.try_reserve_exact(len as usize).map_err(|e| err(&e))?;
    f.take(limit).read_to_end(&mut v).map_err(|e| err(&e))?;
    Ok(v)
}

/// Loads `assets` into `ram` and writes the device tree `cfg` describes
/// (its `initrd` is set to where the initramfs went; `mem_base` and
/// `mem_size` must be `ram`'s range). Returns vCPU 0's entry and x0.
///
/// # Errors
/// [`BootError::RamMismatch`], [`BootError::File`] (before anything is
/// written), and [`loader::load`]'s errors.
pub fn load_linux(
    ram: &mut dyn LoadTarget,
    assets: &LinuxAssets,
    cfg: &FdtConfig,
) -> Result<BootLayout, BootError> {
    let range = ram.range();
    if (cfg.mem_base, cfg.mem_size) != range {
        return Err(BootError::RamMismatch {
            fdt: (cfg.mem_base, cfg.mem_size),
            ram: range,
        });
    }
    // Catch a bad tree before touching RAM: the initrd range is filled in
    // later, so check the rest now.
    let mut probe = cfg.clone();
    probe.initrd = None;
    fdt::validate(&probe).map_err(LoadError::Fdt)?;
    let image = read_bounded(&assets.image, range.1)?;
    let initrd = read_bounded(&assets.initramfs, range.1)?;
    let layout = loader::load(ram, &image, Some(&initrd), |l| {
        let mut c = cfg.clone();
        c.initrd = l.initrd;
        fdt::build(&c)
    })?;
    Ok(layout)
}
