//! The Linux guest's files: Debian's arm64 kernel `Image` (whatever
//! `linux-image-arm64` depends on: 12's 6.1, 13's 6.12) and an
//! initramfs this crate builds (busybox-static, `/init`, the guest
//! programs of `guest/`), kept in a cache directory.
//!
//! Nothing is installed into the host: the arm64 `.deb`s are downloaded
//! with `apt-get download` (after `dpkg --add-architecture arm64` and
//! `apt-get update`) and unpacked with `dpkg -x`. The guest programs are
//! compiled here with `aarch64-linux-gnu-gcc -static`; their sources are
//! part of this crate (`include_str!`), and the initramfs's file name holds
//! a hash of them, so a changed program gives a new initramfs.

pub mod cpio;
pub mod debs;

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use cpio::Entry;

/// What the guest runs as `/init`.
pub const INIT_SCRIPT: &str = include_str!("../../../guest/init.sh");
/// The guest programs: (name under `/bin`, C source).
pub const PROGRAMS: &[(&str, &str)] = &[
    ("dirtier", include_str!("../../../guest/dirtier.c")),
    ("counter", include_str!("../../../guest/counter.c")),
    ("fill", include_str!("../../../guest/fill.c")),
];
/// The header `counter.c` and `fill.c` include (`#include "counter_loop.h"`):
/// written next to their sources before they compile.
const COUNTER_LOOP_H: (&str, &str) = (
    "counter_loop.h",
    include_str!("../../../guest/counter_loop.h"),
);
/// The cross compiler the guest programs need.
pub const CROSS_CC: &str = "aarch64-linux-gnu-gcc";
const CC_FIX: &str = "apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross";
const ARCH_FIX: &str = "dpkg --add-architecture arm64 && apt-get update";

/// The files a Linux guest boots from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinuxAssets {
    /// The uncompressed arm64 kernel `Image`.
    pub image: PathBuf,
    /// The gzip'd newc initramfs.
    pub initramfs: PathBuf,
    /// The kernel's release, e.g. `6.1.0-26-arm64`.
    pub kernel_version: String,
}

/// Where the assets live and whether missing packages may be downloaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssetOptions {
    /// The cache directory.
    pub cache_dir: PathBuf,
    /// May `.deb`s be downloaded with apt (needs root and the network)?
    pub allow_download: bool,
}

impl AssetOptions {
    /// `$S2MMU_LINUX_CACHE` or `~/.cache/s2mmu/linux`; downloads allowed
    /// when `$S2MMU_LINUX_FETCH` is `1`.
    pub fn from_env() -> AssetOptions {
        AssetOptions {
            cache_dir: default_cache_dir(),
            allow_download: std::env::var("S2MMU_LINUX_FETCH").is_ok_and(|v| v == "1"),
        }
    }
}

/// `$S2MMU_LINUX_CACHE`, else `$HOME/.cache/s2mmu/linux`.
pub fn default_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("S2MMU_LINUX_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    Path::new(&home).join(".cache/s2mmu/linux")
}

/// What is missing or failed, with the command that fixes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AssetError {
    /// Something needed is not there (what, the command to run).
    Missing {
        /// What is missing.
        what: String,
        /// The command that provides it.
        fix: String,
    },
    /// A tool ran and failed (the command, its output's tail).
    Tool {
        /// The command line.
        command: String,
        /// What it printed.
        output: String,
    },
    /// A file operation failed (path, error).
    Io(String),
    /// A package's contents were not as expected.
    Package(String),
}

impl fmt::Display for AssetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AssetError::Missing { what, fix } => write!(f, "{what} is missing: run `{fix}`"),
            AssetError::Tool { command, output } => write!(f, "`{command}` failed: {output}"),
            AssetError::Io(e) => write!(f, "{e}"),
            AssetError::Package(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for AssetError {}

pub(crate) fn io_err(path: &Path) -> impl Fn(std::io::Error) -> AssetError + '_ {
    move |e| AssetError::Io(format!("{}: {e}", path.display()))
}

/// Runs `cmd` (in `dir`); its output on success.
///
/// # Errors
/// [`AssetError::Missing`] when the program is not installed (with
/// `fix`), [`AssetError::Tool`] when it fails.
pub(crate) fn run(cmd: &mut Command, fix: &str) -> Result<String, AssetError> {
    let line = format!("{cmd:?}").replace('"', "");
    let out = cmd.output().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => AssetError::Missing {
            what: format!("{:?}", cmd.get_program()),
            fix: fix.to_string(),
        },
        _ => AssetError::Tool {
            command: line.clone(),
            output: e.to_string(),
        },
    })?;
    if !out.status.success() {
        let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stdout));
        let tail: String = text.lines().rev().take(6).collect::<Vec<_>>().join(" | ");
        return Err(AssetError::Tool {
            command: line,
            output: tail,
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A scratch name beside `path`, unique to this process and call: files
/// are built there and renamed into place, so a reader (another test
/// thread, another worktree's run sharing the cache) sees a whole file or
/// none.
pub(crate) fn scratch(path: &Path) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp-{}-{n}", std::process::id()));
    path.with_file_name(name)
}

/// FNV-1a over `parts`: names cached builds by their inputs.
pub(crate) fn content_hash(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in p.iter().chain(&[0xffu8]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Ensures the kernel `Image` and the initramfs exist in the cache,
/// downloading (when allowed), unpacking and building what is missing.
///
/// # Errors
/// [`AssetError::Missing`] naming the package or command when a `.deb`,
/// `dpkg`, apt or the cross compiler is missing; the other variants when
/// a step fails.
pub fn ensure(opts: &AssetOptions) -> Result<LinuxAssets, AssetError> {
    // One build at a time in this process (tests call it from several
    // threads); other processes are kept apart by the scratch names.
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    let dir = &opts.cache_dir;
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let kernel_deb = match crate::linux::debs::newest(dir, crate::linux::debs::KERNEL)? {
        Some(p) => p,
        None => crate::linux::debs::download(opts, crate::linux::debs::KERNEL)?,
    };
    let busybox_deb = match crate::linux::debs::newest(dir, crate::linux::debs::BUSYBOX)? {
        Some(p) => p,
        None => crate::linux::debs::download(opts, crate::linux::debs::BUSYBOX)?,
    };
    let (image, kernel_version) = crate::linux::debs::kernel_image(dir, &kernel_deb)?;
    let busybox = crate::linux::debs::busybox(dir, &busybox_deb)?;
    let initramfs = initramfs(dir, &busybox)?;
    Ok(LinuxAssets {
        image,
        initramfs,
        kernel_version,
    })
}

/// Compiles the guest programs into `cache/guest-<hash>/` (once per
/// source version); returns (name, binary path) pairs.
///
/// # Errors
/// [`AssetError::Missing`] without the cross compiler, [`AssetError::Tool`]
/// when a program does not compile.
pub fn build_programs(cache: &Path) -> Result<Vec<(String, PathBuf)>, AssetError> {
    let mut srcs: Vec<&[u8]> = PROGRAMS.iter().map(|(_, s)| s.as_bytes()).collect();
    srcs.push(COUNTER_LOOP_H.1.as_bytes());
    let dir = cache.join(format!("guest-{:016x}", content_hash(&srcs)));
    fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    let header = dir.join(COUNTER_LOOP_H.0);
    if !header.exists() {
        // Renamed into place, so a compiler in another process never
        // includes a half-written header.
        let tmp = scratch(&header);
        fs::write(&tmp, COUNTER_LOOP_H.1).map_err(io_err(&tmp))?;
        fs::rename(&tmp, &header).map_err(io_err(&header))?;
    }
    let mut out = Vec::new();
    for (name, src) in PROGRAMS {
        let bin = dir.join(name);
        if !bin.exists() {
            let c = scratch(&dir.join(format!("{name}.c")));
            fs::write(&c, src).map_err(io_err(&c))?;
            let tmp = scratch(&bin);
            let built = run(
                Command::new(CROSS_CC)
                    .args(["-static", "-O2", "-pthread", "-Wall", "-o"])
                    .arg(&tmp)
                    .args(["-x", "c"])
                    .arg(&c),
                CC_FIX,
            );
            let _gone = fs::remove_file(&c);
            built.map_err(|e| match e {
                // gcc is there but the arm64 libc (headers, libpthread.a) is not.
                AssetError::Tool { output, .. }
                    if output.contains(".h: No such file") || output.contains("cannot find -l") =>
                {
                    AssetError::Missing {
                        what: format!("the arm64 C library for {CROSS_CC} ({output})"),
                        fix: CC_FIX.into(),
                    }
                }
                e => e,
            })?;
            fs::rename(&tmp, &bin).map_err(io_err(&bin))?;
        }
        out.push((name.to_string(), bin));
    }
    Ok(out)
}

/// Builds (once per content) `cache/initramfs-<hash>.cpio.gz` holding
/// busybox, `/init` and the guest programs.
///
/// # Errors
/// [`build_programs`]'s errors, or I/O errors.
pub fn initramfs(cache: &Path, busybox: &Path) -> Result<PathBuf, AssetError> {
    let programs = build_programs(cache)?;
    let bb = fs::read(busybox).map_err(io_err(busybox))?;
    let mut parts: Vec<&[u8]> = vec![INIT_SCRIPT.as_bytes(), &bb];
    parts.extend(PROGRAMS.iter().map(|(_, s)| s.as_bytes()));
    parts.push(COUNTER_LOOP_H.1.as_bytes());
    let path = cache.join(format!("initramfs-{:016x}.cpio.gz", content_hash(&parts)));
    if path.exists() {
        return Ok(path);
    }
    let mut entries = Vec::new();
    for d in [
        "bin", "sbin", "usr", "usr/bin", "usr/sbin", "dev", "proc", "sys", "tmp", "root", "etc",
    ] {
        entries.push(Entry::Dir(d, 0o755));
    }
    entries.push(Entry::CharDev("dev/console", 5, 1));
    entries.push(Entry::CharDev("dev/null", 1, 3));
    entries.push(Entry::File(
        "init".into(),
        0o755,
        INIT_SCRIPT.as_bytes().to_vec(),
    ));
    entries.push(Entry::File("bin/busybox".into(), 0o755, bb));
    entries.push(Entry::Symlink("bin/sh".into(), "busybox".into()));
    for (name, bin) in programs {
        let data = fs::read(&bin).map_err(io_err(&bin))?;
        entries.push(Entry::File(format!("bin/{name}"), 0o755, data));
    }
    let tmp = scratch(&path);
    let f = fs::File::create(&tmp).map_err(io_err(&tmp))?;
    cpio::write_gz(&entries, std::io::BufWriter::new(f)).map_err(io_err(&tmp))?;
    fs::rename(&tmp, &path).map_err(io_err(&path))?;
    Ok(path)
}

/// The command that prepares a fresh machine (used in messages).
pub fn setup_hint() -> String {
    format!("scripts/setup.sh, as root or through sudo (by hand: {CC_FIX} && {ARCH_FIX})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_tool_names_the_command_that_installs_it() {
        let e = run(&mut Command::new("s2mmu-no-such-tool"), CC_FIX).unwrap_err();
        assert!(matches!(e, AssetError::Missing { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross"),
            "{e}"
        );
        let e = run(
            Command::new("sh").args(["-c", "echo boom >&2; exit 3"]),
            CC_FIX,
        )
        .unwrap_err();
        assert!(
            matches!(&e, AssetError::Tool { output, .. } if output.contains("boom")),
            "{e}"
        );
    }

    #[test]
    fn the_content_hash_changes_with_any_input() {
        let a = content_hash(&[b"init", b"dirtier"]);
        assert_ne!(a, content_hash(&[b"init", b"dirtier2"]));
        assert_ne!(a, content_hash(&[b"initdirtier"]), "parts are delimited");
        assert_eq!(a, content_hash(&[b"init", b"dirtier"]));
    }
}
