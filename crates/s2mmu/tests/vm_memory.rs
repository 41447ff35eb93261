//! The `vm-memory` adapter: a VMM's writes through `GuestMemoryMmap`
//! (`Bytes` on the memory, on a `VolatileSlice` of it, as a virtio queue's
//! device model writes its used ring) and the guest's own writes (stage-2
//! write faults on a logged slot) come out of one GET, and out of a dirty
//! view's. Run with `cargo test -p s2mmu --features vm-memory --test
//! vm_memory`.

use s2mmu::format::arm64::{Arm64Stage2, Granule};
use s2mmu::memslot::{SlotFlags, TreeMemslots, UserMemoryRegion};
use s2mmu::mmu::{DirtyMode, Mmu, MmuPolicy};
use s2mmu::vmm_bitmap::SlotDirtyBitmap;
use s2mmu::{Error, Gpa, HostMmOps, Hva, NoTlb};
use std::sync::Arc;
use vm_memory::bitmap::Bitmap;
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestRegionMmap};

type HostMmu = Mmu<Arm64Stage2, HostMmOps, TreeMemslots>;

const BASE: u64 = 1 << 30;
const SIZE: usize = 4 << 20;
const PAGE: u64 = 4096;
const NPAGES: u64 = SIZE as u64 / PAGE;
const WORDS: usize = SIZE / 4096 / 64;

fn mmu(policy: MmuPolicy) -> Arc<HostMmu> {
    Arc::new(
        Mmu::new(
            Arm64Stage2::new(Granule::K4, 40).unwrap(),
            HostMmOps::new(4096).unwrap(),
            Arc::new(NoTlb),
            TreeMemslots::new(),
            policy,
        )
        .unwrap(),
    )
}

/// Guest memory of one 4 MiB region at `BASE` whose bitmap is `bitmap`,
/// registered as logged memslot 0 of `m`.
fn guest<B: Bitmap + 'static>(m: &HostMmu, bitmap: B) -> GuestMemoryMmap<B> {
    // vm-memory's builder maps PROT_NONE unless told otherwise.
    let region = MmapRegionBuilder::new_with_bitmap(SIZE, bitmap)
        .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
        .build()
        .unwrap();
    let hva = region.as_ptr() as u64;
    let mem = GuestMemoryMmap::from_regions(vec![
        GuestRegionMmap::new(region, GuestAddress(BASE)).unwrap()
    ])
    .unwrap();
    let slot = UserMemoryRegion::new(
        0,
        SlotFlags::LOG_DIRTY_PAGES,
        Gpa::new(BASE),
        SIZE as u64,
        Hva::new(hva),
    );
    m.set_memory_region(&slot, 4096).unwrap();
    mem
}

/// The pages set in `log`, in order.
fn pages(log: &[u64]) -> Vec<u64> {
    (0..log.len() as u64 * 64)
        .filter(|p| log[(p / 64) as usize] & (1 << (p % 64)) != 0)
        .collect()
}

/// A device model's writes: a 10-byte write across pages 6 and 7, a u64
/// at page 100, and a used-ring element written through a slice of page
/// 200 (the slice's bitmap is an offset into the region's).
fn device_writes<B: Bitmap>(mem: &GuestMemoryMmap<B>) {
    mem.write_slice(&[0xa5; 10], GuestAddress(BASE + 7 * PAGE - 4))
        .unwrap();
    mem.write_obj(0x1122_3344_5566_7788_u64, GuestAddress(BASE + 100 * PAGE))
        .unwrap();
    let ring = mem
        .get_slice(GuestAddress(BASE + 200 * PAGE + 64), 16)
        .unwrap();
    ring.write_obj(7u32, 8).unwrap();
}

#[test]
fn device_and_guest_writes_come_out_of_one_get() {
    for dirty in [DirtyMode::WP, DirtyMode::HW] {
        let m = mmu(MmuPolicy {
            dirty,
            ..MmuPolicy::default()
        });
        let mem = guest(&m, SlotDirtyBitmap::new(m.clone(), 0, 0));
        let mut vcpu = m.new_vcpu().unwrap();
        // The guest writes page 3 (a stage-2 write fault on a logged slot).
        m.handle_fault(&mut vcpu, Gpa::new(BASE + 3 * PAGE), true)
            .unwrap();
        device_writes(&mem);
        assert!(mem
            .find_region(GuestAddress(BASE))
            .unwrap()
            .bitmap()
            .dirty_at(100 * PAGE as usize));
        let mut log = vec![0u64; WORDS];
        assert_eq!(m.get_dirty_log(0, &mut log).unwrap(), 5, "{dirty:?}");
        assert_eq!(pages(&log), [3, 6, 7, 100, 200], "{dirty:?}");
        // The data is where the device wrote it.
        assert_eq!(
            mem.read_obj::<u64>(GuestAddress(BASE + 100 * PAGE))
                .unwrap(),
            0x1122_3344_5566_7788
        );
        // Harvested (GET + CLEAR, manual protect as the default policy):
        // the next GET is empty until the next write.
        assert_eq!(m.clear_dirty_log(0, 0, NPAGES, &log).unwrap(), 5);
        assert_eq!(m.get_dirty_log(0, &mut log).unwrap(), 0, "{dirty:?}");
        mem.write_obj(1u8, GuestAddress(BASE + 9 * PAGE)).unwrap();
        assert_eq!(m.get_dirty_log(0, &mut log).unwrap(), 1);
        assert_eq!(pages(&log), [9]);
        let bitmap = mem.find_region(GuestAddress(BASE)).unwrap().bitmap();
        assert_eq!(bitmap.refused_marks(), 0);
    }
}

#[test]
fn a_dirty_view_sees_device_writes_too() {
    let m = mmu(MmuPolicy::default());
    let mem = guest(&m, SlotDirtyBitmap::new(m.clone(), 0, 0));
    let view = m.open_dirty_view(0).unwrap();
    // A view starts all dirty: take and clear everything first.
    let mut bits = vec![0u64; WORDS];
    m.get_dirty_view(view, &mut bits).unwrap();
    m.clear_dirty_view(view, 0, NPAGES, &bits).unwrap();
    device_writes(&mem);
    assert_eq!(m.get_dirty_view(view, &mut bits).unwrap(), 4);
    assert_eq!(pages(&bits), [6, 7, 100, 200]);
}

/// Without the adapter (vm-memory's `()` bitmap) the device's writes are
/// missing from the log: the check above can fail.
#[test]
fn without_the_adapter_device_writes_are_lost() {
    let m = mmu(MmuPolicy::default());
    let mem = guest(&m, ());
    device_writes(&mem);
    let mut log = vec![0u64; WORDS];
    assert_eq!(m.get_dirty_log(0, &mut log).unwrap(), 0);
}

#[test]
fn marks_the_mmu_refuses_are_counted_not_lost_silently() {
    let m = mmu(MmuPolicy::default());
    // The bitmap claims slot 1, which does not exist.
    let mem = guest(&m, SlotDirtyBitmap::new(m.clone(), 1, 0));
    device_writes(&mem);
    let bitmap = mem.find_region(GuestAddress(BASE)).unwrap().bitmap();
    assert_eq!(bitmap.refused_marks(), 3);
    // The MMU's own checks, called directly: nothing marked on an error.
    assert_eq!(
        m.mark_dirty_by_host(0, 1020, 5),
        Err(Error::OutOfRange {
            ipa: BASE + 1020 * PAGE,
            size: 5 * PAGE,
            limit: BASE + SIZE as u64
        })
    );
    assert!(m.mark_dirty_by_host(0, u64::MAX, 2).is_err());
    let mut log = vec![0u64; WORDS];
    assert_eq!(m.get_dirty_log(0, &mut log).unwrap(), 0);
    assert_eq!(m.mark_dirty_by_host(0, 1020, 4), Ok(4));
    assert_eq!(m.mark_dirty_by_host(0, 1020, 4), Ok(0), "already marked");
    // Dirty rings have no place for a host write.
    let rings = mmu(MmuPolicy {
        dirty: DirtyMode::Ring { entries: 4096 },
        ..MmuPolicy::default()
    });
    let _mem = guest(&rings, SlotDirtyBitmap::new(rings.clone(), 0, 0));
    assert!(matches!(
        rings.mark_dirty_by_host(0, 0, 1),
        Err(Error::WrongDirtyMode { .. })
    ));
}
