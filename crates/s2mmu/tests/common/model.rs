//! A plain reference model of a stage-2 table: a map from leaf start to
//! leaf, with the engine's documented semantics written independently, and
//! a random operation type that drives both.

use s2mmu::format::arm64::{Arm64Stage2, Granule};
use s2mmu::tlb::TlbCall;
use s2mmu::{Error, MapOptions, PageTable, Prot, PteFormat, SplitPolicy};
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MLeaf {
    pub size: u64,
    pub pa: u64,
    pub prot: Prot,
}

/// One operation, in units of pages relative to the test window.
#[derive(Clone, Debug)]
pub enum Op {
    Map {
        page: u64,
        pages: u64,
        pa_page: u64,
        writable: bool,
        force: bool,
    },
    Unmap {
        page: u64,
        pages: u64,
    },
    Wrprotect {
        page: u64,
        pages: u64,
    },
    Relax {
        page: u64,
    },
    Split {
        page: u64,
        pages: u64,
        policy: u8,
    },
    TopUp {
        pages: usize,
    },
}

impl Op {
    /// Decodes an operation from raw bytes (for the fuzzer), in a window of
    /// `window_pages` pages whose block size is `block_pages`.
    pub fn from_bytes(b: &[u8], window_pages: u64, block_pages: u64) -> Option<Op> {
        if b.len() < 8 {
            return None;
        }
        let r = |i: usize| u64::from(u16::from_le_bytes([b[i], b[i + 1]]));
        let aligned = b[1] & 1 == 1;
        let unit = if aligned { block_pages } else { 1 };
        let page = (r(2) % (window_pages / unit)) * unit;
        let pages = (1 + r(4) % 4) * unit.max(1 + r(4) % 8);
        Some(match b[0] % 6 {
            0 => Op::Map {
                page,
                pages,
                pa_page: (r(6) % 64) * unit,
                writable: b[1] & 2 != 0,
                force: b[1] & 4 != 0,
            },
            1 => Op::Unmap { page, pages },
            2 => Op::Wrprotect { page, pages },
            3 => Op::Relax {
                page: r(6) % window_pages,
            },
            4 => Op::Split {
                page,
                pages,
                policy: b[1] >> 4,
            },
            _ => Op::TopUp {
                pages: (r(6) % 600) as usize,
            },
        })
    }
}

pub struct Model<F: PteFormat = Arm64Stage2> {
    pub fmt: F,
    pub base: u64,
    pub window: u64,
    pub leaves: BTreeMap<u64, MLeaf>,
}

impl Model<Arm64Stage2> {
    pub fn new(granule: Granule, ipa_bits: u32, base: u64, window: u64) -> Self {
        Model::with_format(Arm64Stage2::new(granule, ipa_bits).unwrap(), base, window)
    }
}

impl<F: PteFormat> Model<F> {
    /// A model of a table of any format.
    pub fn with_format(fmt: F, base: u64, window: u64) -> Self {
        Model {
            fmt,
            base,
            window,
            leaves: BTreeMap::new(),
        }
    }

    fn page(&self) -> u64 {
        self.fmt.page_size()
    }

    /// Leaves overlapping [a, b).
    fn overlapping(&self, a: u64, b: u64) -> Vec<(u64, MLeaf)> {
        // A leaf starting before `a` may still reach into the range.
        let from = self
            .leaves
            .range(..a)
            .next_back()
            .filter(|(s, l)| *s + l.size > a)
            .map(|(s, _)| *s)
            .unwrap_or(a);
        self.leaves.range(from..b).map(|(s, l)| (*s, *l)).collect()
    }

    /// The block sizes the format allows, largest first.
    fn leaf_sizes(&self) -> Vec<u64> {
        (self.fmt.start_level()..=self.fmt.last_level())
            .filter(|&l| self.fmt.leaf_allowed(l))
            .map(|l| self.fmt.granule(l))
            .collect()
    }

    pub fn map(
        &mut self,
        ipa: u64,
        size: u64,
        pa: u64,
        prot: Prot,
        force: bool,
    ) -> Result<(), Error> {
        if let Some((s, _)) = self.overlapping(ipa, ipa + size).first() {
            return Err(Error::AlreadyMapped { ipa: (*s).max(ipa) });
        }
        let off = pa.wrapping_sub(ipa);
        let sizes = self.leaf_sizes();
        let mut a = ipa;
        while a < ipa + size {
            let g = sizes
                .iter()
                .copied()
                .find(|&g| {
                    (!force || g == self.page())
                        && a.is_multiple_of(g)
                        && ipa + size - a >= g
                        && a.wrapping_add(off).is_multiple_of(g)
                })
                .unwrap();
            self.leaves.insert(
                a,
                MLeaf {
                    size: g,
                    pa: a.wrapping_add(off),
                    prot,
                },
            );
            a += g;
        }
        Ok(())
    }

    pub fn unmap(&mut self, ipa: u64, size: u64) -> Result<Vec<(u64, MLeaf)>, Error> {
        let hit = self.overlapping(ipa, ipa + size);
        for (s, l) in &hit {
            if *s < ipa || s + l.size > ipa + size {
                return Err(Error::SplitsBlock {
                    block_ipa: *s,
                    block_size: l.size,
                });
            }
        }
        for (s, _) in &hit {
            self.leaves.remove(s);
        }
        Ok(hit)
    }

    pub fn wrprotect(&mut self, ipa: u64, size: u64) -> Vec<(u64, MLeaf)> {
        let mut changed = Vec::new();
        for (s, l) in self.overlapping(ipa, ipa + size) {
            if l.prot.contains(Prot::W) {
                let nl = MLeaf {
                    prot: l.prot.difference(Prot::W),
                    ..l
                };
                self.leaves.insert(s, nl);
                changed.push((s, l));
            }
        }
        changed
    }

    pub fn relax(&mut self, ipa: u64) -> Result<(), Error> {
        let hit = self.overlapping(ipa, ipa + self.page());
        let Some((s, l)) = hit.first().copied() else {
            return Err(Error::NotMapped { ipa });
        };
        self.leaves.insert(
            s,
            MLeaf {
                prot: l.prot | Prot::W,
                ..l
            },
        );
        Ok(())
    }

    /// Splits every block overlapping the range into pages; returns the
    /// blocks split.
    pub fn split(&mut self, ipa: u64, size: u64) -> Vec<(u64, MLeaf)> {
        let page = self.page();
        let mut split = Vec::new();
        for (s, l) in self.overlapping(ipa, ipa + size) {
            if l.size > page {
                self.leaves.remove(&s);
                for i in 0..l.size / page {
                    self.leaves.insert(
                        s + i * page,
                        MLeaf {
                            size: page,
                            pa: l.pa + i * page,
                            prot: l.prot,
                        },
                    );
                }
                split.push((s, l));
            }
        }
        split
    }
}

pub fn policy_of(n: u8) -> SplitPolicy {
    match n % 3 {
        0 => SplitPolicy::SkipReturns,
        1 => SplitPolicy::FullWalk,
        _ => SplitPolicy::NoLastLevelTables,
    }
}

fn covered(calls: &[TlbCall], ipa: u64, size: u64) -> bool {
    calls.iter().any(|c| c.covers(ipa, size))
}

/// Applies `op` to the table (through the fixture) and to the model, and
/// checks that both agree: same result, same leaves, invalidations that
/// cover everything removed or restricted, no leaked table page.
pub fn apply<F: PteFormat>(fx: &mut super::Fixture<F>, m: &mut Model<F>, op: &Op) {
    let page = m.page();
    let window_pages = m.window / page;
    let clamp = |p: u64, n: u64| {
        let p = p % window_pages;
        let n = n.clamp(1, window_pages - p);
        (m.base + p * page, n * page)
    };
    fx.tlb.take();
    match *op {
        Op::Map {
            page: p,
            pages,
            pa_page,
            writable,
            force,
        } => {
            let (ipa, size) = clamp(p, pages);
            let pa = 0x40_0000_0000 + pa_page * page;
            let prot = if writable { Prot::RW } else { Prot::R };
            apply_map(fx, m, (ipa, size), pa, prot, force);
        }
        Op::Unmap { page: p, pages } => {
            let (ipa, size) = clamp(p, pages);
            apply_unmap(fx, m, ipa, size);
        }
        Op::Wrprotect { page: p, pages } => {
            let (ipa, size) = clamp(p, pages);
            let n = fx.pt.wrprotect(ipa, size).unwrap();
            let changed = m.wrprotect(ipa, size);
            assert_eq!(n as usize, changed.len());
            let calls = fx.tlb.take();
            for (s, l) in changed {
                assert!(
                    covered(&calls, s, l.size),
                    "protected {s:#x} not invalidated"
                );
            }
        }
        Op::Relax { page: p } => {
            let ipa = m.base + (p % window_pages) * page;
            let got = fx.pt.relax_perms(ipa, Prot::RW);
            let want = m.relax(ipa);
            assert_eq!(got.map(|_| ()), want, "relax {ipa:#x}");
        }
        Op::Split {
            page: p,
            pages,
            policy,
        } => {
            let (ipa, size) = clamp(p, pages);
            apply_split(fx, m, ipa, size, policy);
        }
        Op::TopUp { pages } => {
            if pages < 50 {
                fx.cache.release_all();
            }
            fx.cache.top_up(pages).unwrap();
        }
    }
    check(fx, m);
}

/// `Op::Map` of `(ipa, size)`: the same result as the model, or a cache
/// too small that left the cache untouched; never an invalidation.
fn apply_map<F: PteFormat>(
    fx: &mut super::Fixture<F>,
    m: &mut Model<F>,
    (ipa, size): (u64, u64),
    pa: u64,
    prot: Prot,
    force: bool,
) {
    let opts = MapOptions { force_pages: force };
    let before = fx.cache.len();
    let got = fx.pt.map(ipa, size, pa, prot, &mut fx.cache, opts);
    match got {
        Err(Error::CacheExhausted { needed, available }) => {
            assert_eq!(available, before);
            assert!(needed > available);
            assert_eq!(fx.cache.len(), before, "cache untouched on error");
        }
        got => {
            let want = m.map(ipa, size, pa, prot, force);
            assert_eq!(got.map(|_| ()), want, "map {ipa:#x}+{size:#x}");
        }
    }
    assert!(
        fx.tlb.is_empty(),
        "mapping into empty entries needs no invalidation"
    );
}

/// `Op::Unmap`: the model's result, and every removed leaf invalidated.
fn apply_unmap<F: PteFormat>(fx: &mut super::Fixture<F>, m: &mut Model<F>, ipa: u64, size: u64) {
    let got = fx.pt.unmap(ipa, size);
    let want = m.unmap(ipa, size);
    assert_eq!(
        got.is_ok(),
        want.is_ok(),
        "unmap {ipa:#x}+{size:#x}: {got:?}"
    );
    if let (Err(g), Err(w)) = (&got, &want) {
        assert_eq!(g, w);
    }
    if let Ok(removed) = want {
        let calls = fx.tlb.take();
        for (s, l) in removed {
            assert!(
                covered(&calls, s, l.size),
                "unmapped {s:#x} not invalidated"
            );
        }
    }
}

/// `Op::Split` with the cache topped up: complete, the model's blocks
/// split, each of them invalidated.
fn apply_split<F: PteFormat>(
    fx: &mut super::Fixture<F>,
    m: &mut Model<F>,
    ipa: u64,
    size: u64,
    policy: u8,
) {
    let need = fx.pt.split_capacity(size + 2 * (1 << 30).min(m.window));
    fx.cache.top_up(need).unwrap();
    let st = fx
        .pt
        .split(ipa, size, &mut fx.cache, policy_of(policy))
        .unwrap();
    assert!(st.complete);
    let split = m.split(ipa, size);
    assert_eq!(st.blocks_split, split.len() as u64, "blocks split");
    let calls = fx.tlb.take();
    for (s, l) in split {
        assert!(
            covered(&calls, s, l.size),
            "split block {s:#x} not invalidated"
        );
    }
}

/// The table's leaves in the window equal the model's.
pub fn check<F: PteFormat>(fx: &super::Fixture<F>, m: &Model<F>) {
    let got: Vec<(u64, MLeaf)> = fx
        .pt
        .leaves(m.base, m.window)
        .unwrap()
        .into_iter()
        .map(|l| {
            (
                l.ipa,
                MLeaf {
                    size: l.size,
                    pa: l.pa,
                    prot: l.prot,
                },
            )
        })
        .collect();
    let want: Vec<(u64, MLeaf)> = m.leaves.iter().map(|(s, l)| (*s, *l)).collect();
    assert_eq!(got, want);
    // Spot-check the lockless translation against the model.
    for (s, l) in m.leaves.iter().take(8) {
        let t = fx.pt.translate(s + l.size - 8).unwrap();
        assert_eq!(t.pa, l.pa + l.size - 8);
        assert_eq!(t.prot, l.prot);
    }
    fx.assert_no_leak();
}

pub fn block_pages(g: Granule) -> u64 {
    let f = Arm64Stage2::new(g, 40).unwrap();
    f.granule(2) / f.page_size()
}

pub type Table = PageTable<Arm64Stage2, s2mmu::HostMmOps>;
