//! The arm64 Linux guest's host-side device models against a hostile
//! guest kernel, without QEMU: sequences of the exits a guest controls —
//! MMIO aborts (any syndrome, IPA, width, register, value) decoded and
//! dispatched to the vGIC's distributor and redistributors and the 16550
//! on the bus, PSCI calls, ICC_SGI1R_EL1 writes, list registers as the
//! stub reports them, host input to the UART — then the GIC's migration
//! bytes loaded back, and the input itself decoded as a migrated device
//! state. Nothing may panic; every target a decode names exists; the
//! list registers the host fills carry INTIDs the distributor has; the
//! GIC's state after anything a guest did loads on a destination and
//! saves to the same bytes.
//!
//! `cargo +nightly fuzz run devices`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use s2mmu_arm64::linux::bus::MmioBus;
use s2mmu_arm64::linux::gic::{Gic, ICH_HCR_EN, ICH_HCR_UIE, NR_IRQS, NR_LRS};
use s2mmu_arm64::linux::gic_frames::{GicDistributor, GicRedistributors};
use s2mmu_arm64::linux::mmio::{self, MmioDecode};
use s2mmu_arm64::linux::psci::{self, PsciCall};
use s2mmu_arm64::linux::uart::{Uart, UartOutput, UART_REGS};
use s2mmu_arm64_migrate::state::linux::{decode, gic_load, gic_save};
use std::sync::Arc;

const GICD: u64 = 0x0800_0000;
const GICR: u64 = 0x080a_0000;
const UART: u64 = 0x0900_0000;
const UART_SPI: u32 = 1;

fn u64_at(c: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    for (i, x) in b.iter_mut().enumerate() {
        *x = c.get(at + i).copied().unwrap_or(0);
    }
    u64::from_le_bytes(b)
}

/// An IPA near a device (or anywhere), from the op's bytes.
fn ipa(sel: u8, off: u64, vcpus: usize) -> u64 {
    match sel % 5 {
        0 => GICD + off % 0x1_0100,
        1 => GICR + off % (0x2_0000 * vcpus as u64 + 0x100),
        2 => UART + off % 0x20,
        3 => off & ((1 << 52) - 1),
        _ => off,
    }
}

fn one_op(c: &[u8], gic: &Gic, devs: &MmioBus, uart: &Uart) {
    let vcpus = gic.vcpus();
    let (a, b) = (u64_at(c, 2), u64_at(c, 10));
    match c[0] % 7 {
        0 => {
            // A data abort: the syndrome's ISS from the op's bytes.
            let esr = 0x24 << 26 | (a & 0x1ff_ffff);
            let ipa = ipa(c[1], b, vcpus);
            let value = a.rotate_left(17) ^ b;
            match mmio::decode(esr, ipa, |n| value ^ n) {
                MmioDecode::Access(op) => {
                    assert!(matches!(op.size, 1 | 2 | 4 | 8) && op.srt < 32);
                    if let Ok((v, _)) = devs.access(op.ipa, op.size, op.write) {
                        let r = mmio::load_value(esr, op.size, v);
                        if esr & (1 << 15) == 0 {
                            assert!(r <= u64::from(u32::MAX), "a W register's load");
                        }
                    }
                }
                MmioDecode::FetchOrWalk | MmioDecode::CacheMaintenance | MmioDecode::NoSyndrome => {}
            }
            let _ = mmio::next_insn(value);
        }
        1 => {
            let x = [
                a & 0xffff_ffff | u64::from(c[1] & 1) << 32 | 0x8400_0000,
                b,
                a,
                b ^ a,
            ];
            let x = if c[1] & 2 != 0 { [a, b, a, b] } else { x };
            match psci::decode(x) {
                PsciCall::CpuOn { target, .. } | PsciCall::AffinityInfo { target } => {
                    if let Some(t) = psci::vcpu_of(target, vcpus) {
                        assert!(t < vcpus);
                    }
                }
                _ => {}
            }
        }
        2 => {
            let from = c[1] as usize % vcpus;
            let (intid, targets) = gic.sgi_targets(from, a);
            assert!(intid < 16);
            for t in targets {
                assert!(t < vcpus, "SGI target {t} of {vcpus} vCPUs");
                let _ = gic.raise(t, intid);
            }
        }
        3 => {
            let v = c[1] as usize % vcpus;
            let mut lrs: [u64; NR_LRS] = [a, b, a ^ b, a.wrapping_mul(b)];
            let before = lrs;
            let hcr = gic.sync_lrs(v, &mut lrs);
            assert!(hcr == ICH_HCR_EN || hcr == ICH_HCR_EN | ICH_HCR_UIE);
            for (new, old) in lrs.iter().zip(before) {
                if *new != old && *new != old | 1 << 62 {
                    assert!(new & 0xffff_ffff < u64::from(NR_IRQS), "LR {new:#x}");
                }
            }
        }
        4 => {
            if let Some(t) = gic.raise(c[1] as usize % vcpus, (a % 200) as u32) {
                assert!(t < vcpus);
            }
        }
        5 => {
            let n = uart.enqueue(&c[1..]);
            assert!(n <= 64);
        }
        _ => {
            // A byte-wide UART register, the way Linux's 8250 driver goes.
            let off = u64::from(c[1]) % (UART_REGS + 2);
            let write = (c[1] & 0x80 != 0).then_some(a & 0xff);
            let _ = devs.access(UART + off, 1, write);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let vcpus = 1 + usize::from(data.first().copied().unwrap_or(0) % 8);
    let gic = Arc::new(Gic::new(vcpus));
    let g2 = Arc::clone(&gic);
    let uart = Arc::new(Uart::new(
        Arc::new(move || {
            let _ = g2.raise(0, 32 + UART_SPI);
        }),
        UartOutput::Discard,
    ));
    let mut bus = MmioBus::new();
    let dist = GicDistributor(gic.clone());
    let redist = GicRedistributors(gic.clone());
    let (dsize, rsize) = (dist.size(), redist.size());
    bus.insert("GIC distributor", GICD, dsize, Arc::new(dist))
        .expect("the distributor's frame is free");
    bus.insert("GIC redistributors", GICR, rsize, Arc::new(redist))
        .expect("the redistributors' frames are free");
    bus.insert("uart", UART, UART_REGS, uart.clone())
        .expect("the UART's range is free");
    for c in data.get(1..).unwrap_or(&[]).chunks_exact(18).take(64) {
        one_op(c, &gic, &bus, &uart);
    }
    // Its state as plain values builds the same GIC.
    let st = gic.state();
    assert_eq!(Gic::from_state(&st).expect("a guest-made GIC state").state(), st);
    // Whatever the guest did, a destination takes the GIC's state.
    let mut saved = Vec::new();
    gic_save(&gic, &mut saved);
    let loaded = gic_load(&saved, vcpus).expect("a guest-made GIC state loads");
    let mut again = Vec::new();
    gic_save(&loaded, &mut again);
    assert_eq!(saved, again);
    // The input as a migrated state: refused or loaded, never a panic.
    let _ = decode(data, vcpus, 64 << 20);
    let _ = gic_load(data, vcpus);
});
