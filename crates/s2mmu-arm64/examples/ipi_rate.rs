//! SGIs a second between the vCPUs of the Linux VM, for 1, 2 and 4 vCPUs:
//! the EL1 guest of `asm/el1_tests.S` (scenario `Ipi`) turns every vCPU
//! on, each waiting in WFI with its SGIs enabled, then vCPU 0 sends 20,000
//! SGIs, each to every vCPU (itself included), and prints the counter
//! ticks they took. Each is trapped, raised for every target and kicked
//! to those in their guest with no kick on the way. The same image under
//! QEMU alone (its own GICv3 and PSCI, no EL2: the writes are not
//! trapped) is the outside reference. Medians over the runs.
//!
//! ```text
//! cargo run --release -p s2mmu-arm64 --example ipi_rate -- [RUNS] [VCPUS...]
//! ```
//! Defaults: 5 runs; 1, 2 and 4 vCPUs.

#[path = "../tests/common/el1.rs"]
mod el1;

use el1::{hex, Scenario};
use s2mmu_arm64::linux::vm;
use s2mmu_stats::median;
use std::process::Command;
use std::time::Duration;

fn main() {
    let nums: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let runs = nums.first().copied().unwrap_or(5).clamp(1, 100);
    let cpus: Vec<usize> = match nums.get(1..) {
        Some(c) if !c.is_empty() => c.to_vec(),
        _ => vec![1, 2, 4],
    };
    let f = el1::files(Scenario::Ipi);
    let mut first = None;
    for &n in &cpus {
        let (mut ours, mut qemu, mut wakes) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            let r = vm::run(&el1::config(&f, n, Duration::from_secs(300)))
                .unwrap_or_else(|e| fail(&format!("the VM: {e}")));
            ours.push(rate(&r.console, n));
            // The other vCPUs' interrupt exits: the kicks that woke them.
            wakes.push(r.vcpu_exits.iter().skip(1).map(|e| e[4]).sum::<u64>() as f64);
            qemu.push(rate(&qemu_alone(&f.kernel, n), n));
        }
        let (m, q) = (median(&ours).unwrap_or(0.0), median(&qemu).unwrap_or(0.0));
        let base = *first.get_or_insert(m);
        println!(
            "{{\"vcpus\":{n},\"runs\":{runs},\"sgis_per_s_median\":{m:.0},\
             \"of_1_vcpu\":{:.2},\"qemu_alone_median\":{q:.0},\"runs_per_s\":{ours:.0?},\
             \"kicked_exits_median\":{:.0}}}",
            m / base,
            median(&wakes).unwrap_or(0.0)
        );
    }
}

/// SGI writes a second from the guest's "el1: ipi" line.
fn rate(console: &str, vcpus: usize) -> f64 {
    let line = console
        .lines()
        .find_map(|l| l.strip_prefix("el1: ipi "))
        .unwrap_or_else(|| fail(&format!("no ipi line; console:\n{console}")));
    let w: Vec<u64> = line.split_whitespace().map(hex).collect();
    // vCPUs, SGIs sent, ticks, ticks a second, SGIs vCPU 0 took (each
    // one: it is a target of every one).
    if w.len() != 5 || w[0] != vcpus as u64 || w[2] == 0 || w[4] != w[1] {
        fail(&format!("bad ipi line {line:?} for {vcpus} vCPUs"));
    }
    w[1] as f64 * w[3] as f64 / w[2] as f64
}

/// The image under QEMU alone; its console.
fn qemu_alone(kernel: &std::path::Path, vcpus: usize) -> String {
    let qemu = std::env::var("S2MMU_QEMU").unwrap_or_else(|_| "qemu-system-aarch64".into());
    let out = Command::new(&qemu)
        .args(["-M", "virt,gic-version=3", "-cpu", "max", "-m", "128"])
        .args(["-smp", &vcpus.to_string(), "-display", "none"])
        .args(["-serial", "stdio", "-monitor", "none", "-kernel"])
        .arg(kernel)
        .output()
        .unwrap_or_else(|e| fail(&format!("{qemu}: {e}")));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn fail(why: &str) -> ! {
    eprintln!("ipi_rate: {why}");
    std::process::exit(1);
}
