//! A guest on the host's real KVM live-migrated to another process over
//! TCP with the migration library (`s2mmu-migrate`), under KVM's own dirty
//! log. The guest is `s2mmu_kvm::migrate::writer` (RAM in three regions,
//! a vCPU writing a counter into every page without end, checking its SSE
//! state and TSC); a VMM swaps in its own machine and keeps the rest:
//! `KvmRam` (its regions), `KvmVm` (memslots, the in-kernel APIC, the
//! dirty log), `KvmVcpus` (vCPU threads, their full state, the throttle).
//!
//! ```sh
//! cargo run -p s2mmu-kvm --example kvm_migrate                 # dirty bitmap + CLEAR
//! cargo run -p s2mmu-kvm --example kvm_migrate -- --ring       # dirty rings
//! # or by hand, in two shells:
//! cargo run -p s2mmu-kvm --example kvm_migrate -- --dest 127.0.0.1:4444
//! cargo run -p s2mmu-kvm --example kvm_migrate -- --to 127.0.0.1:4444
//! ```
//!
//! Without `--dest`/`--to` it starts the destination as a child process.
//! It exits nonzero unless every page the destination starts from hashes
//! as the paused source's, and the guest runs on there from its counter.

use s2mmu_kvm::migrate::session_vm::KvmDirtyLog;
use s2mmu_kvm::migrate::writer::WriterGuest;
use s2mmu_kvm::migrate::writer_dest::{Started, WriterDest};
use s2mmu_migrate::session::dest::{serve_with, DestConfig};
use s2mmu_migrate::session::policy::Harvest;
use s2mmu_migrate::session::source::{run_source, SourceConfig};
use s2mmu_migrate::transport::{self, NetConfig};
use s2mmu_migrate::vm::SessionVm;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

fn net() -> NetConfig {
    NetConfig::plain(Duration::from_secs(20))
}

/// Serves one migration on `addr`, runs the guest for two seconds,
/// and prints what it started from (`DIGEST` of every page's hash, the
/// counter) and the passes it made.
fn destination(addr: &str, log: KvmDirtyLog) -> Result<(), String> {
    let listener = transport::bind(addr).map_err(|e| e.to_string())?;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "LISTEN {}", listener.local()).and_then(|()| out.flush());
    let started: Started = Default::default();
    let factory = WriterDest {
        log,
        started: started.clone(),
        drop_xsave: false,
    };
    let cfg = DestConfig::with_run_after(Duration::from_secs(2));
    let got = serve_with(&*listener, &factory, &cfg, &net()).map_err(|e| e.to_string())?;
    let r = started
        .lock()
        .map_err(|_| "poisoned")?
        .take()
        .ok_or("no start")?;
    if !r.errors.is_empty() {
        return Err(format!("the guest's checks failed: {:?}", r.errors));
    }
    let (hashes, counter) = (r.hashes, r.state.vcpus[0].regs.rax);
    let passes = got.resumed_progress.first().copied().unwrap_or(0);
    let hex: Vec<String> = hashes.iter().map(|h| format!("{h:x}")).collect();
    let _ = writeln!(out, "RESUMED {counter} {passes}\nHASHES {}", hex.join(","));
    Ok(())
}

/// Starts the guest, lets it run, migrates it to `addr`, and returns its
/// page hashes and counter as it stopped.
fn source(addr: &str, log: KvmDirtyLog) -> Result<(Vec<u64>, u64), String> {
    let kvm = s2mmu_kvm::open_kvm().map_err(|e| e.to_string())?;
    let guest = WriterGuest::start(&kvm, log, 1).map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(200));
    let harvest = match log {
        KvmDirtyLog::Bitmap => Harvest::Bitmap,
        KvmDirtyLog::Ring { .. } => Harvest::Ring,
    };
    let cfg = SourceConfig {
        harvest,
        ..SourceConfig::default()
    };
    let n = net();
    let connect = &mut |_| transport::client(transport::connect(addr, &n)?, &n);
    let out = run_source(&guest, &cfg, connect).map_err(|e| format!("source: {e}"))?;
    println!(
        "source: {} rounds, downtime {:.1} ms",
        out.rounds.len(),
        out.downtime.as_secs_f64() * 1e3
    );
    let st = guest.registers().map_err(|e| e.to_string())?; // paused since the switch
    Ok((guest.kvm_vm().ram().page_hashes(), st.vcpus[0].regs.rax))
}

/// Both ends: the destination as a child process of this program.
fn both(log: KvmDirtyLog, ring: bool) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut args = vec!["--dest", "127.0.0.1:0"];
    if ring {
        args.push("--ring");
    }
    let mut child = Command::new(exe)
        .args(&args)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    let mut next = || lines.next().and_then(Result::ok).unwrap_or_default();
    let first = next();
    let addr = first
        .strip_prefix("LISTEN ")
        .ok_or("the destination did not listen")?;
    let src = source(addr, log);
    if src.is_err() {
        let _ = child.kill();
    }
    let (resumed, hashes) = (next(), next());
    let _ = child.wait();
    let (here, counter) = src?;
    let mut r = resumed
        .split_whitespace()
        .skip(1)
        .filter_map(|w| w.parse::<u64>().ok());
    let (from, passes) = (r.next().ok_or("no RESUMED")?, r.next().unwrap_or(0));
    let there: Vec<u64> = hashes
        .strip_prefix("HASHES ")
        .ok_or("no HASHES")?
        .split(',')
        .filter_map(|h| u64::from_str_radix(h, 16).ok())
        .collect();
    let differ = here.iter().zip(&there).filter(|(a, b)| a != b).count();
    println!(
        "{} pages, {differ} differ; counter {counter} on the source, resumed at {from}, \
         {passes} passes on the destination",
        here.len()
    );
    if here.len() != there.len() || differ != 0 || from != counter || passes == 0 {
        return Err("the destination is not where the source stopped, or did not go on".into());
    }
    Ok(())
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ring = args.iter().any(|a| a == "--ring");
    let log = if ring {
        KvmDirtyLog::Ring { entries: 4096 }
    } else {
        KvmDirtyLog::Bitmap
    };
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
    };
    for a in &args {
        if a.starts_with("--") && !["--ring", "--dest", "--to"].contains(&a.as_str()) {
            return Err(format!(
                "{a}: the options are --ring, --dest ADDR and --to ADDR"
            ));
        }
    }
    if let Some(reason) = s2mmu_kvm::kvm_unusable_reason() {
        return Err(format!("KVM cannot run this guest here: {reason}"));
    }
    match (value("--dest"), value("--to")) {
        (Some(addr), None) => destination(addr, log),
        (None, Some(addr)) => {
            source(addr, log).map(|(h, c)| println!("{} pages, counter {c}", h.len()))
        }
        (None, None) => both(log, ring),
        _ => Err("--dest and --to are the two ends: give one".into()),
    }
}
