//! The stub with the engine linked in (`s2mmu linux --engine el2`): the
//! Rust library of `el2/` built for `aarch64-unknown-none` by a nested
//! cargo, linked with `asm/hyp.S` assembled with `EL2_ENGINE`. Where the
//! target is missing the constant says why, and the EL2 placement's checks
//! are ignored with that reason (`S2MMU_REQUIRE_ARM64` makes it an error).

use std::path::{Path, PathBuf};
use std::process::Command;

/// `IMAGE_EL2`'s definition for `symbols.rs`: the image, or why not.
pub fn image_const(out: &Path) -> String {
    match build(out) {
        Ok(elf) => {
            println!("cargo:rustc-cfg=s2mmu_el2_linux");
            format!(
                "/// The stub with the engine linked in (EL2 placement).\n\
                 pub const IMAGE_EL2: Result<&[u8], &str> = Ok(include_bytes!({:?}));\n",
                elf.display().to_string()
            )
        }
        Err(why) => {
            if std::env::var_os("S2MMU_REQUIRE_ARM64").is_some() {
                panic!(
                    "S2MMU_REQUIRE_ARM64 is set but the EL2 engine image cannot be built: {why}"
                );
            }
            println!("cargo:warning=s2mmu-arm64: EL2 placement not built ({why})");
            format!(
                "/// Why the EL2 placement's image is missing.\n\
                 pub const IMAGE_EL2: Result<&[u8], &str> = Err({why:?});\n"
            )
        }
    }
}

fn target_installed() -> Result<(), String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let libdir = Command::new(rustc)
        .args([
            "--print",
            "target-libdir",
            "--target",
            "aarch64-unknown-none",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match libdir {
        Some(d) if has_core(&d) => Ok(()),
        _ => Err("the aarch64-unknown-none target is not installed \
                  (rustup target add aarch64-unknown-none)"
            .into()),
    }
}

fn has_core(dir: &str) -> bool {
    std::fs::read_dir(dir).is_ok_and(|d| {
        d.filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().starts_with("libcore-"))
    })
}

fn build(out: &Path) -> Result<PathBuf, String> {
    for p in [
        "el2/src",
        "el2/Cargo.toml",
        "el2/Cargo.lock",
        "../s2mmu-el2/src",
        "../s2mmu/src",
    ] {
        println!("cargo:rerun-if-changed={p}");
    }
    target_installed()?;
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../../target"))
        .join("el2-linux");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "--release",
        "--locked",
        "--target",
        "aarch64-unknown-none",
    ])
    .arg("--manifest-path")
    .arg(manifest.join("el2/Cargo.toml"))
    .arg("--target-dir")
    .arg(&target_dir);
    // The outer build's settings are not the nested one's (a clippy run's
    // wrapper, the host's flags, the build script's own variables).
    for v in [
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "TARGET",
        "HOST",
        "OPT_LEVEL",
        "PROFILE",
        "DEBUG",
        "NUM_JOBS",
    ] {
        cmd.env_remove(v);
    }
    let o = cmd.output().map_err(|e| format!("cargo: {e}"))?;
    if !o.status.success() {
        panic!(
            "building el2/ for aarch64-unknown-none failed:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let lib = target_dir.join("aarch64-unknown-none/release/libs2mmu_arm64_el2.a");
    let obj = out.join("hyp_el2.o");
    let elf = out.join("hyp_el2.elf");
    super::run(
        Command::new(super::AS)
            .arg("-I")
            .arg(super::el2_asm_dir())
            .args(["--defsym", "EL2_ENGINE=1", "asm/hyp.S", "-o"])
            .arg(&obj),
    )?;
    super::run(
        Command::new(super::LD)
            .args([
                "--strip-debug",
                "--no-warn-rwx-segments",
                "-T",
                "asm/hyp_el2.ld",
            ])
            .arg(&obj)
            .arg(&lib)
            .arg("-o")
            .arg(&elf),
    )?;
    Ok(elf)
}
