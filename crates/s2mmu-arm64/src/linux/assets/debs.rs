//! Debian's arm64 packages in the asset cache: finding the newest `.deb`,
//! downloading one with apt (never installing it), unpacking with
//! `dpkg -x`.

use std::cmp::Ordering;
use std::fs;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::linux::assets::{io_err, run, scratch, AssetError, AssetOptions};

/// A package family in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DebSpec {
    /// How messages name it.
    pub what: &'static str,
    /// File names start with this.
    prefix: &'static str,
    /// For the kernel: what follows the ABI number.
    abi_end: Option<&'static str>,
}

/// `linux-image-<release>-arm64_<version>_arm64.deb`, whatever release
/// `linux-image-arm64` depends on: Debian 12's `6.1.0-NN`, Debian 13's
/// `6.12.NN+deb13`.
pub const KERNEL: DebSpec = DebSpec {
    what: "linux-image-*-arm64:arm64",
    prefix: "linux-image-",
    abi_end: Some("-arm64_"),
};
/// `busybox-static_<version>_arm64.deb`.
pub const BUSYBOX: DebSpec = DebSpec {
    what: "busybox-static:arm64",
    prefix: "busybox-static_",
    abi_end: None,
};
const SUFFIX: &str = "_arm64.deb";

/// Whether `release` names a kernel ABI of the plain flavour (`6.1.0-56`,
/// `6.12.41+deb13`; not `6.1.0-56-rt` or `6.1.0-56-cloud`): it starts
/// with a digit, and each part after a `-` is a number.
fn is_release(release: &str) -> bool {
    let mut parts = release.split('-');
    let first = parts.next().unwrap_or_default();
    first.starts_with(|c: char| c.is_ascii_digit())
        && first
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '~'))
        && parts.all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// A kernel release's numbers in order (`6.12.41+deb13` -> 6, 12, 41, 13),
/// which order releases of one series and across series.
fn release_key(release: &str) -> Vec<u64> {
    release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// (release's numbers, Debian version) of a cache file name, if it is
/// `spec`'s.
fn parse(spec: &DebSpec, name: &str) -> Option<(Vec<u64>, String)> {
    let rest = name.strip_prefix(spec.prefix)?.strip_suffix(SUFFIX)?;
    let (abi, version) = match spec.abi_end {
        Some(end) => {
            let (release, v) = rest.split_once(end)?;
            if !is_release(release) {
                return None;
            }
            (release_key(release), v)
        }
        None => (Vec::new(), rest),
    };
    // apt-get download writes the epoch's colon as %3a.
    Some((abi, version.replace("%3a", ":")))
}

/// Debian version order (`dpkg --compare-versions`), byte order where dpkg
/// is missing.
fn compare_versions(a: &str, b: &str) -> Ordering {
    let gt = |x: &str, y: &str| {
        Command::new("dpkg")
            .args(["--compare-versions", x, "gt", y])
            .status()
            .map(|s| s.success())
    };
    match (gt(a, b), gt(b, a)) {
        (Ok(true), _) => Ordering::Greater,
        (_, Ok(true)) => Ordering::Less,
        (Ok(false), Ok(false)) => Ordering::Equal,
        _ => a.cmp(b),
    }
}

/// The newest `spec` package in `dir` (highest release, then version).
///
/// # Errors
/// [`AssetError::Io`] when `dir` cannot be listed.
pub fn newest(dir: &Path, spec: DebSpec) -> Result<Option<PathBuf>, AssetError> {
    let mut best: Option<(Vec<u64>, String, PathBuf)> = None;
    for e in fs::read_dir(dir).map_err(io_err(dir))? {
        let e = e.map_err(io_err(dir))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((abi, v)) = parse(&spec, &name) else {
            continue;
        };
        let better = match &best {
            None => true,
            Some((babi, bv, _)) => abi.cmp(babi).then_with(|| compare_versions(&v, bv)).is_gt(),
        };
        if better {
            best = Some((abi, v, e.path()));
        }
    }
    Ok(best.map(|b| b.2))
}

fn ensure_arm64_arch() -> Result<(), AssetError> {
    let fix = "apt-get install dpkg apt";
    let archs = run(
        Command::new("dpkg").arg("--print-foreign-architectures"),
        fix,
    )?;
    if !archs.lines().any(|l| l.trim() == "arm64") {
        run(
            Command::new("dpkg").args(["--add-architecture", "arm64"]),
            fix,
        )?;
        run(Command::new("apt-get").args(["update", "-qq"]), fix)?;
    }
    Ok(())
}

/// The kernel package `apt-cache depends linux-image-arm64:arm64` names
/// in `out` (`linux-image-6.1.0-NN-arm64`, `linux-image-6.12.NN+deb13-arm64`).
fn kernel_dependency(out: &str) -> Option<String> {
    out.lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .map(|d| d.split(':').next().unwrap_or(d).trim())
        .find(|d| {
            d.strip_prefix("linux-image-")
                .and_then(|r| r.strip_suffix("-arm64"))
                .is_some_and(is_release)
        })
        .map(str::to_string)
}

/// The concrete package behind `spec`: the kernel meta package's
/// dependency, or busybox-static.
fn package_name(spec: DebSpec) -> Result<String, AssetError> {
    if spec.abi_end.is_none() {
        return Ok("busybox-static".into());
    }
    let depends = || {
        run(
            Command::new("apt-cache").args(["depends", "linux-image-arm64:arm64"]),
            "apt-get install apt",
        )
    };
    let out = match depends() {
        Ok(o) if kernel_dependency(&o).is_some() => o,
        _ => {
            run(
                Command::new("apt-get").args(["update", "-qq"]),
                "apt-get install apt",
            )?;
            depends()?
        }
    };
    kernel_dependency(&out).ok_or_else(|| {
        AssetError::Package(format!(
            "apt-cache depends linux-image-arm64:arm64 names no arm64 kernel: {out}"
        ))
    })
}

/// Downloads `spec`'s newest package into the cache with `apt-get
/// download` (enabling the arm64 architecture first if needed).
///
/// # Errors
/// [`AssetError::Missing`] when downloads are not allowed (naming the
/// command to run), apt's errors otherwise.
pub fn download(opts: &AssetOptions, spec: DebSpec) -> Result<PathBuf, AssetError> {
    let dir = &opts.cache_dir;
    if !opts.allow_download {
        return Err(AssetError::Missing {
            what: format!("the {} package (.deb) in {}", spec.what, dir.display()),
            fix: "scripts/setup.sh (or S2MMU_LINUX_FETCH=1 as root: dpkg --add-architecture arm64 \
                  && apt-get update && apt-get download ...)"
                .into(),
        });
    }
    ensure_arm64_arch()?;
    let name = package_name(spec)?;
    run(
        Command::new("apt-get")
            .args(["download", "-qq", &format!("{name}:arm64")])
            .current_dir(dir),
        "apt-get install apt",
    )?;
    newest(dir, spec)?.ok_or_else(|| {
        AssetError::Package(format!(
            "apt-get download {name}:arm64 left no {} in {}",
            spec.what,
            dir.display()
        ))
    })
}

/// `dpkg -x deb` into a fresh scratch directory of `cache`.
fn unpack(cache: &Path, deb: &Path, tag: &str) -> Result<PathBuf, AssetError> {
    let tmp = scratch(&cache.join(format!("unpack-{tag}")));
    run(
        Command::new("dpkg").arg("-x").arg(deb).arg(&tmp),
        "apt-get install dpkg",
    )?;
    Ok(tmp)
}

fn stem(deb: &Path) -> String {
    deb.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The uncompressed `Image` and release of `deb`'s kernel, unpacked once
/// into `cache/kernel-<deb>/`.
///
/// # Errors
/// `dpkg`'s errors; [`AssetError::Package`] when the package holds no
/// `boot/vmlinuz-*` or it is neither a gzip'd nor a plain `Image`.
pub fn kernel_image(cache: &Path, deb: &Path) -> Result<(PathBuf, String), AssetError> {
    let out = cache.join(format!("kernel-{}", stem(deb)));
    let image = out.join("Image");
    let release = out.join("release");
    if let (true, Ok(r)) = (image.exists(), fs::read_to_string(&release)) {
        return Ok((image, r.trim().to_string()));
    }
    fs::create_dir_all(&out).map_err(io_err(&out))?;
    let tmp = unpack(cache, deb, "kernel")?;
    let result = gunzip_vmlinuz(&tmp, &image);
    let _cleanup = fs::remove_dir_all(&tmp);
    let version = result?;
    let tmp = scratch(&release);
    fs::write(&tmp, &version).map_err(io_err(&tmp))?;
    fs::rename(&tmp, &release).map_err(io_err(&release))?;
    Ok((image, version))
}

fn gunzip_vmlinuz(unpacked: &Path, image: &Path) -> Result<String, AssetError> {
    let boot = unpacked.join("boot");
    let vmlinuz = fs::read_dir(&boot)
        .map_err(io_err(&boot))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        })
        .ok_or_else(|| {
            AssetError::Package(format!("no boot/vmlinuz-* in {}", unpacked.display()))
        })?;
    let version =
        vmlinuz.file_name().unwrap_or_default().to_string_lossy()["vmlinuz-".len()..].to_string();
    let mut src = BufReader::new(fs::File::open(&vmlinuz).map_err(io_err(&vmlinuz))?);
    let magic = src.fill_buf().map_err(io_err(&vmlinuz))?;
    // Debian's vmlinuz is a gzip'd Image in older releases, the Image
    // itself (a PE/EFI-stub with the arm64 header) in newer ones.
    let gzip = magic.starts_with(&[0x1f, 0x8b]);
    let image_magic =
        magic.get(56..60) == Some(&crate::linux::loader::IMAGE_MAGIC.to_le_bytes()[..]);
    if !gzip && !image_magic {
        return Err(AssetError::Package(format!(
            "{}: neither gzip nor an arm64 Image (an EFI zboot image is not supported)",
            vmlinuz.display()
        )));
    }
    let tmp = scratch(image);
    let mut dst = BufWriter::new(fs::File::create(&tmp).map_err(io_err(&tmp))?);
    let copied = if gzip {
        std::io::copy(&mut flate2::read::GzDecoder::new(src), &mut dst)
    } else {
        std::io::copy(&mut src, &mut dst)
    };
    copied
        .and_then(|_| dst.flush())
        .map_err(|e| AssetError::Package(format!("{}: {e}", vmlinuz.display())))?;
    fs::rename(&tmp, image).map_err(io_err(image))?;
    Ok(version)
}

/// The static arm64 busybox of `deb`, unpacked once into
/// `cache/busybox-<deb>`.
///
/// # Errors
/// `dpkg`'s errors; [`AssetError::Package`] when it holds no `bin/busybox`.
pub fn busybox(cache: &Path, deb: &Path) -> Result<PathBuf, AssetError> {
    let out = cache.join(format!("busybox-{}", stem(deb)));
    if out.exists() {
        return Ok(out);
    }
    let tmp = unpack(cache, deb, "busybox")?;
    let bin = tmp.join("bin/busybox");
    let result =
        fs::copy(&bin, &out).map_err(|e| AssetError::Package(format!("{}: {e}", bin.display())));
    let _cleanup = fs::remove_dir_all(&tmp);
    result.map(|_| out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cache_names_and_picks_the_newest() {
        assert_eq!(
            parse(&KERNEL, "linux-image-6.1.0-56-arm64_6.1.192-2_arm64.deb"),
            Some((vec![6, 1, 0, 56], "6.1.192-2".into()))
        );
        assert_eq!(
            parse(
                &KERNEL,
                "linux-image-6.12.41+deb13-arm64_6.12.41-1_arm64.deb"
            ),
            Some((vec![6, 12, 41, 13], "6.12.41-1".into()))
        );
        for not_a_kernel in [
            "linux-image-arm64_6.1.192-2_arm64.deb",
            "linux-image-6.12.41+deb13-arm64-dbg_6.12.41-1_arm64.deb",
            "linux-image-6.12.41+deb13-rt-arm64_6.12.41-1_arm64.deb",
        ] {
            assert_eq!(parse(&KERNEL, not_a_kernel), None, "{not_a_kernel}");
        }
        assert_eq!(
            parse(
                &KERNEL,
                "linux-image-6.1.0-56-arm64-unsigned_6.1.192-2_arm64.deb"
            ),
            None
        );
        assert_eq!(
            parse(&KERNEL, "linux-image-6.1.0-56-arm64_6.1.192-2_amd64.deb"),
            None
        );
        assert_eq!(
            parse(&BUSYBOX, "busybox-static_1%3a1.35.0-4+deb12u1+b1_arm64.deb"),
            Some((vec![], "1:1.35.0-4+deb12u1+b1".into()))
        );
        let dir = std::env::temp_dir().join(format!("s2mmu-debs-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        for n in [
            "linux-image-6.1.0-9-arm64_6.1.27-1_arm64.deb",
            "linux-image-6.1.0-56-rt-arm64_6.1.192-3_arm64.deb",
            "linux-image-6.1.0-56-arm64_6.1.192-2_arm64.deb",
            "linux-image-6.1.0-56-arm64_6.1.192-1_arm64.deb",
            "linux-image-6.1.0-100-arm64-unsigned_6.1.300-1_arm64.deb",
        ] {
            fs::write(dir.join(n), b"").unwrap();
        }
        let got = newest(&dir, KERNEL).unwrap().unwrap();
        assert_eq!(
            got.file_name().unwrap(),
            "linux-image-6.1.0-56-arm64_6.1.192-2_arm64.deb"
        );
        assert_eq!(newest(&dir, BUSYBOX).unwrap(), None);
        let e = download(
            &AssetOptions {
                cache_dir: dir.clone(),
                allow_download: false,
            },
            BUSYBOX,
        )
        .unwrap_err();
        assert!(e.to_string().contains("scripts/setup.sh"), "{e}");
        fs::write(
            dir.join("linux-image-6.12.41+deb13-arm64_6.12.41-1_arm64.deb"),
            b"",
        )
        .unwrap();
        let got = newest(&dir, KERNEL).unwrap().unwrap();
        assert_eq!(
            got.file_name().unwrap(),
            "linux-image-6.12.41+deb13-arm64_6.12.41-1_arm64.deb",
            "a 6.12 release is newer than any 6.1 one"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn finds_the_kernel_of_debian_12_and_13_in_apt_cache_depends() {
        let bookworm = "linux-image-arm64:arm64\n  Depends: linux-image-6.1.0-57-arm64:arm64\n";
        assert_eq!(
            kernel_dependency(bookworm).as_deref(),
            Some("linux-image-6.1.0-57-arm64")
        );
        let trixie = "linux-image-arm64:arm64\n  Depends: linux-image-6.12.41+deb13-arm64\n";
        assert_eq!(
            kernel_dependency(trixie).as_deref(),
            Some("linux-image-6.12.41+deb13-arm64")
        );
        let rt_only = "linux-image-rt-arm64\n  Depends: linux-image-6.12.41+deb13-rt-arm64\n";
        assert_eq!(kernel_dependency(rt_only), None);
        assert_eq!(kernel_dependency(""), None);
    }
}
