//! The guest program `counter` as the migration checks read it: its
//! configuration, its console lines and their recomputed hashes.
#![allow(dead_code)]

use s2mmu_arm64::linux::assets;
use s2mmu_arm64::linux::dirty::HarvestConfig;
use s2mmu_arm64::linux::migrate::LinuxVm;
use s2mmu_arm64::linux::vm::LinuxConfig;
use std::time::{Duration, Instant};

/// The counter's buffer (KiB) and interval (ms): the guest program's
/// arguments, and what the test recomputes the hashes with.
pub const KIB: u64 = 256;
pub const MS: u64 = 100;

pub fn config(a: &assets::LinuxAssets, vcpus: usize) -> LinuxConfig {
    LinuxConfig {
        vcpus,
        mem: 128 << 20,
        kernel: a.image.clone(),
        initrd: a.initramfs.clone(),
        cmdline: format!("quiet s2mmu.run=counter s2mmu.args=kib={KIB},ms={MS}"),
        echo: std::env::var_os("S2MMU_LINUX_ECHO").is_some(),
        timeout: Duration::from_secs(900),
        dirty: HarvestConfig::default(),
        ram_pages: Default::default(),
        engine: Default::default(),
    }
}

/// The counter's hash after step `n` from the hash after `n - 1`, as
/// guest/counter.c computes it.
pub fn next_hash(prev: u64, n: u64) -> u64 {
    let mut sum = 0u64;
    for i in 0..KIB * 128 {
        let x = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        sum = sum.wrapping_add(x ^ x >> 31);
    }
    (prev ^ sum ^ n).wrapping_mul(0x0100_0000_01b3)
}

/// The counter's (n, hash) lines in `text`; panics on a FAIL line.
pub fn counter_lines(text: &str) -> Vec<(u64, u64)> {
    assert!(
        !text.contains("s2mmu-counter: FAIL"),
        "the counter's self-check failed:\n{text}"
    );
    text.lines()
        .filter_map(|l| {
            let r = l.split("s2mmu-counter: n=").nth(1)?;
            let (n, h) = r.split_once(" hash=")?;
            Some((
                n.trim().parse().ok()?,
                u64::from_str_radix(h.trim(), 16).ok()?,
            ))
        })
        .collect()
}

/// Checks the counter's sequence over the consoles of the guest's lives,
/// in order; on a failure, prints where each life's console begins and
/// ends.
pub fn check_lives(lives: &[&str]) {
    let mut all: String = lives.concat();
    // The last line may be half printed when the console was read.
    all.truncate(all.rfind('\n').map_or(0, |i| i + 1));
    let r = std::panic::catch_unwind(|| check_sequence(&counter_lines(&all)));
    if let Err(e) = r {
        for (i, l) in lives.iter().enumerate() {
            let head: String = l.chars().take(300).collect();
            let tail: String = l
                .chars()
                .rev()
                .take(300)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            eprintln!(
                "life {i}: {} bytes\n--- begins\n{head}\n--- ends\n{tail}\n---",
                l.len()
            );
        }
        std::panic::resume_unwind(e);
    }
}

/// Checks that `lines` is the counter's exact sequence from n = 1.
pub fn check_sequence(lines: &[(u64, u64)]) {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for (i, &(n, hash)) in lines.iter().enumerate() {
        assert_eq!(n, i as u64 + 1, "counter line {i}: n={n}, lines {lines:?}");
        h = next_hash(h, n);
        assert_eq!(
            hash, h,
            "counter n={n}: hash {hash:016x}, its data gives {h:016x}"
        );
    }
}

/// Waits until `vm`'s console (after byte `from`) shows `count` counter
/// lines.
pub fn wait_lines(vm: &LinuxVm, from: usize, count: usize, what: &str) -> String {
    let t = Instant::now();
    loop {
        let c = vm.console().contents();
        let tail = c.get(from..).unwrap_or("").to_string();
        if counter_lines(&tail).len() >= count {
            return tail;
        }
        assert!(
            vm.stopped().is_none(),
            "{what}: the guest stopped: {:?}\n{c}",
            vm.stopped()
        );
        assert!(
            t.elapsed() < Duration::from_secs(600),
            "{what}: no counter after 600 s:\n{c}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
