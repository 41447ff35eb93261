//! What every format checks and decodes the same way in a leaf: the output
//! address against the format's physical-address width, the memory type a
//! [`Prot`] asks for, and the read and write permission bits.

use super::pte::Prot;
use crate::{Error, Result};

/// The memory type of a leaf, as [`Prot`] names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MemType {
    /// Normal, cacheable memory (no memory-type flag).
    Normal,
    /// Device memory ([`Prot::DEVICE`]).
    Device,
    /// Normal non-cacheable memory ([`Prot::NORMAL_NC`]).
    NormalNc,
}

/// A format's codes for the three memory types, in its memory-type field.
#[derive(Clone, Copy)]
pub(super) struct MemCodes {
    /// The code of [`MemType::Normal`].
    pub normal: u64,
    /// The code of [`MemType::Device`].
    pub device: u64,
    /// The code of [`MemType::NormalNc`].
    pub normal_nc: u64,
}

impl MemCodes {
    /// The code of `mem`.
    pub(super) fn encode(self, mem: MemType) -> u64 {
        match mem {
            MemType::Normal => self.normal,
            MemType::Device => self.device,
            MemType::NormalNc => self.normal_nc,
        }
    }

    /// The memory type of `code`; a code the engine never writes reads as
    /// normal memory.
    pub(super) fn decode(self, code: u64) -> MemType {
        if code == self.device {
            MemType::Device
        } else if code == self.normal_nc {
            MemType::NormalNc
        } else {
            MemType::Normal
        }
    }
}

/// The memory type of a leaf at `pa` with `prot`, after the checks every
/// format makes (KVM's `stage2_set_prot_attr`): device and non-cacheable
/// memory exclude each other and neither may be executable.
///
/// # Errors
/// [`Error::PhysOutOfRange`] for `pa` at or beyond `pa_bits` bits,
/// [`Error::InvalidProt`] for a refused memory type.
pub(super) fn leaf_mem_type(pa: u64, pa_bits: u32, prot: Prot) -> Result<MemType> {
    if pa >> pa_bits != 0 {
        return Err(Error::PhysOutOfRange { pa, pa_bits });
    }
    let device = prot.contains(Prot::DEVICE);
    let nc = prot.contains(Prot::NORMAL_NC);
    if (device && nc) || ((device || nc) && prot.contains(Prot::X)) {
        return Err(Error::InvalidProt { bits: prot.bits() });
    }
    Ok(match (device, nc) {
        (true, _) => MemType::Device,
        (_, true) => MemType::NormalNc,
        _ => MemType::Normal,
    })
}

/// The bits that grant `prot`'s read and write access, `read` and `write`
/// being the format's bits.
pub(super) fn rw_bits(prot: Prot, read: u64, write: u64) -> u64 {
    let mut bits = 0;
    if prot.contains(Prot::R) {
        bits |= read;
    }
    if prot.contains(Prot::W) {
        bits |= write;
    }
    bits
}

/// The [`Prot`] of a leaf whose bits grant read, write and execute as
/// given, of memory type `mem`.
pub(super) fn decoded_prot(read: bool, write: bool, exec: bool, mem: MemType) -> Prot {
    let mut p = Prot::NONE;
    for (granted, bit) in [(read, Prot::R), (write, Prot::W), (exec, Prot::X)] {
        if granted {
            p = p | bit;
        }
    }
    match mem {
        MemType::Normal => p,
        MemType::Device => p | Prot::DEVICE,
        MemType::NormalNc => p | Prot::NORMAL_NC,
    }
}
