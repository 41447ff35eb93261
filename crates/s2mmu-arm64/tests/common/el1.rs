//! The EL1 test guests of `asm/el1_tests.S` run as the Linux VM's kernel:
//! one image, its scenario written into the header's next word.
#![allow(dead_code)]

use s2mmu_arm64::linux::vm::{self, LinuxConfig, LinuxReport};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The assembled image (empty where binutils is missing: the tests that
/// use it are then ignored by `s2mmu_arm64_runnable`).
pub const IMAGE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/el1_tests.bin"));

/// The scenarios, as `asm/el1_tests.S`'s table numbers them.
#[derive(Clone, Copy, Debug)]
pub enum Scenario {
    WfiMasked = 0,
    Spin = 1,
    ExitLoop = 2,
    NeverBoots = 3,
    CpuOff = 4,
    SystemOff = 5,
    SystemReset = 6,
    CpuOffAll = 7,
    PsciArgs = 8,
    NoSyndrome = 9,
    Ipi = 10,
    WfiAll = 11,
    SgiTargets = 12,
}

/// How much longer than its `--timeout` a host may run: past this the
/// host has outlived its limit.
pub const GRACE: Duration = Duration::from_secs(5);

/// The files a run reads, removed when dropped.
pub struct Files {
    dir: PathBuf,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Writes the image with scenario `s` and a one-page initrd.
pub fn files(s: Scenario) -> Files {
    assert!(
        IMAGE.len() > 72,
        "asm/el1_tests.S was not assembled (binutils-aarch64-linux-gnu)"
    );
    // One directory per call: tests of one scenario may run at once.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir =
        std::env::temp_dir().join(format!("s2mmu-el1-{}-{:?}-{call}", std::process::id(), s,));
    std::fs::create_dir_all(&dir).unwrap();
    let mut img = IMAGE.to_vec();
    img[64..72].copy_from_slice(&(s as u64).to_le_bytes());
    let kernel = dir.join("Image");
    let initrd = dir.join("initrd");
    std::fs::write(&kernel, img).unwrap();
    std::fs::write(&initrd, [0u8; 4096]).unwrap();
    Files {
        dir,
        kernel,
        initrd,
    }
}

/// The configuration of a run of `s` on `vcpus` vCPUs for at most
/// `timeout`.
pub fn config(f: &Files, vcpus: usize, timeout: Duration) -> LinuxConfig {
    LinuxConfig {
        vcpus,
        mem: 128 << 20,
        kernel: f.kernel.clone(),
        initrd: f.initrd.clone(),
        cmdline: String::new(),
        echo: std::env::var_os("S2MMU_LINUX_ECHO").is_some(),
        timeout,
        dirty: Default::default(),
        ram_pages: Default::default(),
        engine: Default::default(),
    }
}

/// Runs scenario `s` and checks that the host ended within `timeout`
/// plus [`GRACE`] (the time QEMU takes to start included). The run is on
/// a thread of its own, so that a host that does not end fails the test
/// at that bound instead of hanging it.
pub fn run(s: Scenario, vcpus: usize, timeout: Duration) -> LinuxReport {
    let f = files(s);
    let cfg = config(&f, vcpus, timeout);
    let t0 = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(vm::run(&cfg));
    });
    let r = match rx.recv_timeout(timeout + GRACE) {
        Ok(r) => r.unwrap(),
        Err(_) => panic!("{s:?}: the host outlived its limit of {timeout:?} by {GRACE:?}"),
    };
    let took = t0.elapsed();
    assert!(
        took <= timeout + GRACE,
        "{s:?}: the host ran {took:?}, past its limit of {timeout:?} and {GRACE:?}; console:\n{}",
        r.console
    );
    r
}

/// The console's "el1: <tag> ..." lines, their words after the tag.
pub fn lines<'a>(r: &'a LinuxReport, tag: &str) -> Vec<Vec<&'a str>> {
    let head = format!("el1: {tag} ");
    r.console
        .lines()
        .filter_map(|l| l.strip_prefix(head.as_str()))
        .map(|l| l.split_whitespace().collect())
        .collect()
}

/// A word of [`lines`] as the 16 hex digits the guest prints.
pub fn hex(w: &str) -> u64 {
    u64::from_str_radix(w, 16).unwrap_or_else(|e| panic!("{w:?}: {e}"))
}
