//! QEMU's stage-2 walker against the engine's tables: for each granule and
//! for IPA sizes that need concatenated roots, with a leaf at every level
//! the granule allows and hundreds of page leaves scattered between holes
//! (and blocks between holes), each sampled page translates (AT
//! S12E1R/W) to the output address the intended mapping gave it (not the
//! engine's own walk), and holes and read-only pages fault with the fault
//! status and level intended; guest accesses (EL1 loads and stores) agree.
//! A leaf mapped one page off on purpose is caught.

use crate::common;

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

/// A leaf of the intended mapping: IPA, size, output address, permissions,
/// and whether guest RAM backs it (a guest access can read it).
#[derive(Clone, Copy, Debug)]
struct Leaf {
    ipa: u64,
    size: u64,
    pa: u64,
    prot: Prot,
    backed: bool,
}

struct Layout {
    leaves: Vec<Leaf>,
    holes: Vec<u64>,
}

impl Layout {
    fn leaf_of(&self, ipa: u64) -> Option<&Leaf> {
        self.leaves
            .iter()
            .find(|l| ipa >= l.ipa && ipa - l.ipa < l.size)
    }
}

/// What `ipa` must do on an access (`write` or read), from the intended
/// mapping, not from the engine's tables: the output address the layout
/// gave it, a permission fault at the leaf's level for a write to a
/// read-only leaf, a translation fault where nothing is mapped (at the
/// level where the engine's walk stops, and the engine must agree nothing
/// maps it).
fn expected(
    fmt: &Arm64Stage2,
    lay: &Layout,
    pt: &PageTable<Arm64Stage2, ArenaMmOps>,
    ipa: u64,
    write: bool,
) -> Par {
    if let Some(l) = lay.leaf_of(ipa) {
        if write && !l.prot.contains(Prot::W) {
            let level = (fmt.start_level()..=3)
                .find(|&lv| fmt.granule(lv) == l.size)
                .expect("a leaf's size is a level's");
            return Par::Fault {
                fst: 0b0011 << 2 | u64::from(level),
                stage2: true,
            };
        }
        return Par::Pa((l.pa + (ipa - l.ipa)) & !0xfff);
    }
    assert!(pt.translate(ipa).is_none(), "the engine maps hole {ipa:#x}");
    let (level, _) = pt.lookup(ipa).expect("IPA inside the table's range");
    Par::Fault {
        fst: 0b0001 << 2 | u64::from(level),
        stage2: true,
    }
}

/// A deterministic pseudo-random sequence (64-bit LCG, high bits).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 16
    }
}

/// Pages scattered over 2 GiB + 8 MiB of IPA with holes between them, each
/// at a pseudo-random page of guest RAM (read-only one time in four), then
/// blocks of the smallest block size (where it is at most 32 MiB) at
/// pseudo-random far addresses, every other one a hole: many distinct
/// leaves, so a wrong output address for any of them shows.
fn scatter(fmt: &Arm64Stage2, leaves: &mut Vec<Leaf>, holes: &mut Vec<u64>) {
    let page = fmt.page_size();
    let mut rng = Lcg(fmt.page_shift() as u64 * 1000 + u64::from(fmt.ipa_bits()));
    let base = (2u64 << 30) + (8 << 20);
    let data_pages = DATA_BYTES / page;
    for i in 0..384 {
        let ipa = base + i * page;
        let r = rng.next();
        if r % 5 < 3 {
            let pa = layout::DATA + (rng.next() % data_pages) * page;
            let prot = if r.is_multiple_of(4) {
                Prot::R
            } else {
                Prot::RW
            };
            leaves.push(Leaf {
                ipa,
                size: page,
                pa,
                prot,
                backed: true,
            });
        } else {
            holes.push((ipa + (r % page)) & !7);
        }
    }
    let Some(block_level) = (fmt.start_level()..3).rev().find(|&l| fmt.leaf_allowed(l)) else {
        return;
    };
    let block = fmt.granule(block_level);
    if block > 32 << 20 {
        return;
    }
    let mut ipa = (base + 384 * page).next_multiple_of(block);
    for k in 0..8u64 {
        if k.is_multiple_of(2) {
            let pa = (1u64 << 40) + (rng.next() % 4096) * block;
            leaves.push(Leaf {
                ipa,
                size: block,
                pa,
                prot: Prot::RW,
                backed: false,
            });
        } else {
            holes.push((ipa + block / 3) & !7);
        }
        ipa += block;
    }
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
    let mut far_pa = 1u64 << 41;
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
        leaves.push(Leaf {
            ipa,
            size,
            pa,
            prot: Prot::RW,
            backed,
        });
        holes.push(ipa + size + size / 2);
        ipa += 2 * size;
        if l == 3 {
            backed_pa += size;
            let pa = backed_pa - size;
            leaves.push(Leaf {
                ipa,
                size,
                pa,
                prot: Prot::R,
                backed: true,
            });
            ipa += 2 * size;
        }
    }
    let top = fmt.ipa_limit() - 2 * big;
    far_pa = far_pa.next_multiple_of(big);
    leaves.push(Leaf {
        ipa: top,
        size: big,
        pa: far_pa,
        prot: Prot::RW,
        backed: false,
    });
    holes.push(top + big + 0x1000);
    // An address in a root entry nothing maps.
    holes.push(fmt.ipa_limit() / 2 + 0x3000);
    scatter(fmt, &mut leaves, &mut holes);
    Layout { leaves, holes }
}

/// The pages of a leaf the AT checks visit: all of a small one, 16 spread
/// over a large one (first and last included), so the checks count leaves,
/// not pages inside a few blocks.
fn sample_pages(l: &Leaf, page: u64) -> Vec<u64> {
    let n = l.size / page;
    if n <= 16 {
        return (0..n).map(|i| l.ipa + i * page + 0x08).collect();
    }
    (0..16)
        .map(|k| l.ipa + k * (n - 1) / 15 * page + 0x08)
        .collect()
}

/// Maps the layout with the engine (leaf `skew`, when given, one page off
/// its intended output address: the check's own proof that it can fail)
/// and checks QEMU's walker against the intended mapping; returns what
/// disagreed.
fn check_granule(
    m: &Arc<Machine>,
    granule: Granule,
    ipa_bits: u32,
    vmid: u64,
    skew: Option<usize>,
) -> Vec<String> {
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
    let mut lay = build(&fmt);
    let opts = MapOptions::default();
    cache.top_up(64).unwrap();
    // The probe code, identity-mapped.
    let text = Leaf {
        ipa: layout::GUEST_TEXT,
        size: layout::GUEST_TEXT_SIZE.max(page),
        pa: layout::GUEST_TEXT,
        prot: Prot::RWX,
        backed: true,
    };
    pt.map(text.ipa, text.size, text.pa, text.prot, &mut cache, opts)
        .unwrap();
    for (i, l) in lay.leaves.iter().enumerate() {
        cache.top_up(16).unwrap();
        let pa = if skew == Some(i) { l.pa + page } else { l.pa };
        pt.map(l.ipa, l.size, pa, l.prot, &mut cache, opts).unwrap();
        let t = pt.translate(l.ipa).unwrap();
        assert_eq!(
            t.size, l.size,
            "{granule:?}/{ipa_bits}: leaf at {:#x} is one mapping",
            l.ipa
        );
    }
    lay.leaves.push(text);
    let mut wrong = Vec::new();
    let mut checked = 0usize;
    let mut ipas: Vec<u64> = Vec::new();
    for l in &lay.leaves {
        ipas.extend(sample_pages(l, page));
    }
    ipas.extend(lay.holes.iter().copied());
    for write in [false, true] {
        for chunk in ipas.chunks(probe::MAX_AT_BATCH) {
            let pars = probe::at(m, regs, 0, chunk, write).unwrap();
            for (&ipa, &par) in chunk.iter().zip(&pars) {
                let want = expected(&fmt, &lay, &pt, ipa, write);
                if Par::decode(par) != want {
                    wrong.push(format!(
                        "{granule:?}/{ipa_bits}-bit: AT S12E1{} {ipa:#x}: PAR {par:#x}, intended {want:?}",
                        if write { "W" } else { "R" }
                    ));
                }
                checked += 1;
            }
        }
    }
    guest_accesses(m, regs, &fmt, &lay, &pt, &mut wrong);
    eprintln!(
        "{granule:?}, {ipa_bits}-bit IPA (start level {}, {} root pages): {checked} AT checks over {} leaves and {} holes",
        fmt.start_level(),
        fmt.root_pages(),
        lay.leaves.len(),
        lay.holes.len()
    );
    drop(pt);
    wrong
}

/// Guest accesses: a read of backed leaves (the first 8 and every 8th
/// after), a write to each, which a read-only page refuses; accesses to
/// holes fault as intended.
fn guest_accesses(
    m: &Arc<Machine>,
    regs: (u64, u64),
    fmt: &Arm64Stage2,
    lay: &Layout,
    pt: &PageTable<Arm64Stage2, ArenaMmOps>,
    wrong: &mut Vec<String>,
) {
    let page = fmt.page_size();
    let backed = lay
        .leaves
        .iter()
        .filter(|l| l.backed && l.ipa != layout::GUEST_TEXT);
    for (i, l) in backed.enumerate().filter(|(i, _)| *i < 8 || i % 8 == 0) {
        let off = (l.size / 2) & !(page - 1);
        let val = 0x5a5a_0000_0000 | i as u64;
        m.ram().write(l.pa + off + 16, val);
        let r = probe::access(m, regs, 0, l.ipa + off + 16, None).unwrap();
        if r.ok() != Some(val) {
            wrong.push(format!(
                "read at {:#x}: {r:?}, intended {val:#x}",
                l.ipa + off + 16
            ));
        }
        let w = probe::access(m, regs, 0, l.ipa + off + 24, Some(val + 1)).unwrap();
        if l.prot.contains(Prot::W) {
            if w.ok() != Some(val + 1) || m.ram().read(l.pa + off + 24) != val + 1 {
                wrong.push(format!(
                    "write at {:#x} did not reach {:#x}",
                    l.ipa + off + 24,
                    l.pa + off + 24
                ));
            }
        } else {
            let e = w.expect_err("a write to a read-only page faults");
            assert_eq!(e.esr >> 26, 0x24, "data abort from EL1");
            assert_eq!(e.dfsc(), 0b0011 << 2 | 3, "permission fault at level 3");
            assert!(e.write());
            assert_eq!(e.ipa(), l.ipa + off + 24);
        }
    }
    for &h in &lay.holes {
        let e = probe::access(m, regs, 0, h, None)
            .unwrap()
            .expect_err("hole faults");
        let Par::Fault { fst, .. } = expected(fmt, lay, pt, h, false) else {
            panic!("hole {h:#x} maps")
        };
        assert_eq!(e.dfsc(), fst, "translation fault level at {h:#x}");
        assert_eq!(e.ipa(), h, "HPFAR/FAR give the IPA");
    }
}

const CONFIGS: [(Granule, u32); 7] = [
    (Granule::K4, 40),
    (Granule::K4, 42),
    (Granule::K4, 48),
    (Granule::K16, 40),
    (Granule::K16, 48),
    (Granule::K64, 42),
    (Granule::K64, 48),
];

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn qemu_walks_engine_tables_as_intended() {
    let _one = common::serial();
    let Some(m) = common::machine(2, DATA_BYTES) else {
        return;
    };
    for (i, (g, bits)) in CONFIGS.into_iter().enumerate() {
        let wrong = check_granule(&m, g, bits, 10 + i as u64, None);
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }
}

#[test]
fn a_leaf_mapped_one_page_off_is_caught() {
    // The check's proof: one scattered page leaf mapped at the next page
    // of RAM. QEMU translates it where the engine put it, which is not
    // where the layout meant it to go: its AT checks and its guest read
    // report it (and nothing else does).
    let _one = common::serial();
    let Some(m) = common::machine(2, DATA_BYTES) else {
        return;
    };
    let fmt = Arm64Stage2::new(Granule::K4, 40).unwrap();
    let lay = build(&fmt);
    let first_scattered = lay
        .leaves
        .iter()
        .position(|l| l.ipa >= 2 << 30 && l.ipa < 3 << 30)
        .unwrap();
    let skewed = lay.leaves[first_scattered].ipa;
    let wrong = check_granule(&m, Granule::K4, 40, 30, Some(first_scattered));
    assert!(wrong.len() >= 2, "read and write AT of the leaf: {wrong:?}");
    let tag = format!("{:#x}", skewed + 0x08);
    assert!(
        wrong
            .iter()
            .all(|w| w.contains(&tag) || w.contains("read at")),
        "{wrong:?}"
    );
}
