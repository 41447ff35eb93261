//! The Linux guest's host-side pieces against the real tools: the device
//! tree read back by `dtc` and compared with QEMU's own `virt` tree, and
//! the kernel + initramfs + guest programs booted directly by QEMU (no
//! stage 2 of ours), which proves the initramfs and programs work before
//! they run under the engine.
//!
//! Where the build found no QEMU, dtc or kernel packages these tests are
//! reported as ignored, with the reason (`build.rs`'s
//! `s2mmu_linux_runnable`); with `S2MMU_REQUIRE_ARM64` set (CI) the build
//! fails instead.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use s2mmu_arm64::linux::assets::{self, AssetOptions, LinuxAssets};
use s2mmu_arm64::linux::baseline::{run_baseline, BaselineConfig};
use s2mmu_arm64::linux::boot::{load_linux, BootError};
use s2mmu_arm64::linux::fdt::{self, FdtConfig, FdtError};
use s2mmu_arm64::linux::loader::{self, SliceRam};

/// Fails the test, with the reason, when `tool` is missing: the tests
/// that need it are ignored by their cfg where the build did not find it.
fn require(tool: &str) {
    assert!(
        Command::new(tool).arg("--version").output().is_ok(),
        "the build found {tool} but it cannot run now (scripts/setup.sh installs it)"
    );
}

/// The kernel and initramfs (always `Some`; a missing one fails the test,
/// which is ignored by its cfg where the build found no kernel package).
fn assets() -> Option<LinuxAssets> {
    require("qemu-system-aarch64");
    match assets::ensure(&AssetOptions::from_env()) {
        Ok(a) => Some(a),
        Err(e) => panic!("the Linux assets could not be built: {e}"),
    }
}

/// `dtc -I dtb -O dts` of `dtb`: node path -> (property name -> value text).
fn decompile(dtb: &[u8]) -> BTreeMap<String, BTreeMap<String, String>> {
    let path = std::env::temp_dir().join(format!("s2mmu-fdt-{}.dtb", std::process::id()));
    std::fs::write(&path, dtb).unwrap();
    let out = Command::new("dtc")
        .args(["-I", "dtb", "-O", "dts"])
        .arg(&path)
        .output()
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(
        out.status.success(),
        "dtc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut nodes = BTreeMap::new();
    let mut stack: Vec<String> = Vec::new();
    for line in String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::trim)
    {
        if let Some(name) = line.strip_suffix(" {") {
            let name = name.split(':').next_back().unwrap().trim();
            stack.push(if name == "/" {
                String::new()
            } else {
                name.to_string()
            });
            nodes.entry(stack.join("/")).or_insert_with(BTreeMap::new);
        } else if line == "};" {
            stack.pop();
        } else if let Some(prop) = line.strip_suffix(';').filter(|_| !stack.is_empty()) {
            let (k, v) = prop.split_once(" = ").unwrap_or((prop, ""));
            nodes
                .get_mut(&stack.join("/"))
                .unwrap()
                .insert(k.to_string(), v.to_string());
        }
    }
    nodes
}

fn config() -> FdtConfig {
    let mut c = FdtConfig::virt(1 << 30, 2, "console=ttyS0 s2mmu.run=dirtier");
    c.initrd = Some((0x7000_0000, 0x7040_0000));
    c.framebuffer = Some((0x1000_0000, 0x10_0000));
    c
}

s2mmu_arm64::linux_test! {
    fn the_device_tree_reads_back_with_dtc_and_has_what_qemu_gives_linux() {
        require("dtc");
        require("qemu-system-aarch64");
        let ours = decompile(&fdt::build(&config()).unwrap());
        let n = |p: &str| {
            ours.get(p)
                .unwrap_or_else(|| panic!("no node {p} in {ours:#?}"))
        };
        assert_eq!(
            n("/memory@40000000")["reg"],
            "<0x00 0x40000000 0x00 0x40000000>"
        );
        assert_eq!(n("/cpus/cpu@1")["reg"], "<0x01>");
        assert_eq!(n("/cpus/cpu@1")["enable-method"], "\"psci\"");
        assert!(!ours.contains_key("/cpus/cpu@2"));
        assert_eq!(n("/psci")["method"], "\"hvc\"");
        assert_eq!(n("/intc@8000000")["interrupts"], "<0x01 0x09 0x04>");
        assert_eq!(
            n("/timer")["interrupts"],
            "<0x01 0x0d 0x04 0x01 0x0e 0x04 0x01 0x0b 0x04 0x01 0x0a 0x04>"
        );
        assert_eq!(n("/uart@9000000")["compatible"], "\"ns16550a\"");
        assert_eq!(n("/uart@9000000")["clock-frequency"], "<0x1c2000>");
        assert_eq!(n("/uart@9000000")["interrupts"], "<0x00 0x01 0x04>");
        assert_eq!(n("/chosen")["stdout-path"], "\"/uart@9000000\"");
        assert_eq!(n("/chosen")["linux,initrd-start"], "<0x00 0x70000000>");
        assert_eq!(n("/chosen")["linux,initrd-end"], "<0x00 0x70400000>");
        assert_eq!(
            n("/s2mmu-region@10000000")["reg"],
            "<0x00 0x10000000 0x00 0x100000>"
        );
        compare_with_qemus_virt_tree(&ours);
    }
}

fn compare_with_qemus_virt_tree(ours: &BTreeMap<String, BTreeMap<String, String>>) {
    // QEMU's own tree for the same machine: every property of its GIC,
    // timer, PSCI, memory and CPU nodes that Linux reads is in ours (the
    // ITS, the PSCI 0.1 function ids and the cpu-map are left out on
    // purpose: no MSIs, PSCI 1.0 has them by id, no topology).
    let dumped = std::env::temp_dir().join(format!("s2mmu-virt-{}.dtb", std::process::id()));
    let dump = format!("virt,gic-version=3,dumpdtb={}", dumped.display());
    let st = Command::new("qemu-system-aarch64")
        .args([
            "-M",
            &dump,
            "-cpu",
            "max",
            "-smp",
            "2",
            "-m",
            "1G",
            "-nographic",
        ])
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let qemu = decompile(&std::fs::read(&dumped).unwrap());
    std::fs::remove_file(&dumped).unwrap();
    let skip_props: BTreeSet<&str> = [
        "phandle",
        "ranges",
        "#size-cells",
        "#address-cells",
        "migrate",
        "cpu_on",
        "cpu_off",
        "cpu_suspend",
    ]
    .into();
    for (q, o) in [
        ("/intc@8000000", "/intc@8000000"),
        ("/timer", "/timer"),
        ("/psci", "/psci"),
        ("/memory@40000000", "/memory@40000000"),
        ("/cpus/cpu@0", "/cpus/cpu@0"),
        ("", ""),
    ] {
        for (prop, val) in &qemu[q] {
            if skip_props.contains(prop.as_str())
                || (q.is_empty() && prop != "compatible" && prop != "interrupt-parent")
            {
                continue;
            }
            let mine = ours[o]
                .get(prop)
                .unwrap_or_else(|| panic!("{o} lacks {prop} (QEMU: {val})"));
            if [
                "interrupts",
                "reg",
                "#interrupt-cells",
                "#redistributor-regions",
                "always-on",
            ]
            .contains(&prop.as_str())
            {
                assert_eq!(mine, val, "{o} {prop}");
            }
        }
    }
}

#[test]
fn the_device_tree_refuses_what_it_cannot_describe() {
    type Case = (fn(&mut FdtConfig), fn(&FdtError) -> bool);
    let cases: Vec<Case> = vec![
        (|c| c.cpus = 0, |e| matches!(e, FdtError::Cpus(0))),
        (|c| c.cpus = 9, |e| matches!(e, FdtError::Cpus(9))),
        (
            |c| c.mem_size = (1 << 30) + 4096,
            |e| matches!(e, FdtError::MemSize(_)),
        ),
        (
            |c| c.mem_size = 1 << 20,
            |e| matches!(e, FdtError::MemSize(_)),
        ),
        (
            |c| c.mem_base = 0x4000_1000,
            |e| matches!(e, FdtError::Misaligned("RAM", ..)),
        ),
        (
            |c| c.mem_base = u64::MAX - (2 << 20) + 1,
            |e| matches!(e, FdtError::Misaligned(..) | FdtError::BadRegion(..)),
        ),
        (
            |c| c.uart = (0x4000_0000, 0x1000, 1),
            |e| matches!(e, FdtError::Overlap("RAM", "UART")),
        ),
        (
            |c| c.framebuffer = Some((0x0800_f000, 0x2000)),
            |e| matches!(e, FdtError::Overlap(..)),
        ),
        (
            |c| c.gicr.1 = 0x2_0000,
            |e| matches!(e, FdtError::GicrTooSmall { .. }),
        ),
        (
            |c| c.uart.2 = 988,
            |e| matches!(e, FdtError::Irq("UART SPI", 988)),
        ),
        (
            |c| c.timer_ppis.virt = 16,
            |e| matches!(e, FdtError::Irq(..)),
        ),
        (
            |c| c.initrd = Some((0x3000_0000, 0x4000_1000)),
            |e| matches!(e, FdtError::Initrd(..)),
        ),
        (
            |c| c.initrd = Some((0x5000_0000, 0x5000_0000)),
            |e| matches!(e, FdtError::Initrd(..)),
        ),
        (
            |c| c.bootargs = "x".repeat(2048),
            |e| matches!(e, FdtError::Bootargs(_)),
        ),
        (
            |c| c.bootargs = "a\0b".into(),
            |e| matches!(e, FdtError::Bootargs(_)),
        ),
        (
            |c| c.gicd = (u64::MAX, 2),
            |e| matches!(e, FdtError::BadRegion(..)),
        ),
    ];
    for (i, (break_it, expect)) in cases.into_iter().enumerate() {
        let mut c = config();
        break_it(&mut c);
        let e = fdt::build(&c).unwrap_err();
        assert!(expect(&e), "case {i}: {e}");
    }
    assert!(fdt::build(&config()).is_ok());
}

fn boot(cpus: u32, run: &str, args: &str, extra: &str) -> Option<String> {
    let a = assets()?;
    let cfg = BaselineConfig {
        cpus,
        mem_mib: 512,
        run: run.into(),
        args: args.into(),
        extra_append: extra.into(),
        timeout: Duration::from_secs(600),
    };
    let r = run_baseline(&a, &cfg).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        r.cpus_online, cpus,
        "every vCPU online at init:\n{}",
        r.console
    );
    assert!(
        r.exit_ok,
        "QEMU exits cleanly after poweroff -f:\n{}",
        r.console
    );
    assert!(r.console.contains("s2mmu-init: power off"), "{}", r.console);
    Some(r.console)
}

fn field(line: &str, key: &str) -> u64 {
    let v = line
        .split(key)
        .nth(1)
        .unwrap_or_else(|| panic!("no {key} in {line}"));
    let v = v.split(' ').next().unwrap();
    if key == "hash=" {
        u64::from_str_radix(v, 16).unwrap()
    } else {
        v.parse().unwrap()
    }
}

s2mmu_arm64::linux_test! {
    /// Two vCPUs: both online at init; the dirtier (two threads, anonymous
    /// memory and tmpfs files) re-checks its data over several passes and
    /// passes; the counter prints consecutive values and checks its buffer;
    /// PSCI SYSTEM_OFF ends QEMU.
    fn the_initramfs_boots_on_qemu_and_the_programs_pass() {
        let Some(console) = boot(2, "dirtier+counter", "mem=32,file=4,secs=4+secs=2", "") else {
            return;
        };
        let ok = console.lines().find(|l| l.starts_with("s2mmu-dirtier: ok"));
        let ok = ok.unwrap_or_else(|| panic!("no dirtier ok line:\n{console}"));
        assert!(
            field(ok, "passes=") >= 2,
            "the data was re-checked at least once: {ok}"
        );
        assert!(
            console.contains("s2mmu-init: dirtier exited 0"),
            "{console}"
        );
        let counts: Vec<u64> = console
            .lines()
            .filter(|l| l.starts_with("s2mmu-counter: n="))
            .map(|l| field(l, "n="))
            .collect();
        assert!(counts.len() >= 5, "about ten lines in 2 s:\n{console}");
        assert!(counts.windows(2).all(|w| w[1] == w[0] + 1), "{counts:?}");
        let last = console
            .lines()
            .find(|l| l.starts_with("s2mmu-counter: ok"))
            .unwrap();
        assert_eq!(field(last, "n="), *counts.last().unwrap());
        assert!(
            console.contains("s2mmu-init: counter exited 0"),
            "{console}"
        );
    }
}

s2mmu_arm64::linux_test! {
    /// The dirtier's check can fail: told to corrupt one of its own pages
    /// after a pass (as a lost write would), it reports FAIL, not ok. Then its
    /// framebuffer mode, on 64 MiB of QEMU's RAM that the kernel was told is
    /// not RAM (`mem=448M` of 512), mapped through `/dev/mem`.
    fn the_dirtier_reports_a_lost_write_and_checks_a_dev_mem_region() {
        let args = "mem=8,file=0,secs=30,corrupt=1+fb=0x5c000000:0x100000,secs=2";
        let Some(console) = boot(1, "dirtier+dirtier", args, "mem=448M") else {
            return;
        };
        assert!(console.contains("s2mmu-dirtier: FAIL memory"), "{console}");
        assert!(
            console.contains("s2mmu-init: dirtier exited 1"),
            "{console}"
        );
        let fb = console
            .lines()
            .find(|l| l.starts_with("s2mmu-dirtier: ok fb"));
        let fb = fb.unwrap_or_else(|| panic!("no fb ok line:\n{console}"));
        assert!(field(fb, "passes=") >= 2, "{fb}");
        assert!(
            console.contains("s2mmu-init: dirtier exited 0"),
            "{console}"
        );
    }
}

s2mmu_arm64::linux_test! {
    /// The real kernel and initramfs placed in a RAM image: the bytes are
    /// where the layout says, and the device tree written there names the
    /// initrd's final range (read back by dtc).
    fn the_real_kernel_and_initramfs_load_with_their_device_tree() {
        let Some(a) = assets() else { return };
        require("dtc");
        let base = 0x4000_0000;
        let mut mem = vec![0u8; 256 << 20];
        let cfg = FdtConfig::virt(256 << 20, 2, "console=ttyS0 quiet");
        let mut ram = SliceRam {
            base,
            mem: &mut mem,
        };
        let l = load_linux(&mut ram, &a, &cfg).unwrap();
        let image = std::fs::read(&a.image).unwrap();
        let initrd = std::fs::read(&a.initramfs).unwrap();
        let hdr = loader::parse_header(&image).unwrap();
        assert_eq!(l.entry, base + hdr.text_offset);
        assert!(hdr.image_size >= image.len() as u64);
        let at = |gpa: u64, len: usize| &mem[(gpa - base) as usize..(gpa - base) as usize + len];
        assert_eq!(at(l.entry, image.len()), &image[..]);
        let (s, e) = l.initrd.unwrap();
        assert_eq!(at(s, initrd.len()), &initrd[..]);
        assert_eq!(e - s, initrd.len() as u64);
        let tree = decompile(at(l.dtb, l.dtb_size as usize));
        assert_eq!(
            tree["/chosen"]["linux,initrd-start"],
            format!("<0x00 {s:#x}>")
        );
        assert_eq!(
            tree["/chosen"]["linux,initrd-end"],
            format!("<0x00 {e:#x}>")
        );
        let mut other = vec![0u8; 128 << 20];
        let mut ram = SliceRam {
            base,
            mem: &mut other,
        };
        assert!(matches!(
            load_linux(&mut ram, &a, &cfg),
            Err(BootError::RamMismatch { .. })
        ));
    }
}
