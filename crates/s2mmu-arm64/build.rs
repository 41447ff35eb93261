//! Assembles the EL2 stub and its guest code with GNU binutils for
//! aarch64, when they are installed. Without them the crate still builds:
//! `Machine::start` then reports that the image is missing, and the tests
//! are ignored with that reason: the cfg `s2mmu_arm64_runnable` is set only
//! when the image is built and `qemu-system-aarch64` is on `PATH` (or
//! `S2MMU_QEMU` names it). Without them the script runs again when `PATH`
//! changes or the package manager installs something (dpkg's status file),
//! so a build made before `apt-get install binutils-aarch64-linux-gnu
//! qemu-system-arm` does not keep skipping; with `S2MMU_REQUIRE_ARM64` set
//! (CI) it fails instead.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "build_el2.rs"]
mod el2;

const AS: &str = "aarch64-linux-gnu-as";
const LD: &str = "aarch64-linux-gnu-ld";
const NM: &str = "aarch64-linux-gnu-nm";
const OBJCOPY: &str = "aarch64-linux-gnu-objcopy";

fn main() {
    println!("cargo:rerun-if-changed=asm/hyp.S");
    println!("cargo:rerun-if-changed=asm/state.S");
    println!("cargo:rerun-if-changed=asm/inject.S");
    println!("cargo:rerun-if-changed=asm/hyp.ld");
    println!("cargo:rerun-if-changed=asm/el1_tests.S");
    println!("cargo:rerun-if-changed=asm/el2_mmu.S");
    println!("cargo:rerun-if-changed={}/el2_macros.S", el2_asm_dir());
    println!("cargo:rerun-if-changed=asm/hyp_el2.ld");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=S2MMU_ARM64_NO_IMAGE");
    println!("cargo:rerun-if-env-changed=PATH");
    println!("cargo:rerun-if-env-changed=S2MMU_QEMU");
    println!("cargo:rerun-if-env-changed=S2MMU_REQUIRE_ARM64");
    println!("cargo::rustc-check-cfg=cfg(s2mmu_arm64_runnable)");
    println!("cargo::rustc-check-cfg=cfg(s2mmu_el2_linux)");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let syms = out.join("symbols.rs");
    // S2MMU_ARM64_NO_IMAGE=1 builds as a machine without binutils would,
    // to check that path.
    let built = if std::env::var_os("S2MMU_ARM64_NO_IMAGE").is_some() {
        Err("S2MMU_ARM64_NO_IMAGE is set".to_string())
    } else {
        assemble(&out)
    };
    let runnable = match (&built, &qemu()) {
        (Ok(_), Ok(())) => Ok(()),
        (Err(why), _) | (_, Err(why)) => Err(why.clone()),
    };
    println!("cargo::rustc-check-cfg=cfg(s2mmu_linux_runnable)");
    if runnable.is_ok() {
        match linux_guest() {
            // Dependents' build scripts read these (`links`): the CLI's
            // tests are gated as this crate's are.
            Ok(()) => {
                println!("cargo:rustc-cfg=s2mmu_linux_runnable");
                println!("cargo:linux=1");
            }
            Err(why) if std::env::var_os("S2MMU_REQUIRE_ARM64").is_some() => {
                panic!("S2MMU_REQUIRE_ARM64 is set but the Linux guest cannot run: {why}")
            }
            Err(why) => println!("cargo:warning=s2mmu-arm64: Linux guest checks ignored: {why}"),
        }
    }
    match runnable {
        Ok(()) => {
            println!("cargo:rustc-cfg=s2mmu_arm64_runnable");
            println!("cargo:arm64=1");
        }
        Err(why) => {
            if std::env::var_os("S2MMU_REQUIRE_ARM64").is_some() {
                panic!("S2MMU_REQUIRE_ARM64 is set but the arm64 checks cannot run: {why}");
            }
            // Installing binutils or QEMU later changes dpkg's status file.
            let status = Path::new("/var/lib/dpkg/status");
            if status.exists() {
                println!("cargo:rerun-if-changed={}", status.display());
            }
        }
    }
    el1_tests(&out, built.is_ok());
    match built {
        Ok(mut symbols) => {
            println!("cargo:rustc-cfg=s2mmu_arm64_image");
            symbols.push_str(&el2::image_const(&out));
            std::fs::write(&syms, symbols).expect("write symbols.rs");
        }
        Err(why) => {
            println!(
                "cargo:warning=s2mmu-arm64: EL2 image not built ({why}); arm64 checks will skip"
            );
            std::fs::write(
                &syms,
                format!("/// Why the image is missing.\npub const MISSING: &str = {why:?};\n"),
            )
            .expect("write symbols.rs");
        }
    }
}

/// Whether QEMU's arm64 system emulator is there, as `available()` looks
/// for it at run time.
fn qemu() -> Result<(), String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::var_os("S2MMU_QEMU").is_some()
        || std::env::split_paths(&path).any(|d| d.join("qemu-system-aarch64").is_file())
    {
        Ok(())
    } else {
        Err("qemu-system-aarch64 not found (Debian: apt-get install qemu-system-arm)".into())
    }
}

/// Whether the Linux guest's checks can run: the cross compiler and the
/// arm64 C library for the guest programs, `dtc` (the device-tree
/// check), and Debian's kernel and
/// busybox packages in the asset cache (`scripts/setup.sh` provides all
/// of them; `src/linux/assets/mod.rs` looks in the same cache). Where they
/// are, the packages found are watched (removing one drops the cfg);
/// where they are not, the cache directory is made and watched, so that
/// the next build after `scripts/setup.sh` sees them.
fn linux_guest() -> Result<(), String> {
    println!("cargo:rerun-if-env-changed=S2MMU_LINUX_CACHE");
    println!("cargo:rerun-if-env-changed=HOME");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let fix = "run scripts/setup.sh";
    if !std::env::split_paths(&path).any(|d| d.join("aarch64-linux-gnu-gcc").is_file()) {
        return Err(format!("aarch64-linux-gnu-gcc not found ({fix})"));
    }
    if !std::env::split_paths(&path).any(|d| d.join("dtc").is_file()) {
        return Err(format!("dtc not found ({fix})"));
    }
    if !Path::new("/usr/aarch64-linux-gnu/include/stdio.h").exists() {
        return Err(format!("the arm64 C library is missing ({fix})"));
    }
    let cache = match std::env::var_os("S2MMU_LINUX_CACHE").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
            .join(".cache/s2mmu/linux"),
    };
    let names: Vec<PathBuf> = std::fs::read_dir(&cache)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    let find = |ok: &dyn Fn(&str) -> bool| {
        names
            .iter()
            .find(|p| p.file_name().is_some_and(|n| ok(&n.to_string_lossy())))
    };
    let kernel = find(&|n| {
        n.strip_prefix("linux-image-")
            .and_then(|r| r.split_once("-arm64_"))
            .is_some_and(|(rel, v)| {
                rel.starts_with(|c: char| c.is_ascii_digit()) && v.ends_with("_arm64.deb")
            })
    });
    let busybox = find(&|n| n.starts_with("busybox-static_") && n.ends_with("_arm64.deb"));
    match (kernel, busybox) {
        (Some(k), Some(b)) => {
            println!("cargo:rerun-if-changed={}", k.display());
            println!("cargo:rerun-if-changed={}", b.display());
            Ok(())
        }
        _ => {
            if std::fs::create_dir_all(&cache).is_ok() {
                println!("cargo:rerun-if-changed={}", cache.display());
            }
            Err(format!(
                "no kernel and busybox-static arm64 packages in {} ({fix})",
                cache.display()
            ))
        }
    }
}

/// Where `s2mmu-el2`'s shared assembly macros are (`hyp.S` includes
/// `el2_macros.S`): that crate's build script says, through `links`.
fn el2_asm_dir() -> String {
    std::env::var("DEP_S2MMU_EL2_ASM_DIR").unwrap_or_else(|_| "../s2mmu-el2/asm".into())
}

fn run(cmd: &mut Command) -> Result<Vec<u8>, String> {
    let o = cmd
        .output()
        .map_err(|e| format!("{:?}: {e}", cmd.get_program()))?;
    if !o.status.success() {
        return Err(format!(
            "{:?} failed: {}",
            cmd.get_program(),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    Ok(o.stdout)
}

/// The EL1 test guests (`asm/el1_tests.S`) as a flat arm64 `Image` in
/// `OUT_DIR/el1_tests.bin`, which the tests include; an empty file where
/// the tools are missing (those tests are then ignored).
fn el1_tests(out: &Path, tools: bool) {
    let bin = out.join("el1_tests.bin");
    let obj = out.join("el1_tests.o");
    let built = tools
        && run(Command::new(AS).arg("asm/el1_tests.S").arg("-o").arg(&obj)).is_ok()
        && run(Command::new(OBJCOPY)
            .args(["-O", "binary"])
            .arg(&obj)
            .arg(&bin))
        .is_ok();
    if !built {
        if std::env::var_os("S2MMU_REQUIRE_ARM64").is_some() && tools {
            panic!("S2MMU_REQUIRE_ARM64 is set but asm/el1_tests.S did not assemble");
        }
        std::fs::write(&bin, []).expect("write el1_tests.bin");
    }
}

fn assemble(out: &Path) -> Result<String, String> {
    let obj = out.join("hyp.o");
    let elf = out.join("hyp.elf");
    run(Command::new(AS)
        .arg("-I")
        .arg(el2_asm_dir())
        .arg("asm/hyp.S")
        .arg("-o")
        .arg(&obj))
    .map_err(|e| format!("{AS} (binutils-aarch64-linux-gnu) not usable: {e}"))?;
    run(Command::new(LD)
        .arg("-T")
        .arg("asm/hyp.ld")
        .arg(&obj)
        .arg("-o")
        .arg(&elf))?;
    let nm = String::from_utf8_lossy(&run(Command::new(NM).arg(&elf))?).into_owned();
    let mut s = String::new();
    s.push_str(&format!(
        "/// The assembled EL2 image (an ELF QEMU loads with -kernel).\npub const IMAGE: &[u8] = include_bytes!({:?});\n",
        elf.display().to_string()
    ));
    for name in [
        "guest_memstress",
        "guest_probe",
        "guest_s1_probe",
        "guest_timer_probe",
        "guest_semihost_probe",
    ] {
        let addr = nm
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let (a, _, n) = (it.next()?, it.next()?, it.next()?);
                (n == name)
                    .then(|| u64::from_str_radix(a, 16).ok())
                    .flatten()
            })
            .next()
            .ok_or_else(|| format!("symbol {name} not found"))?;
        s.push_str(&format!(
            "/// Address of `{name}` in the image.\npub const {}: u64 = {addr:#x};\n",
            name.trim_start_matches('_').to_uppercase()
        ));
    }
    Ok(s)
}
