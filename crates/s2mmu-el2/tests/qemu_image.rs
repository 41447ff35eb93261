//! Builds the EL2 image (`image/`, for aarch64-unknown-none) and boots it
//! in QEMU's `virt` machine at EL2 on two CPUs: the engine answers the
//! guest's stage-2 aborts there, each CPU its own vCPU's. Asserts the counts it reports (0 lost, no extra, the
//! carve-out refused), never its timings (printed only). Replays the
//! trace of EL2's descriptor stores and invalidations the image writes
//! into the engine's break-before-make checker: clean on every table but
//! the one whose invalidations the image withheld on purpose, where each
//! rule the missing invalidations break must be flagged.

use s2mmu::bbm::{Rule, Violation};
use s2mmu::format::arm64::{Arm64Stage2, Granule};
use s2mmu_el2::trace::{self, Record};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn target_dir() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../../target"))
        .join("el2-image")
}

/// Builds the image with the cargo that runs this test; its path.
fn build_image() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("image/Cargo.toml");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--locked",
            "--target",
            "aarch64-unknown-none",
        ])
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(target_dir())
        .status()
        .expect("run cargo");
    assert!(st.success(), "building the EL2 image failed");
    target_dir().join("aarch64-unknown-none/release/s2mmu-el2-image")
}

/// Runs QEMU on `image` for at most `limit` in the directory `dir` (where
/// the image writes its trace); its output.
fn run_qemu(image: &PathBuf, dir: &Path, limit: Duration) -> (bool, String) {
    let qemu = std::env::var("S2MMU_QEMU").unwrap_or_else(|_| "qemu-system-aarch64".into());
    let out = Command::new("timeout")
        .arg(limit.as_secs().to_string())
        .arg(qemu)
        .args(["-M", "virt,virtualization=on", "-cpu", "max", "-m", "256M"])
        .args(["-smp", "2", "-accel", "tcg,thread=multi"])
        .args(["-nographic", "-semihosting", "-kernel"])
        .arg(image)
        .current_dir(dir)
        .output()
        .expect("run qemu");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// The `key=value` fields of the line starting with `prefix`.
fn fields<'a>(text: &'a str, prefix: &str) -> Vec<(&'a str, &'a str)> {
    let line = text
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line `{prefix}` in:\n{text}"));
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .collect()
}

fn field(text: &str, prefix: &str, key: &str) -> String {
    fields(text, prefix)
        .into_iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.to_string())
        .unwrap_or_else(|| panic!("no {key}= on `{prefix}`"))
}

#[test]
#[cfg_attr(
    not(s2mmu_el2_qemu),
    ignore = "needs qemu-system-aarch64 and the aarch64-unknown-none target (apt-get install qemu-system-arm; rustup target add aarch64-unknown-none)"
)]
fn the_engine_answers_stage2_aborts_at_el2_in_qemu() {
    let image = build_image();
    let dir = target_dir().join("run");
    std::fs::create_dir_all(&dir).expect("make the run directory");
    let trace_file = dir.join("el2-bbm.trace");
    let _ = std::fs::remove_file(&trace_file);
    let (ok, out) = run_qemu(&image, &dir, Duration::from_secs(120));
    println!("{out}");
    assert!(ok, "the EL2 image failed:\n{out}");
    assert!(out.contains("el2: done ok"), "{out}");
    // 4 MiB on 2 MiB blocks: the two data blocks and the code page, each
    // faulted once, or twice where both CPUs took it at once.
    let first: u64 = field(&out, "el2: first_touch", "translation_faults")
        .parse()
        .unwrap();
    assert!((3..=6).contains(&first), "{first} first-touch faults");
    // Both CPUs answered their vCPU's aborts at EL2.
    assert_eq!(field(&out, "el2: cpus", "cpus"), "2");
    let per_cpu = field(&out, "el2: cpus", "aborts_per_cpu");
    let per_cpu: Vec<u64> = per_cpu
        .split(',')
        .map(|n| n.trim().parse().unwrap())
        .collect();
    assert!(
        per_cpu.len() == 2 && per_cpu.iter().all(|&n| n > 0),
        "{per_cpu:?}"
    );
    let passes = [
        ("wp_a", "342"),
        ("wp_b", "205"),
        ("hw", "94"),
        ("ring", "1024"),
    ];
    for (pass, written) in passes {
        let p = format!("el2: harvest {pass}");
        assert_eq!(field(&out, &p, "written"), written, "{pass}");
        assert_eq!(field(&out, &p, "dirty"), written, "{pass}");
        assert_eq!(field(&out, &p, "lost"), "0", "{pass}");
        assert_eq!(field(&out, &p, "extra"), "0", "{pass}");
    }
    // One write-protection fault per page written while logging.
    assert_eq!(field(&out, "el2: harvest wp_a", "faults"), "342");
    assert_eq!(field(&out, "el2: harvest wp_b", "faults"), "205");
    assert_eq!(field(&out, "el2: wp_fault_cost", "samples"), "547");
    // DBM: the CPU set the dirty state, no abort reached EL2.
    assert_eq!(field(&out, "el2: harvest hw", "faults"), "0");
    assert_eq!(field(&out, "el2: isolation", "carve_out_read"), "refused");
    assert_eq!(field(&out, "el2: isolation", "carve_out_write"), "refused");
    assert_eq!(field(&out, "el2: counters", "refused"), "2");
    assert_eq!(field(&out, "el2: isolation", "mapped"), "0");
    assert_eq!(
        field(&out, "el2: isolation", "carve_out_slot"),
        "Some(CarveOut)"
    );
    check_exits(&out);
    // The TLBIs ran on the CPU at EL2 (an undefined one would have trapped
    // there and failed the run): leaves by IPA, ranges where the CPU has
    // FEAT_TLBIRANGE (QEMU's max CPU has), whole VMIDs.
    let count = |k: &str| field(&out, "el2: tlbi", k).parse::<u64>().unwrap();
    assert!(
        count("last_level") >= 547,
        "a relaxation per write-protection fault"
    );
    assert_eq!(field(&out, "el2: tlb", "range"), "1");
    assert!(count("range") > 0);
    assert!(count("vmid") > 0);
    check_bbm_trace(&trace_file, &out);
}

/// The exits to the host: ring-full and post-copy's missing pages.
fn check_exits(out: &str) {
    // Two rings of 256 entries for 1024 pages: between two harvests they
    // hold fewer than 512, so they filled and exited to the host (the
    // image's driver) at least twice, which harvested and reset them;
    // every page arrived (the harvest line: 0 lost).
    assert_eq!(field(out, "el2: ring", "entries"), "256");
    let exits: u64 = field(out, "el2: ring", "exits").parse().unwrap();
    assert!(exits >= 2, "{exits} ring-full exits");
    assert_eq!(field(out, "el2: ring", "foreign"), "0");
    // Post-copy: each of the 1024 pages reached the guest through its own
    // exit to the host and PAGE_READY, holding the host's contents under
    // the guest's write.
    assert_eq!(field(out, "el2: postcopy", "exits"), "1024");
    assert_eq!(field(out, "el2: postcopy", "arrived_once"), "1024");
    assert_eq!(field(out, "el2: postcopy", "contents_ok"), "1024");
    // Only the ring-full and missing-page exits went to the host.
    assert_eq!(
        field(out, "el2: counters", "to_host"),
        (exits + 1024).to_string()
    );
}

/// Replays the image's trace into this process's checker: no violation
/// on the tables run normally; on the table whose invalidations were
/// withheld, a make before its break's invalidation (the split and the
/// collapse), a report before a protection's invalidation (CLEAR) and a
/// table page freed before its invalidation (the collapse).
fn check_bbm_trace(file: &Path, out: &str) {
    assert_eq!(field(out, "el2: bbm_trace", "dropped"), "0");
    let n: usize = field(out, "el2: bbm_trace", "records").parse().unwrap();
    let bytes = std::fs::read(file).expect("the image wrote its trace");
    let records = trace::decode_all(&bytes, n)
        .unwrap_or_else(|i| panic!("trace record {i} of {n} does not decode"));
    let inject = field(out, "el2: bbm_inject", "table");
    let inject = usize::from_str_radix(inject.trim_start_matches("0x"), 16).unwrap();
    let fmt = Arm64Stage2::new(Granule::K4, 40).unwrap();
    let (mut stores, mut invalidations, mut marks) = (0, 0, 0);
    for r in &records {
        match r {
            Record::Withheld { table } => {
                assert_eq!(*table, inject);
                marks += 1;
                s2mmu::bbm::expect_violations(*table);
            }
            Record::Event(e) => {
                match e {
                    s2mmu::bbm::Event::Store { .. } => stores += 1,
                    s2mmu::bbm::Event::Invalidate { .. } => invalidations += 1,
                    _ => {}
                }
                s2mmu::bbm::export::replay(&fmt, e);
            }
        }
    }
    println!("replayed {n} records: {stores} stores, {invalidations} invalidations");
    assert_eq!(marks, 1);
    // At least the relaxation of each write-protection fault of the
    // logged passes was traced.
    assert!(stores >= 547, "{stores} stores");
    assert!(invalidations > 0);
    let clean: Vec<Violation> = s2mmu::bbm::take_violations();
    assert!(clean.is_empty(), "EL2 broke break-before-make: {clean:?}");
    let caught = s2mmu::bbm::take_table_violations(inject);
    println!("withheld invalidations caught: {caught:?}");
    for rule in [
        Rule::MakeBeforeInvalidate,
        Rule::ReportBeforeInvalidate,
        Rule::FreeBeforeInvalidate,
    ] {
        assert!(
            caught.iter().any(|v| v.rule == rule),
            "the withheld invalidations were not caught as {rule:?}: {caught:?}"
        );
    }
}
