//! A simulated VM: guest memory divided into memslots, the engine's MMU,
//! and the TLB shootdown that its vCPUs register with.

use crate::memory::{Backing, GuestMemory, MemoryError};
use crate::tlb::TlbShootdown;
use crate::vcpu::{PageFetch, Vcpu};
use s2mmu::format::arm64::Arm64Stage2;
use s2mmu::memslot::{MemslotConfig, MemslotStore, SlotFlags, TreeMemslots, UserMemoryRegion};
use s2mmu::mmu::{Mmu, MmuPolicy};
use s2mmu::{Gpa, HostMmOps, Hva};
use std::fmt;
use std::sync::{Arc, Mutex};

pub use crate::mmu::VmMmu;

/// A descriptor format a simulated VM runs on: one the engine ships, its
/// vCPUs walking its tables with 4 KiB pages as that architecture's
/// hardware does (arm64's walker and DBM, or x86's EPT walker with A/D
/// flags and PML). Re-exported under the engine's name: this crate adds
/// nothing per format, so a new format needs no change here.
pub use s2mmu::format::KnownFormat;

/// The engine's [`KnownFormat`], by the name this crate gave it: every
/// `KnownFormat` implements it, so a bound spelled with it still compiles.
///
/// ```
/// # #![allow(deprecated)]
/// use s2mmu::memslot::TreeMemslots;
/// fn name<F: s2mmu_vm::VmFormat>(_: &s2mmu_vm::Vm<TreeMemslots, F>) -> &'static str {
///     F::NAME
/// }
/// let vm: s2mmu_vm::Vm = s2mmu_vm::Vm::new(s2mmu_vm::VmConfig::default()).unwrap();
/// assert_eq!(name(&vm), "arm64");
/// ```
#[deprecated(
    note = "use `s2mmu::format::KnownFormat` (also re-exported as `s2mmu_vm::KnownFormat`)"
)]
pub trait VmFormat: KnownFormat {}

#[allow(deprecated)]
impl<F: KnownFormat> VmFormat for F {}

/// How to build a [`Vm`].
#[derive(Clone, Debug)]
pub struct VmConfig {
    /// Bytes of guest memory.
    pub mem_size: u64,
    /// How it is backed.
    pub backing: Backing,
    /// Number of memslots it is divided into (dirty_log_perf_test's `-x`).
    pub slots: u32,
    /// Guest-physical address of the first slot.
    pub gpa_base: u64,
    /// The MMU's policies.
    pub policy: MmuPolicy,
    /// Entries of each vCPU's software TLB.
    pub tlb_entries: usize,
    /// IPA size in bits.
    pub ipa_bits: u32,
}

impl Default for VmConfig {
    fn default() -> Self {
        VmConfig {
            mem_size: 256 << 20,
            backing: Backing::Anonymous,
            slots: 1,
            gpa_base: 1 << 32,
            policy: MmuPolicy::default(),
            tlb_entries: 1024,
            ipa_bits: 40,
        }
    }
}

/// Why a VM could not be built or used.
#[derive(Debug)]
pub enum Error {
    /// Guest memory.
    Memory(MemoryError),
    /// The engine refused something.
    Engine(s2mmu::Error),
    /// The configuration does not make sense.
    Config(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Memory(e) => write!(f, "{e}"),
            Error::Engine(e) => write!(f, "{e}"),
            Error::Config(s) => write!(f, "{s}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<MemoryError> for Error {
    fn from(e: MemoryError) -> Self {
        Error::Memory(e)
    }
}

impl From<s2mmu::Error> for Error {
    fn from(e: s2mmu::Error) -> Self {
        Error::Engine(e)
    }
}

/// One memslot of the VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotInfo {
    /// Slot id.
    pub id: u16,
    /// Guest-physical base.
    pub gpa: u64,
    /// Bytes.
    pub size: u64,
    /// Offset of its memory in [`Vm::memory`].
    pub mem_offset: u64,
}

/// A simulated VM whose vCPUs walk tables of format `F`.
pub struct Vm<S: MemslotStore = TreeMemslots, F: KnownFormat = Arm64Stage2> {
    // Field order matters for drop: vCPU-facing parts first, memory last.
    mmu: Arc<VmMmu<S, F>>,
    shootdown: Arc<TlbShootdown>,
    slots: Vec<SlotInfo>,
    config: VmConfig,
    /// Post-copy's page request hook, given to vCPUs created after it is
    /// set.
    fetch: Mutex<Option<Arc<dyn PageFetch>>>,
    memory: Arc<GuestMemory>,
}

impl<S: MemslotStore, F: KnownFormat> Vm<S, F> {
    /// The largest software TLB a vCPU may have.
    pub const MAX_TLB_ENTRIES: usize = TlbShootdown::MAX_ENTRIES;

    /// Builds a VM: maps guest memory, divides it into `slots` memslots
    /// (each a multiple of the backing's page size), creates the MMU.
    ///
    /// # Errors
    /// [`Error::Config`] for a size that cannot be divided or a vCPU TLB
    /// size outside 1..=[`Self::MAX_TLB_ENTRIES`],
    /// [`Error::Memory`], [`Error::Engine`].
    pub fn new(config: VmConfig) -> Result<Self, Error> {
        let fmt = F::for_vm(config.ipa_bits)?;
        let host_page = config.backing.page_size();
        let unit = host_page.max(fmt.page_size());
        if config.slots == 0
            || config.mem_size == 0
            || !config
                .mem_size
                .is_multiple_of(unit * u64::from(config.slots))
        {
            return Err(Error::Config(format!(
                "guest memory of {} bytes cannot be divided into {} slots of whole {}-byte pages",
                config.mem_size, config.slots, unit
            )));
        }
        if !config.gpa_base.is_multiple_of(unit)
            || config
                .gpa_base
                .checked_add(config.mem_size)
                .is_none_or(|end| end > fmt.ipa_limit())
        {
            return Err(Error::Config(format!(
                "guest-physical base {:#x} must be aligned to {unit:#x} and the memory must fit {} IPA bits",
                config.gpa_base, config.ipa_bits
            )));
        }
        if config.tlb_entries == 0 || config.tlb_entries > Self::MAX_TLB_ENTRIES {
            return Err(Error::Config(format!(
                "a vCPU TLB of {} entries: it must hold 1 to {} entries",
                config.tlb_entries,
                Self::MAX_TLB_ENTRIES
            )));
        }
        let memory = Arc::new(GuestMemory::new(config.mem_size, config.backing)?);
        let shootdown = Arc::new(TlbShootdown::new(fmt.page_shift()));
        let mm = HostMmOps::new(fmt.page_size() as usize)?;
        let store = S::with_config(MemslotConfig {
            page_shift: fmt.page_shift(),
            ..MemslotConfig::default()
        });
        let mmu = Arc::new(Mmu::new(fmt, mm, shootdown.clone(), store, config.policy)?);
        let per = config.mem_size / u64::from(config.slots);
        let mut slots = Vec::new();
        for i in 0..config.slots {
            let id = u16::try_from(i).map_err(|_| Error::Config("too many slots".into()))?;
            let off = u64::from(i) * per;
            let region = UserMemoryRegion::new(
                id,
                SlotFlags::NONE,
                Gpa::new(config.gpa_base + off),
                per,
                Hva::new(memory.host_addr() + off),
            );
            mmu.set_memory_region(&region, host_page)?;
            slots.push(SlotInfo {
                id,
                gpa: config.gpa_base + off,
                size: per,
                mem_offset: off,
            });
        }
        Ok(Vm {
            mmu,
            shootdown,
            slots,
            config,
            fetch: Mutex::new(None),
            memory,
        })
    }

    /// The MMU.
    pub fn mmu(&self) -> &Arc<VmMmu<S, F>> {
        &self.mmu
    }

    /// The TLB shootdown (its counters show invalidation costs).
    pub fn shootdown(&self) -> &Arc<TlbShootdown> {
        &self.shootdown
    }

    /// Guest memory.
    pub fn memory(&self) -> &Arc<GuestMemory> {
        &self.memory
    }

    /// The memslots.
    pub fn slots(&self) -> &[SlotInfo] {
        &self.slots
    }

    /// The configuration.
    pub fn config(&self) -> &VmConfig {
        &self.config
    }

    /// Creates a vCPU.
    ///
    /// # Errors
    /// [`Error::Engine`].
    pub fn new_vcpu(&self) -> Result<Vcpu<S, F>, Error> {
        let vmmu = self.mmu.new_vcpu()?;
        let tlb = self.shootdown.register(self.config.tlb_entries);
        let fetch = self.fetch.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Ok(Vcpu::new(
            self.mmu.clone(),
            self.memory.clone(),
            vmmu,
            tlb,
            fetch,
        ))
    }

    /// Sets the hook that vCPUs created from now on call on a translation
    /// fault before the engine maps the page (post-copy: pages that have
    /// not arrived are not mapped, and the fault is their request). Every
    /// vCPU of a post-copy destination must be created after this.
    pub fn set_page_fetch(&self, fetch: Option<Arc<dyn PageFetch>>) {
        *self.fetch.lock().unwrap_or_else(|p| p.into_inner()) = fetch;
    }

    /// Enables dirty logging on every slot.
    ///
    /// # Errors
    /// [`Error::Engine`].
    pub fn enable_dirty_logging(&self) -> Result<(), Error> {
        for s in &self.slots {
            self.mmu.enable_dirty_logging(s.id)?;
        }
        Ok(())
    }

    /// Disables dirty logging on every slot.
    ///
    /// # Errors
    /// [`Error::Engine`].
    pub fn disable_dirty_logging(&self) -> Result<(), Error> {
        for s in &self.slots {
            self.mmu.disable_dirty_logging(s.id)?;
        }
        Ok(())
    }

    /// The slot holding `gpa` and the offset of `gpa` in guest memory.
    pub fn locate(&self, gpa: u64) -> Option<(SlotInfo, u64)> {
        self.slots
            .iter()
            .find(|s| gpa >= s.gpa && gpa - s.gpa < s.size)
            .map(|s| (*s, s.mem_offset + gpa - s.gpa))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpa_base_at_the_top_of_the_address_space_is_refused() {
        // `gpa_base + mem_size` overflowed (a panic in debug builds) before
        // the IPA limit was checked.
        let config = VmConfig {
            gpa_base: !0xfff,
            mem_size: 1 << 20,
            ..VmConfig::default()
        };
        assert!(matches!(
            Vm::<TreeMemslots>::new(config),
            Err(Error::Config(_))
        ));
    }

    #[test]
    fn tlb_sizes_outside_what_a_vcpu_can_hold_are_refused() {
        for tlb_entries in [0, Vm::<TreeMemslots>::MAX_TLB_ENTRIES + 1, usize::MAX] {
            let config = VmConfig {
                mem_size: 1 << 20,
                tlb_entries,
                ..VmConfig::default()
            };
            assert!(
                matches!(Vm::<TreeMemslots>::new(config), Err(Error::Config(_))),
                "{tlb_entries} entries accepted"
            );
        }
    }

    /// A slot added through `mmu()` at host memory that is not guest
    /// memory: the vCPU's access is refused with an exit, not made (it
    /// segfaulted from safe code).
    #[test]
    fn a_slot_outside_guest_memory_is_never_accessed() {
        let config = VmConfig {
            mem_size: 1 << 20,
            ..VmConfig::default()
        };
        let vm = Vm::<TreeMemslots>::new(config).unwrap();
        // Page-aligned host addresses far from anything mapped.
        let hva = 0x1000_0000u64;
        let r = UserMemoryRegion::new(
            1,
            SlotFlags::NONE,
            Gpa::new(1 << 35),
            1 << 20,
            Hva::new(hva),
        );
        vm.mmu().set_memory_region(&r, 4096).unwrap();
        let mut v = vm.new_vcpu().unwrap();
        for write in [true, false] {
            let r = if write {
                v.write_u64(1 << 35, 7).map(|_| 0)
            } else {
                v.read_u64((1 << 35) + 8)
            };
            assert!(
                matches!(r, Err(crate::VcpuExit::OutsideGuestMemory { .. })),
                "{r:?}"
            );
        }
        // Guest memory itself still works.
        let base = vm.config().gpa_base;
        v.write_u64(base, 7).unwrap();
        assert_eq!(v.read_u64(base), Ok(7));
    }

    #[test]
    fn workloads_and_memory_of_absurd_sizes_are_refused() {
        use crate::workload::{Pattern, Workload, WorkloadConfig};
        for size in [!0xfffu64, 1 << 63] {
            for backing in [Backing::Anonymous, Backing::AnonymousThp] {
                assert!(GuestMemory::new(size, backing).is_err(), "{size:#x}");
            }
        }
        let config = VmConfig {
            mem_size: 1 << 20,
            ..VmConfig::default()
        };
        let vm = Arc::new(Vm::<TreeMemslots>::new(config).unwrap());
        let cfg = |bytes_per_vcpu, page_size| WorkloadConfig {
            bytes_per_vcpu,
            write_percent: 100,
            pattern: Pattern::Sequential,
            page_size,
        };
        for (vcpus, c) in [
            (usize::MAX, cfg(4096, 4096)),
            (1 << 40, cfg(4096, 4096)),
            (3, cfg(1 << 63, 4096)),
            (1, cfg(4096, 0)),
        ] {
            assert!(Workload::start(vm.clone(), vcpus, c).is_err(), "{vcpus}");
        }
        assert!(Workload::start(vm, 2, cfg(4096, 4096)).is_ok());
    }
}
