//! `s2mmu migrate-bench --vs-qemu`: our migration of the Linux guest
//! against QEMU 7.2's own, interleaved, over loopback and shaped links
//! (the engine is `s2mmu_bench::vs_qemu`).

use s2mmu_arm64::linux::assets::{self, AssetOptions};
use s2mmu_bench::vs_qemu::{self, Cell, LinkSpec, Spec, LINKS};
use s2mmu_cli::limits;
use s2mmu_cli::migrate::parse_duration;
use std::path::PathBuf;
use std::time::Duration;

/// Flags of `migrate-bench`.
#[derive(clap::Args)]
pub struct Params {
    /// Against QEMU 7.2's own pre-copy and post-copy of the same guest, interleaved with ours.
    #[arg(long)]
    vs_qemu: bool,
    /// Cells (comma-separated): idle, write-64m, write-max, postcopy (default: all).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "idle,write-64m,write-max,postcopy"
    )]
    cells: Vec<String>,
    /// Links (comma-separated): loopback, 10gbit-0.2ms, 1gbit-1ms (default: all; the shaped ones need root for network namespaces).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "loopback,10gbit-0.2ms,1gbit-1ms"
    )]
    links: Vec<String>,
    /// Runs of each side per cell and link (1 to 20).
    #[arg(long, default_value_t = 3, value_parser = limits::u64_in(1..=20))]
    runs: u64,
    /// Guest memory of both sides (128M to 4G).
    #[arg(short = 'm', long, default_value = "256M", value_parser = limits::size_in(128 << 20..=4 << 30))]
    mem: u64,
    /// Guest vCPUs of both sides (1 to 4).
    #[arg(short = 'v', long, default_value_t = 1, value_parser = limits::u64_in(1..=4))]
    vcpus: u64,
    /// How long the guest program runs (5s to 600s; it must outlast boot, warm-up and the migration).
    #[arg(long, default_value = "12s", value_parser = parse_duration)]
    guest_time: Duration,
    /// Our side's dirty log: hw (hardware dirty state) or wp (write protection).
    #[arg(long, default_value = "hw", value_parser = ["hw", "wp"])]
    dirty: String,
    /// Our side's page compression (`s2mmu migrate --compress`): auto (its default), lz4 or off. QEMU's stays off, its own default.
    #[arg(long, default_value = "auto", value_parser = ["auto", "lz4", "off"])]
    ours_compress: String,
    /// QEMU's pre-copy across the namespaces over TLS with a pre-shared key, as ours (default: plain TCP; on a loaded host QEMU 7.2's TLS pre-copy can outlast the guest program: raise --guest-time).
    #[arg(long)]
    qemu_precopy_tls: bool,
    /// Folder for each QEMU's stderr and exit status (default: a new folder under the temp dir).
    #[arg(long)]
    logs: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

fn pick<T: Clone>(
    names: &[String],
    what: &str,
    find: impl Fn(&str) -> Option<T>,
) -> Result<Vec<T>, String> {
    names
        .iter()
        .map(|n| find(n).ok_or_else(|| format!("--{what}: no {what} named {n:?}")))
        .collect()
}

/// Runs the benchmark and prints its report.
///
/// # Errors
/// A bad flag, missing assets or QEMU, a link that cannot be made.
pub fn main(p: Params) -> Result<(), String> {
    if !p.vs_qemu {
        return Err("migrate-bench: say what against: --vs-qemu".into());
    }
    let secs = p.guest_time.as_secs();
    if !(5..=600).contains(&secs) {
        return Err(format!("--guest-time {secs}s: 5s to 600s"));
    }
    let cells = pick(&p.cells, "cells", Cell::parse)?;
    let links: Vec<LinkSpec> = pick(&p.links, "links", |n| {
        LINKS.iter().find(|l| l.name == n).cloned()
    })?;
    let a = assets::ensure(&AssetOptions::from_env())
        .map_err(|e| format!("the Linux guest's kernel and initramfs: {e}"))?;
    let spec = Spec {
        cells,
        links,
        runs: p.runs as u32,
        mem_mib: p.mem >> 20,
        vcpus: p.vcpus as u32,
        guest_secs: secs,
        ours_dirty: p.dirty.clone(),
        ours_compress: p.ours_compress.clone(),
        s2mmu: std::env::current_exe().map_err(|e| e.to_string())?,
        kernel: a.image,
        initrd: a.initramfs,
        scripts: PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts")),
        qemu_precopy_tls: p.qemu_precopy_tls,
        logs: p.logs.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("s2mmu-vsqemu-logs-{}", std::process::id()))
        }),
    };
    let quiet = p.json;
    let out = vs_qemu::run(&spec, &|l: &str| {
        if !quiet {
            eprintln!("{l}")
        }
    })?;
    if p.json {
        let settings = serde_json::json!({
            "mem_mib": spec.mem_mib, "vcpus": spec.vcpus, "runs": spec.runs,
            "guest_secs": secs, "kernel": spec.kernel, "initrd": spec.initrd,
            "ours_dirty": spec.ours_dirty, "ours_compress": spec.ours_compress,
            "qemu_precopy_tls": spec.qemu_precopy_tls, "qemu_logs": spec.logs,
            "program": "dirtier (tick=2: a line every 2 ms; checks every page it wrote)",
        });
        let ours = vs_qemu::report::ours_settings(&spec);
        println!("{}", vs_qemu::report::json(&out, settings, &ours));
    } else {
        print!(
            "{}",
            vs_qemu::report::text(&out, &vs_qemu::report::ours_settings(&spec))
        );
        println!("QEMU's stderr and exit status: {}", spec.logs.display());
    }
    Ok(())
}
