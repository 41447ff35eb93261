//! Times the direct-QEMU boot of the Linux guest (no stage 2 of ours):
//! host seconds to `/init`'s count line and to power-off, for each vCPU
//! count given, over several runs, as JSON lines and a median summary.
//!
//! ```text
//! cargo run --release -p s2mmu-arm64 --example linux_baseline -- [RUNS] [CPUS...] [--console]
//! ```
//! Defaults: 3 runs, 1 and 2 vCPUs, 1 GiB, `/init` runs nothing.

use std::time::Duration;

use s2mmu_arm64::linux::assets::{ensure, AssetOptions};
use s2mmu_arm64::linux::baseline::{run_baseline, BaselineConfig};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let console = args.iter().any(|a| a == "--console");
    let nums: Vec<u32> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let runs = nums.first().copied().unwrap_or(3).clamp(1, 20);
    let cpus: Vec<u32> = if nums.len() > 1 {
        nums[1..].to_vec()
    } else {
        vec![1, 2]
    };
    let assets = match ensure(&AssetOptions::from_env()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    for &n in &cpus {
        let cfg = BaselineConfig {
            cpus: n,
            mem_mib: 1024,
            run: "none".into(),
            args: String::new(),
            extra_append: String::new(),
            timeout: Duration::from_secs(300),
        };
        let (mut init, mut off) = (Vec::new(), Vec::new());
        for run in 0..runs {
            let r = match run_baseline(&assets, &cfg) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("{e}");
                    std::process::exit(1);
                }
            };
            if console {
                eprintln!("{}", r.console);
            }
            println!(
                "{{\"cpus\":{n},\"run\":{run},\"init_s\":{:.3},\"poweroff_s\":{:.3},\"cpus_online\":{}}}",
                r.init_s, r.poweroff_s, r.cpus_online
            );
            init.push(r.init_s);
            off.push(r.poweroff_s);
        }
        println!(
            "{{\"cpus\":{n},\"runs\":{runs},\"median_init_s\":{:.3},\"median_poweroff_s\":{:.3},\"kernel\":\"{}\"}}",
            median(&mut init),
            median(&mut off),
            assets.kernel_version
        );
    }
}
