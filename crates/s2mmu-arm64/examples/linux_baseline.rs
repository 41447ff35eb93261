//! Times the direct-QEMU boot of the Linux guest (no stage 2 of ours):
//! host seconds to `/init`'s count line and to power-off, for each vCPU
//! count given, over several runs, as JSON lines with the medians.
//!
//! ```text
//! cargo run --release -p s2mmu-arm64 --example linux_baseline -- [RUNS] [CPUS...]
//! ```
//! Defaults: 3 runs, 1 and 2 vCPUs, 1 GiB, `/init` runs nothing.

use std::time::Duration;

use s2mmu_arm64::linux::assets::{ensure, AssetOptions};
use s2mmu_arm64::linux::baseline::{measure, BaselineConfig};

fn main() {
    let nums: Vec<u32> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let runs = nums.first().copied().unwrap_or(3);
    let cpus: Vec<u32> = if nums.len() > 1 {
        nums[1..].to_vec()
    } else {
        vec![1, 2]
    };
    let assets = ensure(&AssetOptions::from_env()).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2);
    });
    for &n in &cpus {
        let cfg = BaselineConfig {
            cpus: n,
            mem_mib: 1024,
            run: "none".into(),
            args: String::new(),
            extra_append: String::new(),
            timeout: Duration::from_secs(300),
        };
        let s = measure(&assets, &cfg, runs).unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(1);
        });
        let each: Vec<String> = s
            .runs
            .iter()
            .map(|r| format!("[{:.3},{:.3}]", r.0, r.1))
            .collect();
        println!(
            "{{\"cpus\":{n},\"mem_mib\":1024,\"kernel\":\"{}\",\"runs_init_poweroff_s\":[{}],\"median_init_s\":{:.3},\"median_poweroff_s\":{:.3}}}",
            assets.kernel_version,
            each.join(","),
            s.median_init_s,
            s.median_poweroff_s
        );
    }
}
