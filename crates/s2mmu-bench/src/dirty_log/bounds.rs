//! What a run on the simulated VM takes, checked before anything is
//! allocated or a thread starts (the command checks its flags against the
//! same limits first, naming them).

use super::RunSpec;
use crate::host::{approx_bytes, check_memory};
use crate::human_bytes;

/// The most vCPUs a run takes: arm64 KVM's `KVM_MAX_VCPUS`.
pub const MAX_VCPUS: usize = 512;
/// The most dirty iterations a run takes (each is a pass over every vCPU's memory).
pub const MAX_ITERATIONS: u32 = 100_000;
/// The most memslots (KVM's `KVM_USER_MEM_SLOTS` on arm64 and x86).
pub const MAX_SLOTS: u32 = 32_764;
/// Where the engine's guest memory starts (the simulated VM's default).
pub const GPA_BASE: u64 = 1 << 32;
/// The engine's guest IPA space: 40 bits, the simulated VM's default.
pub const IPA_BITS: u32 = 40;
/// The smallest guest page the benchmark dirties.
const PAGE: u64 = 4096;

/// Checks a run's settings: iterations, write share, memslots, vCPUs,
/// bytes per vCPU, the guest's size against its IPA space, and the memory
/// it takes against the host's.
///
/// # Errors
/// A message naming the setting, its value and the limit.
pub fn check<Fmt>(spec: &RunSpec<Fmt>) -> Result<(), String> {
    if spec.iterations == 0 || spec.iterations > MAX_ITERATIONS {
        return Err(format!(
            "iterations {}: at least 1, at most {MAX_ITERATIONS}",
            spec.iterations
        ));
    }
    if spec.write_percent > 100 {
        return Err(format!(
            "write_percent {}: must be 0..=100",
            spec.write_percent
        ));
    }
    if spec.slots == 0 || spec.slots > MAX_SLOTS {
        return Err(format!(
            "slots {}: at least 1, at most {MAX_SLOTS}",
            spec.slots
        ));
    }
    if spec.vcpus == 0 || spec.vcpus > MAX_VCPUS {
        return Err(format!(
            "vcpus {}: at least 1, at most {MAX_VCPUS}",
            spec.vcpus
        ));
    }
    let bytes = spec.bytes;
    if bytes < PAGE || !bytes.is_multiple_of(PAGE) {
        return Err(format!(
            "bytes {}: must be a multiple of 4KiB, at least 4KiB",
            human_bytes(bytes)
        ));
    }
    let what = format!("{} vCPUs x {}", spec.vcpus, human_bytes(bytes));
    check_guest_memory(&what, spec.vcpus as u64, bytes, ("slots", spec.slots))
}

/// Checks that `vcpus` x `bytes` of guest memory (`what` in messages)
/// fits the IPA space above [`GPA_BASE`], holds a page for each of `slots`
/// memslots (`slots_name`: the setting's name), and fits the host's memory.
///
/// # Errors
/// A message naming what does not fit and its limit.
pub fn check_guest_memory(
    what: &str,
    vcpus: u64,
    bytes: u64,
    (slots_name, slots): (&str, u32),
) -> Result<(), String> {
    let room = (1u64 << IPA_BITS) - GPA_BASE;
    let total = vcpus
        .checked_mul(bytes)
        .filter(|&t| t <= room)
        .ok_or_else(|| {
            format!(
                "{what}: the guest holds at most {} ({IPA_BITS}-bit IPA space above {})",
                approx_bytes(room),
                human_bytes(GPA_BASE)
            )
        })?;
    if u64::from(slots) > total / PAGE {
        return Err(format!(
            "{slots_name} {slots}: more memslots than the guest's {} pages ({what})",
            total / PAGE
        ));
    }
    check_memory(what, total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use s2mmu::format::arm64::Arm64Stage2;

    fn spec() -> RunSpec<()> {
        RunSpec::for_tests(1, 1 << 20)
    }

    #[test]
    fn a_run_refuses_bad_settings_by_name_before_the_vm_exists() {
        let refused = |s: RunSpec<()>, says: &str| {
            let e = super::super::run::<Arm64Stage2, ()>(s, "tree").unwrap_err();
            assert!(e.contains(says), "{e:?} should name {says}");
        };
        refused(RunSpec { vcpus: 0, ..spec() }, "vcpus 0");
        refused(
            RunSpec {
                iterations: 0,
                ..spec()
            },
            "iterations 0",
        );
        refused(
            RunSpec {
                write_percent: 101,
                ..spec()
            },
            "write_percent",
        );
        refused(RunSpec { slots: 0, ..spec() }, "slots 0");
        refused(
            RunSpec {
                slots: 257,
                ..spec()
            },
            "more memslots",
        );
        refused(
            RunSpec {
                bytes: 100,
                ..spec()
            },
            "bytes",
        );
        let huge = RunSpec {
            vcpus: MAX_VCPUS,
            bytes: u64::MAX - 4095,
            ..spec()
        };
        refused(huge, "IPA space");
        let r = super::super::run::<Arm64Stage2, ()>(spec(), "tree").unwrap();
        assert_eq!(r.iterations.len(), 1);
    }
}
