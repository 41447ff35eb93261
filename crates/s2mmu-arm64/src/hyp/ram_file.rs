//! The file behind the machine's RAM, which QEMU and this process both
//! map: on a private tmpfs mounted `huge=always` (2 MiB pages) where this
//! process may mount one, else in `/dev/shm`.
//!
//! Why 2 MiB pages: a migration's stream writes every page of a
//! destination's RAM and reads every page of a source's. Over 4 KiB
//! shmem pages (`/dev/shm` on a system whose `shmem_enabled` is `never`,
//! the kernel's default) the receiver's copy into the Linux guest's RAM
//! cost twice what the same copy into the simulated guest's anonymous
//! 2 MiB pages cost (`perf`, one run each: 0.92 against 0.46 us a page),
//! and the receiver is the stream's bottleneck. The system's shmem policy
//! is for `/dev/shm` and `memfd`; a tmpfs mount states its own (`huge=`),
//! so a private mount gives QEMU's RAM the pages the simulated guest gets
//! from `madvise`, without changing any system setting.
//!
//! The mount is made in a mount namespace of one short-lived thread
//! (`unshare(CLONE_NEWNS)` unshares only the calling thread's view), made
//! private first so nothing propagates to the host's namespace, and
//! detached once the file is open: no path leads to it, the open file
//! keeps it alive, and it is gone with the last mapping however the
//! process ends. Both backings hand QEMU the open file
//! (`/proc/self/fd/N`), so no RAM file is ever left in `/dev/shm`.

use crate::{Arm64Error, Result};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// Which host pages back a machine's RAM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RamPages {
    /// 2 MiB pages from a private huge-page tmpfs where this process may
    /// mount one (it needs `CAP_SYS_ADMIN`, as root has), else `/dev/shm`.
    #[default]
    Auto,
    /// `/dev/shm`, whose pages the system's `shmem_enabled` chooses
    /// (4 KiB under the kernel's default).
    Shm,
}

impl RamPages {
    /// Parses `auto` or `shm`.
    ///
    /// # Errors
    /// A message naming the value and the accepted ones.
    pub fn parse(s: &str) -> core::result::Result<RamPages, String> {
        match s {
            "auto" => Ok(RamPages::Auto),
            "shm" => Ok(RamPages::Shm),
            _ => Err(format!("unknown RAM pages '{s}': use auto or shm")),
        }
    }
}

/// Where a machine's RAM ended up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RamBacking {
    /// A private tmpfs mounted `huge=always`: 2 MiB pages.
    HugeTmpfs,
    /// `/dev/shm`, and why the private huge tmpfs was not used.
    Shm {
        /// Why not a private huge tmpfs (`asked for` with [`RamPages::Shm`]).
        why: String,
    },
}

impl RamBacking {
    /// One line for reports.
    pub fn describe(&self) -> String {
        match self {
            RamBacking::HugeTmpfs => "2 MiB pages (a private tmpfs, huge=always)".into(),
            RamBacking::Shm { why } => format!("/dev/shm, the system's shmem pages ({why})"),
        }
    }
}

/// An open, sized, unreachable-by-path file for a machine's RAM.
pub(crate) struct RamFile {
    pub(crate) fd: OwnedFd,
    pub(crate) backing: RamBacking,
}

/// The huge-page size the private tmpfs is sized in.
const HUGE: u64 = 2 << 20;

/// Where the private tmpfs is mounted inside its own namespace: a
/// directory every system has; the host's sees no change.
const MOUNT_AT: &str = "/dev/shm";

impl RamFile {
    /// A file of `len` bytes, backed as `pages` asks where it can be.
    ///
    /// # Errors
    /// [`Arm64Error::Io`] if not even `/dev/shm` gives a file.
    pub(crate) fn create(len: u64, pages: RamPages) -> Result<RamFile> {
        let why = match pages {
            RamPages::Shm => "asked for".to_string(),
            RamPages::Auto => match huge_tmpfs_file(len) {
                Ok(fd) => {
                    return Ok(RamFile {
                        fd,
                        backing: RamBacking::HugeTmpfs,
                    })
                }
                Err(why) => why,
            },
        };
        Ok(RamFile {
            fd: shm_file(len)?,
            backing: RamBacking::Shm { why },
        })
    }

    /// The path QEMU opens the file by: this process's descriptor, which
    /// the QEMU child inherits under the same number (`spawn_qemu`'s
    /// `pre_exec`).
    pub(crate) fn qemu_path(&self) -> String {
        format!("/proc/self/fd/{}", self.fd.as_raw_fd())
    }
}

/// A name in `/dev/shm` no other file of this process has, `ext`
/// appended.
pub(crate) fn shm_path(ext: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "/dev/shm/s2mmu-arm64-{}-{}{ext}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// An unlinked file of `len` bytes in `/dev/shm`.
fn shm_file(len: u64) -> Result<OwnedFd> {
    let path = shm_path("");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| Arm64Error::Io(format!("{path}: {e}")))?;
    // Unlinked at once: the open file is all QEMU and this process need.
    let _ = std::fs::remove_file(&path);
    f.set_len(len)
        .map_err(|e| Arm64Error::Io(format!("{path}: {e}")))?;
    Ok(OwnedFd::from(f))
}

/// A file of `len` bytes on a fresh tmpfs mounted `huge=always` in a
/// private mount namespace, already detached; why not where refused.
fn huge_tmpfs_file(len: u64) -> core::result::Result<OwnedFd, String> {
    let policy = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
        .map_err(|e| format!("no shmem huge pages here: {e}"))?;
    if policy.contains("[deny]") {
        return Err("the system denies shmem huge pages (shmem_enabled: deny)".into());
    }
    let size = len
        .checked_next_multiple_of(HUGE)
        .ok_or_else(|| format!("{len} bytes do not fit a tmpfs"))?;
    let opts = format!("huge=always,size={size},nr_inodes=16,mode=0700");
    std::thread::Builder::new()
        .name("ram-tmpfs".into())
        .spawn(move || mount_and_open(&opts, len))
        .map_err(|e| format!("a thread for the mount: {e}"))?
        .join()
        .map_err(|_| "the mount's thread panicked".to_string())?
}

/// On a thread of its own (its namespace ends with it): the steps of
/// [`huge_tmpfs_file`].
fn mount_and_open(opts: &str, len: u64) -> core::result::Result<OwnedFd, String> {
    let c = |s: &str| CString::new(s).map_err(|_| format!("{s:?} holds a NUL"));
    let (at, opts) = (c(MOUNT_AT)?, c(opts)?);
    let (root, tmpfs, name) = (c("/")?, c("tmpfs")?, c("s2mmu-ram")?);
    let file = c(&format!("{MOUNT_AT}/ram"))?;
    let os = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    // SAFETY: no pointers; CLONE_NEWNS (which implies CLONE_FS) gives
    // this thread alone a copy of the mount namespace.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        return Err(os("unshare(CLONE_NEWNS)"));
    }
    // SAFETY: NUL-terminated strings that outlive the call; null source,
    // type and data are allowed for a propagation change.
    let private = unsafe {
        libc::mount(
            core::ptr::null(),
            root.as_ptr(),
            core::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            core::ptr::null(),
        )
    };
    if private != 0 {
        return Err(os("making this thread's mounts private"));
    }
    // SAFETY: NUL-terminated strings that outlive the call; tmpfs takes
    // its options as a string.
    let mounted = unsafe {
        libc::mount(
            name.as_ptr(),
            at.as_ptr(),
            tmpfs.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            opts.as_ptr().cast(),
        )
    };
    if mounted != 0 {
        return Err(os("mounting a huge=always tmpfs"));
    }
    // SAFETY: a NUL-terminated path; the flags create a new file.
    let raw = unsafe {
        libc::open(
            file.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
            0o600,
        )
    };
    let opened = if raw < 0 {
        Err(os("creating the RAM file"))
    } else {
        // SAFETY: `raw` is a descriptor just opened and owned by no one else.
        Ok(unsafe { OwnedFd::from_raw_fd(raw) })
    };
    // Detached whatever happened: the open file keeps the tmpfs alive.
    // SAFETY: a NUL-terminated path.
    unsafe { libc::umount2(at.as_ptr(), libc::MNT_DETACH) };
    let fd = opened?;
    let f = std::fs::File::from(fd);
    f.set_len(len)
        .map_err(|e| format!("sizing the RAM file: {e}"))?;
    Ok(OwnedFd::from(f))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout;
    use crate::ram::SharedRam;

    /// Kibibytes of `field` in the smaps entry of the mapping that starts
    /// at `addr`.
    fn smaps_kib(addr: u64, field: &str) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let start = format!("{addr:x}-");
        // A mapping's header line's first word is its range; its fields'
        // first words end in ':'.
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&start));
        lines.next().expect("the mapping is in smaps");
        let entry = lines
            .take_while(|l| {
                l.split_whitespace()
                    .next()
                    .is_some_and(|w| w.ends_with(':'))
            })
            .find(|l| l.starts_with(&format!("{field}:")))
            .unwrap_or_else(|| panic!("no {field} for the mapping at {addr:#x}"));
        entry.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Touches 8 MiB of a fresh RAM of `pages`; its backing and the
    /// KiB of it mapped with 2 MiB entries.
    fn touched(pages: RamPages) -> (RamBacking, u64) {
        let ram = SharedRam::create(8 << 20, pages).expect("a RAM file");
        for off in (0..8u64 << 20).step_by(4096) {
            ram.write(layout::RAM_BASE + off, off | 1);
        }
        let base = ram.hva(layout::RAM_BASE).unwrap();
        (ram.backing().clone(), smaps_kib(base, "ShmemPmdMapped"))
    }

    fn is_root() -> bool {
        // SAFETY: geteuid takes nothing and cannot fail.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn auto_gives_2_mib_pages_where_it_may_mount() {
        let (backing, huge_kib) = touched(RamPages::Auto);
        if is_root() {
            assert_eq!(backing, RamBacking::HugeTmpfs);
            assert_eq!(huge_kib, 8 << 10, "all 8 MiB mapped with 2 MiB entries");
        } else {
            // Without CAP_SYS_ADMIN the private mount is refused, by name,
            // and /dev/shm is used instead.
            let RamBacking::Shm { why } = &backing else {
                panic!("not root, yet {backing:?}");
            };
            assert!(why.contains("unshare"), "{why}");
        }
    }

    #[test]
    fn shm_is_what_the_system_gives_and_leaves_no_file() {
        let before = std::fs::read_dir("/dev/shm").unwrap().count();
        let (backing, huge_kib) = touched(RamPages::Shm);
        assert_eq!(
            backing,
            RamBacking::Shm {
                why: "asked for".into()
            }
        );
        let policy =
            std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled").unwrap();
        if policy.contains("[never]") {
            assert_eq!(huge_kib, 0, "4 KiB pages under shmem_enabled=never");
        }
        assert_eq!(std::fs::read_dir("/dev/shm").unwrap().count(), before);
    }

    #[test]
    fn the_private_mount_is_invisible_to_the_host() {
        let ram = SharedRam::create(2 << 20, RamPages::Auto).expect("a RAM file");
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounts.contains("s2mmu-ram"), "{mounts}");
        // QEMU opens the file by this process's descriptor.
        let path = ram.qemu_path();
        let f = std::fs::File::open(&path).expect("the descriptor's path opens");
        assert_eq!(f.metadata().unwrap().len(), 2 << 20);
    }

    #[test]
    fn populating_for_writes_maps_pages_and_keeps_their_bytes() {
        for pages in [RamPages::Shm, RamPages::Auto] {
            let ram = SharedRam::create(8 << 20, pages).expect("a RAM file");
            let base = ram.hva(layout::RAM_BASE).unwrap();
            ram.write(layout::RAM_BASE + (6 << 20), 0x5eed);
            assert!(
                smaps_kib(base, "Rss") < 8 << 10,
                "{pages:?}: not all mapped yet"
            );
            assert!(
                ram.populate_for_writes(layout::RAM_BASE, 8 << 20),
                "{pages:?}"
            );
            assert_eq!(
                smaps_kib(base, "Rss"),
                8 << 10,
                "{pages:?}: every page mapped"
            );
            assert_eq!(ram.read(layout::RAM_BASE + (6 << 20)), 0x5eed, "{pages:?}");
            assert_eq!(ram.read(layout::RAM_BASE), 0, "{pages:?}");
            // Outside RAM: refused, nothing done.
            assert!(!ram.populate_for_writes(layout::RAM_BASE + (4 << 20), 8 << 20));
        }
    }

    #[test]
    fn ram_pages_parse_names_the_bad_value() {
        assert_eq!(RamPages::parse("auto"), Ok(RamPages::Auto));
        assert_eq!(RamPages::parse("shm"), Ok(RamPages::Shm));
        let e = RamPages::parse("huge").unwrap_err();
        assert!(e.contains("'huge'") && e.contains("auto or shm"), "{e}");
    }
}
