//! A guest put in RAM: the device tree, the boot protocol's placement and
//! the one call that loads the asset files with both.

pub mod boot;
pub mod fdt;
pub mod loader;
