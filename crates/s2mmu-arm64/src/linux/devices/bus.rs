//! The MMIO bus: guest-physical ranges owned by host device models, fed by
//! stage-2 data aborts.
//!
//! A data abort outside guest RAM reaches the host with its address, width
//! and (for a store) value. [`MmioBus::read`] and [`MmioBus::write`] find
//! the device whose range holds the whole access and call it with the
//! offset into that range. An address no device claims comes back as
//! [`Unclaimed`], so the caller decides what hardware would do (an
//! external abort, or read-as-zero/write-ignored) and logs it; the bus never
//! guesses.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// A device model behind a range of guest-physical addresses.
///
/// `offset` is relative to the start of the device's range; the bus only
/// calls with accesses that lie wholly inside the range, of 1, 2, 4 or 8
/// bytes, little-endian as the guest issued them.
pub trait MmioDevice: Send + Sync {
    /// A guest load of `data.len()` bytes at `offset`: fill `data`.
    fn read(&self, offset: u64, data: &mut [u8]);
    /// A guest store of `data` at `offset`.
    fn write(&self, offset: u64, data: &[u8]);
    /// Whether an access may leave an interrupt pending for a vCPU other
    /// than the one that made it (an interrupt controller's registers):
    /// the caller then kicks the vCPUs that have one. `false` unless the
    /// device says so.
    fn routes_interrupts(&self) -> bool {
        false
    }
}

/// What an access the bus delivered leaves for the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// A device whose registers route interrupts (the GIC's frames): the
    /// caller kicks the vCPUs that now have one pending.
    Interrupts,
    /// Any other device.
    Plain,
}

/// Why a range could not be registered (the bus is unchanged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BusError {
    /// A range of zero bytes.
    EmptyRange {
        /// The device's name.
        name: String,
        /// The range's base.
        base: u64,
    },
    /// `base + size` does not fit in 64 bits.
    RangeOverflow {
        /// The device's name.
        name: String,
        /// The range's base.
        base: u64,
        /// The range's size.
        size: u64,
    },
    /// The range overlaps one already registered.
    Overlap {
        /// The new device's name.
        name: String,
        /// The new range's base.
        base: u64,
        /// The new range's size.
        size: u64,
        /// The device already there.
        existing: String,
        /// Its base.
        existing_base: u64,
        /// Its size.
        existing_size: u64,
    },
    /// A system register, call or interrupt another device claims.
    Claimed {
        /// The new device's name.
        name: String,
        /// What it claims.
        what: String,
        /// The device that holds it.
        existing: String,
    },
}

impl fmt::Display for BusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BusError::EmptyRange { name, base } => {
                write!(f, "MMIO device {name} at {base:#x}: the range is empty")
            }
            BusError::RangeOverflow { name, base, size } => write!(
                f,
                "MMIO device {name}: {base:#x} + {size:#x} overflows the address space"
            ),
            BusError::Overlap {
                name,
                base,
                size,
                existing,
                existing_base,
                existing_size,
            } => write!(
                f,
                "MMIO device {name} [{base:#x}, +{size:#x}) overlaps {existing} \
                 [{existing_base:#x}, +{existing_size:#x})"
            ),
            BusError::Claimed {
                name,
                what,
                existing,
            } => write!(f, "device {name} claims {what}, which {existing} holds"),
        }
    }
}

impl std::error::Error for BusError {}

/// An access that no device takes: what the caller logs before answering
/// as hardware would.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unclaimed {
    /// The guest-physical address of the access.
    pub addr: u64,
    /// Its width in bytes.
    pub len: usize,
    /// Why: no device there, a width other than 1/2/4/8, or an access that
    /// runs past the end of the device it starts in.
    pub reason: UnclaimedReason,
}

/// Why an access was not delivered to a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnclaimedReason {
    /// No registered range holds the address.
    NoDevice,
    /// The width is not 1, 2, 4 or 8 bytes.
    BadWidth,
    /// The access starts inside the named device and runs past its end.
    Straddles(String),
}

impl fmt::Display for Unclaimed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match &self.reason {
            UnclaimedReason::NoDevice => "no device there".to_string(),
            UnclaimedReason::BadWidth => "width is not 1, 2, 4 or 8 bytes".to_string(),
            UnclaimedReason::Straddles(d) => format!("runs past the end of {d}"),
        };
        write!(
            f,
            "MMIO access of {} bytes at {:#x}: {why}",
            self.len, self.addr
        )
    }
}

impl std::error::Error for Unclaimed {}

struct Entry {
    size: u64,
    name: String,
    device: Arc<dyn MmioDevice>,
}

/// Non-overlapping guest-physical ranges, each owned by one device.
#[derive(Default)]
pub struct MmioBus {
    /// Keyed by base address.
    ranges: BTreeMap<u64, Entry>,
}

impl fmt::Debug for MmioBus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut l = f.debug_list();
        for (base, e) in &self.ranges {
            l.entry(&format_args!("{} [{base:#x}, +{:#x})", e.name, e.size));
        }
        l.finish()
    }
}

impl MmioBus {
    /// An empty bus.
    pub fn new() -> MmioBus {
        MmioBus::default()
    }

    /// Registers `device` for `[base, base + size)`.
    ///
    /// # Errors
    /// [`BusError::EmptyRange`], [`BusError::RangeOverflow`] or
    /// [`BusError::Overlap`]; the bus is then unchanged.
    pub fn insert(
        &mut self,
        name: &str,
        base: u64,
        size: u64,
        device: Arc<dyn MmioDevice>,
    ) -> Result<(), BusError> {
        let name = name.to_string();
        if size == 0 {
            return Err(BusError::EmptyRange { name, base });
        }
        let Some(end) = base.checked_add(size) else {
            return Err(BusError::RangeOverflow { name, base, size });
        };
        // The only ranges that can overlap: the last one starting before
        // `end`; it overlaps when it ends after `base`.
        if let Some((&b, e)) = self.ranges.range(..end).next_back() {
            if b + e.size > base {
                return Err(BusError::Overlap {
                    name,
                    base,
                    size,
                    existing: e.name.clone(),
                    existing_base: b,
                    existing_size: e.size,
                });
            }
        }
        self.ranges.insert(base, Entry { size, name, device });
        Ok(())
    }

    /// The name and range of the device holding `addr`, if any.
    pub fn device_at(&self, addr: u64) -> Option<(&str, u64, u64)> {
        let (&b, e) = self.ranges.range(..=addr).next_back()?;
        (addr - b < e.size).then_some((e.name.as_str(), b, e.size))
    }

    fn find(&self, addr: u64, len: usize) -> Result<(&Entry, u64), Unclaimed> {
        let unclaimed = |reason| Unclaimed { addr, len, reason };
        if !matches!(len, 1 | 2 | 4 | 8) {
            return Err(unclaimed(UnclaimedReason::BadWidth));
        }
        let Some((&b, e)) = self.ranges.range(..=addr).next_back() else {
            return Err(unclaimed(UnclaimedReason::NoDevice));
        };
        let offset = addr - b;
        if offset >= e.size {
            return Err(unclaimed(UnclaimedReason::NoDevice));
        }
        if e.size - offset < len as u64 {
            return Err(unclaimed(UnclaimedReason::Straddles(e.name.clone())));
        }
        Ok((e, offset))
    }

    /// A guest load at `addr` of `data.len()` bytes.
    ///
    /// # Errors
    /// [`Unclaimed`] when no device takes the whole access; `data` is then
    /// left as it was, for the caller to answer.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> Result<Served, Unclaimed> {
        let (e, offset) = self.find(addr, data.len())?;
        e.device.read(offset, data);
        Ok(served(&*e.device))
    }

    /// A guest store at `addr` of `data`.
    ///
    /// # Errors
    /// [`Unclaimed`] when no device takes the whole access.
    pub fn write(&self, addr: u64, data: &[u8]) -> Result<Served, Unclaimed> {
        let (e, offset) = self.find(addr, data.len())?;
        e.device.write(offset, data);
        Ok(served(&*e.device))
    }

    /// A guest access of `size` bytes at `addr` as a data abort gives it:
    /// a store of `write`'s low bytes, or a load whose value (zero above
    /// `size`) comes back with who served it.
    ///
    /// # Errors
    /// [`Unclaimed`] when no device takes the whole access (a `size`
    /// other than 1, 2, 4 or 8 included): the caller logs it and answers
    /// read-as-zero/write-ignored.
    pub fn access(
        &self,
        addr: u64,
        size: u64,
        write: Option<u64>,
    ) -> Result<(u64, Served), Unclaimed> {
        let n = match size {
            1 | 2 | 4 | 8 => size as usize,
            _ => {
                return Err(Unclaimed {
                    addr,
                    len: usize::try_from(size).unwrap_or(usize::MAX),
                    reason: UnclaimedReason::BadWidth,
                })
            }
        };
        let mut buf = [0u8; 8];
        let s = match write {
            Some(w) => {
                buf[..n].copy_from_slice(&w.to_le_bytes()[..n]);
                let s = self.write(addr, &buf[..n])?;
                buf = [0; 8];
                s
            }
            None => self.read(addr, &mut buf[..n])?,
        };
        Ok((u64::from_le_bytes(buf), s))
    }
}

fn served(d: &dyn MmioDevice) -> Served {
    if d.routes_interrupts() {
        Served::Interrupts
    } else {
        Served::Plain
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A register file of 16 bytes: real storage, so reads see writes.
    #[derive(Default)]
    struct Regs(Mutex<[u8; 16]>);

    impl MmioDevice for Regs {
        fn read(&self, offset: u64, data: &mut [u8]) {
            let r = self.0.lock().unwrap();
            let o = offset as usize;
            data.copy_from_slice(&r[o..o + data.len()]);
        }
        fn write(&self, offset: u64, data: &[u8]) {
            let mut r = self.0.lock().unwrap();
            let o = offset as usize;
            r[o..o + data.len()].copy_from_slice(data);
        }
    }

    #[test]
    fn routes_by_address_and_refuses_overlaps() {
        let mut bus = MmioBus::new();
        let a = Arc::new(Regs::default());
        let b = Arc::new(Regs::default());
        bus.insert("a", 0x1000, 16, a.clone()).unwrap();
        bus.insert("b", 0x1010, 16, b.clone()).unwrap();
        for (base, size) in [(0x100f, 2), (0x0ff0, 0x11), (0x1008, 1), (0x0, 0x2000)] {
            let e = bus.insert("c", base, size, a.clone()).unwrap_err();
            assert!(
                matches!(e, BusError::Overlap { .. }),
                "{base:#x}+{size}: {e}"
            );
        }
        assert!(matches!(
            bus.insert("z", 5, 0, a.clone()),
            Err(BusError::EmptyRange { .. })
        ));
        assert!(matches!(
            bus.insert("z", u64::MAX, 2, a.clone()),
            Err(BusError::RangeOverflow { .. })
        ));
        bus.insert("adjacent", 0x1020, 8, a.clone()).unwrap();
        bus.write(0x1014, &0xdead_beef_u32.to_le_bytes()).unwrap();
        let mut v = [0u8; 4];
        bus.read(0x1014, &mut v).unwrap();
        assert_eq!(u32::from_le_bytes(v), 0xdead_beef);
        assert_eq!(b.0.lock().unwrap()[4..8], 0xdead_beef_u32.to_le_bytes());
        assert_eq!(a.0.lock().unwrap()[4..8], [0; 4]);
        assert_eq!(bus.device_at(0x101f), Some(("b", 0x1010, 16)));
        assert_eq!(bus.device_at(0x1028), None);
    }

    #[test]
    fn unclaimed_accesses_say_why() {
        let mut bus = MmioBus::new();
        bus.insert("a", 0x1000, 16, Arc::new(Regs::default()))
            .unwrap();
        let mut d = [7u8; 8];
        let e = bus.read(0x2000, &mut d).unwrap_err();
        assert_eq!(e.reason, UnclaimedReason::NoDevice);
        assert_eq!(
            d, [7; 8],
            "an unclaimed read leaves the buffer to the caller"
        );
        let e = bus.read(0x0fff, &mut d[..1]).unwrap_err();
        assert_eq!(e.reason, UnclaimedReason::NoDevice);
        let e = bus.write(0x100c, &[0; 8]).unwrap_err();
        assert_eq!(e.reason, UnclaimedReason::Straddles("a".into()));
        let e = bus.write(0x1000, &[0; 3]).unwrap_err();
        assert_eq!(e.reason, UnclaimedReason::BadWidth);
        assert!(e.to_string().contains("0x1000"));
    }
}
