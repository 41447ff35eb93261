//! `dirty-log-perf`'s flags checked before anything is allocated or a
//! thread starts, each error naming the flag and its limit (the engine's own
//! refusals name internal quantities such as IPA bits, which a user did not
//! type).

use super::params::Params;
use crate::report::human_bytes;

use s2mmu_bench::dirty_log::check_guest_memory;
pub use s2mmu_bench::dirty_log::{MAX_ITERATIONS, MAX_SLOTS, MAX_VCPUS};
/// The most runs of each policy in a comparison.
pub const MAX_RUNS: u32 = 1_000;
/// The smallest guest page the benchmark dirties.
const PAGE: u64 = 4096;

/// Checks `p` and the memory its largest vCPU count needs.
///
/// # Errors
/// A message naming the flag, the value and the limit.
pub fn check(p: &Params, vcpus: &[usize], bytes_per_vcpu: u64) -> Result<(), String> {
    if p.iterations == 0 || p.iterations > MAX_ITERATIONS {
        return Err(format!(
            "-i {}: at least 1, at most {MAX_ITERATIONS}",
            p.iterations
        ));
    }
    if p.arm64 {
        // The arm64 model's plan checks every other flag against its own,
        // smaller limits (vCPUs, guest RAM, ring sizes) before QEMU starts.
        return Ok(());
    }
    if p.write_percent > 100 {
        return Err(format!("-w {}: must be 0..=100 (percent)", p.write_percent));
    }
    if p.slots == 0 || p.slots > MAX_SLOTS {
        return Err(format!(
            "-x {}: at least 1, at most {MAX_SLOTS} (memslots)",
            p.slots
        ));
    }
    if let Some(r) = p.runs {
        if r == 0 || r > MAX_RUNS {
            return Err(format!("-r {r}: at least 1, at most {MAX_RUNS}"));
        }
    }
    if let Some(e) = p.ring() {
        if !e.is_power_of_two() || !(256..=65536).contains(&e) {
            return Err(format!(
                "--ring {e}: must be a power of two in 256..=65536 (entries per vCPU)"
            ));
        }
    }
    if let Some(&v) = vcpus.iter().find(|&&v| v == 0 || v > MAX_VCPUS) {
        return Err(format!("-v {v}: at least 1, at most {MAX_VCPUS}"));
    }
    if bytes_per_vcpu < PAGE || !bytes_per_vcpu.is_multiple_of(PAGE) {
        return Err(format!(
            "-b {}: must be a multiple of 4KiB, at least 4KiB",
            human_bytes(bytes_per_vcpu)
        ));
    }
    let most = vcpus.iter().copied().max().unwrap_or(1);
    let what = format!("-v {most} x -b {}", human_bytes(bytes_per_vcpu));
    // --kvm backs the same memory.
    check_guest_memory(&what, most as u64, bytes_per_vcpu, ("-x", p.slots))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        p: Params,
    }

    fn params(args: &[&str]) -> Params {
        let mut all = vec!["dirty-log-perf"];
        all.extend_from_slice(args);
        Cli::parse_from(all).p
    }

    #[test]
    fn every_refusal_names_its_flag() {
        let cases: [(&[&str], &[usize], u64, &str); 8] = [
            (&["-i", "0"], &[1], 1 << 20, "-i 0"),
            (&["-w", "101"], &[1], 1 << 20, "-w 101"),
            (&["-x", "0"], &[1], 1 << 20, "-x 0"),
            (&["--ring", "100"], &[1], 1 << 20, "--ring 100"),
            (&["-r", "0"], &[1], 1 << 20, "-r 0"),
            (&[], &[100_000], 1 << 20, "-v 100000"),
            (&[], &[usize::MAX], 4 << 20, "-v 18446744073709551615"),
            (&[], &[1], 100, "-b 100"),
        ];
        for (args, vcpus, bytes, flag) in cases {
            let err = check(&params(args), vcpus, bytes).unwrap_err();
            assert!(err.starts_with(flag), "{args:?}: {err}");
        }
    }

    #[test]
    fn products_beyond_the_ipa_space_name_both_flags() {
        let err = check(&params(&[]), &[512], 1 << 40).unwrap_err();
        assert!(err.starts_with("-v 512 x -b 1TiB"), "{err}");
        assert!(err.contains("40-bit IPA space"), "{err}");
        let err = check(&params(&["-x", "300"]), &[1], 1 << 20).unwrap_err();
        assert!(err.starts_with("-x 300: more memslots"), "{err}");
    }

    #[test]
    fn ordinary_runs_pass() {
        assert_eq!(check(&params(&[]), &[1, 2, 4], 4 << 20), Ok(()));
        assert_eq!(check(&params(&["--ring", "4096"]), &[2], 64 << 20), Ok(()));
    }
}
