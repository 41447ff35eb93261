//! QEMU's stage-2 walker against the engine's tables: for each granule and
//! for IPA sizes that need concatenated roots, with a leaf at every level
//! the granule allows, every mapped page translates (AT S12E1R/W) to the
//! address the engine's `translate` gives, and unmapped and read-only
//! pages fault with the fault status and level the engine's walk expects;
//! guest accesses (EL1 loads and stores) agree.

mod common;

use s2mmu::format::arm64::{Arm64Stage2, Granule};
use s2mmu::{MapOptions, PageCache, PageTable, Prot, PteFormat, TlbInvalidate};
use s2mmu_arm64::arena::ArenaMmOps;
use s2mmu_arm64::layout;
use s2mmu_arm64::machine::Machine;
use s2mmu_arm64::probe::{self, Par};
use s2mmu_arm64::stage2;
use s2mmu_arm64::tlbi::{HypSink, HypTlbi};
use std::sync::Arc;

const DATA_BYTES: u64 = 64 << 20;

/// What the engine says `ipa` must do on an access (`write` or read).
fn expected(pt: &PageTable<Arm64Stage2, ArenaMmOps>, ipa: u64, write: bool) -> Par {
    match pt.translate(ipa) {
        Some(t) if !write || t.prot.contains(Prot::W) => Par::Pa(t.pa & !0xfff),
        Some(t) => Par::Fault {
            fst: 0b0011 << 2 | u64::from(t.level),
            stage2: true,
        },
        None => {
            let (level, _) = pt.lookup(ipa).expect("IPA inside the table's range");
            Par::Fault {
                fst: 0b0001 << 2 | u64::from(level),
                stage2: true,
            }
        }
    }
}

struct Layout {
    /// (ipa, size, pa, prot, backed)
    leaves: Vec<(u64, u64, u64, Prot, bool)>,
    holes: Vec<u64>,
}

fn build(fmt: &Arm64Stage2) -> Layout {
    let mut leaves = Vec::new();
    let mut holes = Vec::new();
    let levels: Vec<u32> = (fmt.start_level()..=3)
        .filter(|&l| fmt.leaf_allowed(l))
        .collect();
    let big = fmt.granule(*levels.first().unwrap());
    // Low region: one leaf per level, each followed by a hole of its size;
    // pages also read-only. High region (the last root page): the same for
    // the largest level, so every concatenated root page is exercised.
    let mut ipa = (big * 2).max(1 << 32);
    let mut backed_pa = layout::DATA;
    let mut far_pa = 1u64 << 40;
    for &l in &levels {
        let size = fmt.granule(l);
        ipa = ipa.next_multiple_of(size);
        let backed = size <= DATA_BYTES / 8;
        let pa = if backed {
            backed_pa = backed_pa.next_multiple_of(size);
            backed_pa += size;
            backed_pa - size
        } else {
            far_pa = far_pa.next_multiple_of(size);
            far_pa += size;
            far_pa - size
        };
        leaves.push((ipa, size, pa, Prot::RW, backed));
        holes.push(ipa + size + size / 2);
        ipa += 2 * size;
        if l == 3 {
            backed_pa += size;
            leaves.push((ipa, size, backed_pa - size, Prot::R, true));
            ipa += 2 * size;
        }
    }
    let top = fmt.ipa_limit() - 2 * big;
    far_pa = far_pa.next_multiple_of(big);
    leaves.push((top, big, far_pa, Prot::RW, false));
    holes.push(top + big + 0x1000);
    // An address in a root entry nothing maps.
    holes.push(fmt.ipa_limit() / 2 + 0x3000);
    Layout { leaves, holes }
}

fn check_granule(m: &Arc<Machine>, granule: Granule, ipa_bits: u32, vmid: u64) {
    let fmt = Arm64Stage2::new(granule, ipa_bits).unwrap();
    let page = fmt.page_size();
    let arena = ArenaMmOps::new(m.ram().clone(), layout::TABLES, 32 << 20, page as usize).unwrap();
    let sink = Arc::new(HypSink::new(m.clone(), m.cpus() - 1));
    let tlb: Arc<dyn TlbInvalidate> = Arc::new(HypTlbi::new(
        sink.clone(),
        fmt.page_shift(),
        Default::default(),
    ));
    let mut pt = PageTable::new(fmt, arena.clone(), tlb).unwrap();
    let regs = (stage2::vtcr(&fmt, false), stage2::vttbr(pt.root_pa(), vmid));
    sink.set_context(regs.0, regs.1);
    let mut cache = PageCache::new(arena.clone());
    let lay = build(&fmt);
    let opts = MapOptions::default();
    cache.top_up(64).unwrap();
    // The probe code, identity-mapped.
    pt.map(
        layout::GUEST_TEXT,
        layout::GUEST_TEXT_SIZE.max(page),
        layout::GUEST_TEXT,
        Prot::RWX,
        &mut cache,
        opts,
    )
    .unwrap();
    for &(ipa, size, pa, prot, _) in &lay.leaves {
        cache.top_up(16).unwrap();
        pt.map(ipa, size, pa, prot, &mut cache, opts).unwrap();
        let t = pt.translate(ipa).unwrap();
        assert_eq!(
            t.size, size,
            "{granule:?}/{ipa_bits}: leaf at {ipa:#x} is one mapping"
        );
    }
    let mut checked = 0usize;
    let mut ipas: Vec<u64> = Vec::new();
    for &(ipa, size, ..) in &lay.leaves {
        ipas.extend((0..size / page).map(|i| ipa + i * page + 0x08));
    }
    ipas.extend(lay.holes.iter().copied());
    for write in [false, true] {
        for chunk in ipas.chunks(probe::MAX_AT_BATCH) {
            let pars = probe::at(m, regs, 0, chunk, write).unwrap();
            for (&ipa, &par) in chunk.iter().zip(&pars) {
                let want = expected(&pt, ipa, write);
                assert_eq!(
                    Par::decode(par),
                    want,
                    "{granule:?}/{ipa_bits}-bit: AT S12E1{} {ipa:#x}: PAR {par:#x}",
                    if write { "W" } else { "R" }
                );
                checked += 1;
            }
        }
    }
    // Guest accesses: a read of every backed leaf, a write to a read-only
    // page and accesses to holes fault as the engine expects.
    for (i, &(ipa, size, pa, prot, backed)) in lay.leaves.iter().enumerate() {
        if !backed {
            continue;
        }
        let off = (size / 2) & !(page - 1);
        let val = 0x5a5a_0000_0000 | i as u64;
        m.ram().write(pa + off + 16, val);
        let r = probe::access(m, regs, 0, ipa + off + 16, None).unwrap();
        assert_eq!(
            r.ok(),
            Some(val),
            "{granule:?}: read at {:#x}",
            ipa + off + 16
        );
        let w = probe::access(m, regs, 0, ipa + off + 24, Some(val + 1)).unwrap();
        if prot.contains(Prot::W) {
            assert_eq!(w.ok(), Some(val + 1));
            assert_eq!(
                m.ram().read(pa + off + 24),
                val + 1,
                "the write reached {pa:#x}"
            );
        } else {
            let e = w.expect_err("a write to a read-only page faults");
            assert_eq!(e.esr >> 26, 0x24, "data abort from EL1");
            assert_eq!(e.dfsc(), 0b0011 << 2 | 3, "permission fault at level 3");
            assert!(e.write());
            assert_eq!(e.ipa(), ipa + off + 24);
        }
    }
    for &h in &lay.holes {
        let e = probe::access(m, regs, 0, h, None)
            .unwrap()
            .expect_err("hole faults");
        let Par::Fault { fst, .. } = expected(&pt, h, false) else {
            panic!("hole {h:#x} maps")
        };
        assert_eq!(
            e.dfsc(),
            fst,
            "{granule:?}/{ipa_bits}: translation fault level at {h:#x}"
        );
        assert_eq!(e.ipa(), h, "HPFAR/FAR give the IPA");
    }
    eprintln!(
        "{granule:?}, {ipa_bits}-bit IPA (start level {}, {} root pages): {checked} AT checks, {} leaves, {} holes",
        fmt.start_level(),
        fmt.root_pages(),
        lay.leaves.len(),
        lay.holes.len()
    );
    drop(pt);
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn qemu_walks_engine_tables_like_the_engine() {
    let Some(m) = common::machine(2, DATA_BYTES) else {
        return;
    };
    let configs = [
        (Granule::K4, 40),
        (Granule::K4, 42),
        (Granule::K4, 48),
        (Granule::K16, 40),
        (Granule::K16, 48),
        (Granule::K64, 42),
        (Granule::K64, 48),
    ];
    for (i, (g, bits)) in configs.into_iter().enumerate() {
        check_granule(&m, g, bits, 10 + i as u64);
    }
}
