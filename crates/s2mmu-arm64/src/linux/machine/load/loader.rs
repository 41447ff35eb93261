//! Places an arm64 Linux `Image`, its initrd and its device tree in guest
//! RAM as the arm64 boot protocol (Documentation/arch/arm64/booting.rst)
//! says.
//!
//! Done by hand rather than with rust-vmm's `linux-loader`: its arm64
//! `Image` loader (`loader::pe::PE`) is compiled only when the *host* is
//! aarch64 or riscv64 (`#[cfg(target_arch = ...)]` in its `loader` module),
//! and this host is x86_64 running QEMU's model. What it does is small: read
//! the 64-byte header (`text_offset`, `image_size`, `flags`, magic
//! `ARM\x64`), put the image at a 2 MiB-aligned base plus `text_offset`
//! with `image_size` bytes free, the device tree 8-byte aligned in a 2 MiB
//! region of its own (at most 2 MiB), the initrd below it.
//!
//! The RAM is reached through [`LoadTarget`], so the shared RAM file of the
//! arm64 model, or a plain slice in a test, both serve.

use std::fmt;

use crate::linux::fdt::FdtError;

/// The header's magic at offset 56: "ARM\x64".
pub const IMAGE_MAGIC: u32 = 0x644d_5241;
/// The largest device tree the boot protocol allows.
pub const MAX_DTB: u64 = 2 << 20;
const ALIGN_2M: u64 = 2 << 20;
const PAGE: u64 = 4096;

/// Guest RAM as the loader writes into it (the migration library's
/// `GuestRam` is another thing: RAM the session reads and writes).
pub trait LoadTarget {
    /// The guest-physical (base, size) this RAM covers.
    fn range(&self) -> (u64, u64);
    /// Copies `data` to guest-physical `gpa`. The loader calls it only
    /// with `[gpa, gpa + data.len())` inside [`LoadTarget::range`].
    fn write(&mut self, gpa: u64, data: &[u8]);
}

/// Guest RAM as a byte slice starting at guest-physical `base`.
#[derive(Debug)]
pub struct SliceRam<'a> {
    /// The guest-physical address of `mem[0]`.
    pub base: u64,
    /// The RAM's bytes.
    pub mem: &'a mut [u8],
}

impl LoadTarget for SliceRam<'_> {
    fn range(&self) -> (u64, u64) {
        (self.base, self.mem.len() as u64)
    }
    /// Writes nothing when `[gpa, gpa + data.len())` is not inside the
    /// slice (the loader never asks for that).
    fn write(&mut self, gpa: u64, data: &[u8]) {
        let range = gpa
            .checked_sub(self.base)
            .and_then(|o| usize::try_from(o).ok())
            .and_then(|o| Some(o..o.checked_add(data.len())?));
        if let Some(dst) = range.and_then(|r| self.mem.get_mut(r)) {
            dst.copy_from_slice(data);
        }
    }
}

/// The fields of an arm64 `Image` header the loader uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageHeader {
    /// Offset of the image from a 2 MiB-aligned base.
    pub text_offset: u64,
    /// Bytes the kernel occupies from its load address, BSS included.
    pub image_size: u64,
    /// Bit 0 big-endian; bits 1-2 page size; bit 3 placement anywhere.
    pub flags: u64,
}

/// Where everything went; what the vCPU 0 boot registers need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootLayout {
    /// The kernel's first instruction (its load address): vCPU 0's PC.
    pub entry: u64,
    /// The kernel's [start, end) including BSS.
    pub kernel: (u64, u64),
    /// The initrd's [start, end), if any.
    pub initrd: Option<(u64, u64)>,
    /// The device tree's address: vCPU 0's x0.
    pub dtb: u64,
    /// The device tree's size (0 in a [`plan`] before it is written).
    pub dtb_size: u64,
}

/// Why the kernel could not be placed (guest RAM is then unwritten, except
/// for [`LoadError::Fdt`], which comes after the image and initrd).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// Shorter than the 64-byte header, or no `ARM\x64` magic.
    NotAnImage(String),
    /// The header says big-endian.
    BigEndian,
    /// `image_size` is 0 (a kernel older than 3.17): its extent is unknown.
    UnknownImageSize,
    /// The file is longer than the `image_size` it declares, or the sizes
    /// are absurd.
    BadSizes {
        /// The file's length.
        file: u64,
        /// The header's `image_size`.
        image_size: u64,
    },
    /// The RAM range is empty, wraps, or is not 2 MiB aligned.
    BadRam(u64, u64),
    /// Kernel, initrd and device tree do not fit in RAM (bytes needed,
    /// bytes there).
    DoesNotFit {
        /// What did not fit.
        what: &'static str,
        /// Bytes needed.
        need: u64,
        /// Bytes available.
        have: u64,
    },
    /// The device tree is over 2 MiB.
    DtbTooLarge(u64),
    /// The device tree could not be written.
    Fdt(FdtError),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::NotAnImage(w) => write!(f, "not an arm64 Image: {w}"),
            LoadError::BigEndian => {
                write!(f, "the Image is big-endian; the guest is little-endian")
            }
            LoadError::UnknownImageSize => {
                write!(
                    f,
                    "the Image's header has image_size 0 (kernel before 3.17)"
                )
            }
            LoadError::BadSizes { file, image_size } => write!(
                f,
                "the Image is {file} bytes but its header says image_size {image_size}"
            ),
            LoadError::BadRam(b, s) => {
                write!(
                    f,
                    "guest RAM [{b:#x}, +{s:#x}) is empty, wraps or is not 2 MiB aligned"
                )
            }
            LoadError::DoesNotFit { what, need, have } => {
                write!(f, "{what} needs {need} bytes of guest RAM, {have} left")
            }
            LoadError::DtbTooLarge(n) => write!(f, "device tree of {n} bytes exceeds 2 MiB"),
            LoadError::Fdt(e) => write!(f, "device tree: {e}"),
        }
    }
}

impl std::error::Error for LoadError {}

/// Reads an `Image` header.
///
/// # Errors
/// [`LoadError::NotAnImage`], [`LoadError::BigEndian`],
/// [`LoadError::UnknownImageSize`] or [`LoadError::BadSizes`].
pub fn parse_header(image: &[u8]) -> Result<ImageHeader, LoadError> {
    let Some(h) = image.get(..64) else {
        return Err(LoadError::NotAnImage(format!(
            "{} bytes, shorter than the header",
            image.len()
        )));
    };
    let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().expect("8 bytes"));
    let magic = u32::from_le_bytes(h[56..60].try_into().expect("4 bytes"));
    if magic != IMAGE_MAGIC {
        return Err(LoadError::NotAnImage(format!(
            "magic {magic:#010x}, not ARM\\x64"
        )));
    }
    let hdr = ImageHeader {
        text_offset: u64_at(8),
        image_size: u64_at(16),
        flags: u64_at(24),
    };
    if hdr.flags & 1 != 0 {
        return Err(LoadError::BigEndian);
    }
    if hdr.image_size == 0 {
        return Err(LoadError::UnknownImageSize);
    }
    let file = image.len() as u64;
    if file > hdr.image_size || hdr.text_offset >= ALIGN_2M * 512 {
        return Err(LoadError::BadSizes {
            file,
            image_size: hdr.image_size,
        });
    }
    Ok(hdr)
}

/// Decides where the kernel, initrd and device tree go in RAM
/// `(base, size)`: the kernel at the first 2 MiB boundary plus
/// `text_offset`, the device tree at the start of the last 2 MiB of RAM,
/// the initrd page-aligned just below that.
///
/// # Errors
/// [`LoadError::BadRam`] or [`LoadError::DoesNotFit`].
pub fn plan(
    ram: (u64, u64),
    hdr: &ImageHeader,
    initrd_len: Option<u64>,
) -> Result<BootLayout, LoadError> {
    let (base, size) = ram;
    let end = base.checked_add(size).filter(|_| size > 0);
    let Some(end) = end.filter(|_| base % ALIGN_2M == 0 && size % ALIGN_2M == 0) else {
        return Err(LoadError::BadRam(base, size));
    };
    let fits = |what, need: u64, have: u64| {
        if need > have {
            Err(LoadError::DoesNotFit { what, need, have })
        } else {
            Ok(())
        }
    };
    fits("the device tree's 2 MiB", ALIGN_2M, size)?;
    let dtb = end - ALIGN_2M;
    let entry = base + hdr.text_offset;
    let k_need = hdr.text_offset.saturating_add(hdr.image_size);
    fits("the kernel", k_need, dtb - base)?;
    let kernel_end = entry + hdr.image_size;
    let initrd = match initrd_len {
        None => None,
        Some(len) => {
            let room = dtb - kernel_end.next_multiple_of(PAGE).min(dtb);
            fits(
                "the initrd",
                len.saturating_add(PAGE - 1) & !(PAGE - 1),
                room,
            )?;
            let start = (dtb - len) & !(PAGE - 1);
            Some((start, start + len))
        }
    };
    Ok(BootLayout {
        entry,
        kernel: (entry, kernel_end),
        initrd,
        dtb,
        dtb_size: 0,
    })
}

/// Loads `image` and `initrd` into `ram`, then the device tree that
/// `make_dtb` writes for the final layout (it learns the initrd's range
/// from the [`BootLayout`] it is given).
///
/// # Errors
/// [`parse_header`]'s and [`plan`]'s errors before anything is written;
/// [`LoadError::Fdt`] or [`LoadError::DtbTooLarge`] after the image and
/// initrd are in place (the device tree is not written).
pub fn load(
    ram: &mut dyn LoadTarget,
    image: &[u8],
    initrd: Option<&[u8]>,
    make_dtb: impl FnOnce(&BootLayout) -> Result<Vec<u8>, FdtError>,
) -> Result<BootLayout, LoadError> {
    let hdr = parse_header(image)?;
    let mut layout = plan(ram.range(), &hdr, initrd.map(|i| i.len() as u64))?;
    ram.write(layout.entry, image);
    if let (Some(data), Some((start, _))) = (initrd, layout.initrd) {
        ram.write(start, data);
    }
    let dtb = make_dtb(&layout).map_err(LoadError::Fdt)?;
    let n = dtb.len() as u64;
    if n > MAX_DTB {
        return Err(LoadError::DtbTooLarge(n));
    }
    ram.write(layout.dtb, &dtb);
    layout.dtb_size = n;
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(text_offset: u64, image_size: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0xa5u8; len];
        v[8..16].copy_from_slice(&text_offset.to_le_bytes());
        v[16..24].copy_from_slice(&image_size.to_le_bytes());
        v[24..32].copy_from_slice(&0xau64.to_le_bytes());
        v[56..60].copy_from_slice(&IMAGE_MAGIC.to_le_bytes());
        v
    }

    #[test]
    fn places_kernel_initrd_and_dtb_as_the_protocol_says() {
        let base = 0x4000_0000;
        let mut mem = vec![0u8; 16 << 20];
        let mut ram = SliceRam {
            base,
            mem: &mut mem,
        };
        let img = image(0x1_0000, 3 << 20, 1 << 20);
        let initrd = vec![0x17u8; 5000];
        let mut seen = None;
        let l = load(&mut ram, &img, Some(&initrd), |l| {
            seen = Some(*l);
            Ok(vec![0xd0; 100])
        })
        .unwrap();
        assert_eq!(l.entry, base + 0x1_0000);
        assert_eq!(l.kernel, (l.entry, l.entry + (3 << 20)));
        assert_eq!(l.dtb, base + (14 << 20));
        assert_eq!(l.dtb % 8, 0);
        assert_eq!(l.dtb_size, 100);
        let (s, e) = l.initrd.unwrap();
        assert_eq!((s % 4096, e - s), (0, 5000));
        assert!(s >= l.kernel.1 && e <= l.dtb);
        assert_eq!(
            seen.unwrap().initrd,
            l.initrd,
            "the DTB saw the final initrd"
        );
        let off = |a: u64| (a - base) as usize;
        assert_eq!(&mem[off(l.entry)..off(l.entry) + img.len()], &img[..]);
        assert_eq!(mem[off(l.entry) - 1], 0);
        assert_eq!(&mem[off(s)..off(e)], &initrd[..]);
        assert_eq!(mem[off(l.dtb)..off(l.dtb) + 100], [0xd0; 100]);
    }

    #[test]
    fn refuses_bad_headers_and_what_does_not_fit() {
        let mut mem = vec![0u8; 8 << 20];
        let mut ram = SliceRam {
            base: 0x4000_0000,
            mem: &mut mem,
        };
        let none = |_: &BootLayout| Ok(vec![]);
        let mut bad = image(0, 1 << 20, 4096);
        bad[56] = 0;
        assert!(matches!(
            load(&mut ram, &bad, None, none),
            Err(LoadError::NotAnImage(_))
        ));
        assert!(matches!(
            load(&mut ram, &[0; 10], None, none),
            Err(LoadError::NotAnImage(_))
        ));
        let mut be = image(0, 1 << 20, 4096);
        be[24] = 1;
        assert_eq!(load(&mut ram, &be, None, none), Err(LoadError::BigEndian));
        let old = image(0x8_0000, 0, 4096);
        assert_eq!(
            load(&mut ram, &old, None, none),
            Err(LoadError::UnknownImageSize)
        );
        let short = image(0, 100, 4096);
        assert!(matches!(
            load(&mut ram, &short, None, none),
            Err(LoadError::BadSizes { .. })
        ));
        let big = image(0, 7 << 20, 4096);
        assert!(matches!(
            load(&mut ram, &big, None, none),
            Err(LoadError::DoesNotFit {
                what: "the kernel",
                ..
            })
        ));
        let ok = image(0, 4 << 20, 4096);
        let e = load(&mut ram, &ok, Some(&vec![0; 3 << 20]), none).unwrap_err();
        assert!(
            matches!(
                e,
                LoadError::DoesNotFit {
                    what: "the initrd",
                    ..
                }
            ),
            "{e}"
        );
        assert!(mem.iter().all(|&b| b == 0), "nothing written on a refusal");
        let mut ram = SliceRam {
            base: 0x4000_0000,
            mem: &mut mem,
        };
        ram.write(0x3fff_ffff, &[1, 2]);
        ram.write(0x4000_0000 + (8 << 20) - 1, &[1, 2]);
        ram.write(u64::MAX, &[1]);
        assert!(
            mem.iter().all(|&b| b == 0),
            "a SliceRam ignores writes outside it"
        );
        let mut ram = SliceRam {
            base: 0x4000_1000,
            mem: &mut mem,
        };
        assert!(matches!(
            load(&mut ram, &ok, None, none),
            Err(LoadError::BadRam(..))
        ));
        let mut ram = SliceRam {
            base: 0x4000_0000,
            mem: &mut mem,
        };
        let e = load(&mut ram, &ok, None, |_| Ok(vec![0; (2 << 20) + 8])).unwrap_err();
        assert_eq!(e, LoadError::DtbTooLarge((2 << 20) + 8));
    }
}
