//! What the integration tests of the Linux guest share, in this crate and
//! in the crates above it: one QEMU at a time per test binary, the guest's
//! kernel and initramfs, and [`linux_test!`](crate::linux_test), the
//! attributes and set-up every such test starts with. Behind the
//! `test-support` feature, which only dev-dependencies turn on: no
//! shipped binary carries it.

use crate::linux::assets::{ensure, AssetOptions, LinuxAssets};
use crate::linux::vm::LinuxConfig;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// One QEMU at a time per test binary: the machine may have 2 cores.
static ONE: Mutex<()> = Mutex::new(());

/// Serialises the tests of one binary that start QEMU. A test that
/// panicked while holding it does not poison the others.
pub fn serial() -> MutexGuard<'static, ()> {
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The Linux guest's kernel and initramfs. A test that needs them is
/// `#[cfg_attr(not(s2mmu_linux_runnable), ignore = ...)]` (what
/// [`linux_test!`](crate::linux_test) writes): where the build found no
/// model, no cross compiler or no kernel packages (`scripts/setup.sh`) the
/// runner reports it as ignored; where it found them, a model that cannot
/// run now or assets that cannot be had fail the test with the reason.
pub fn linux_assets() -> LinuxAssets {
    if let Err(why) = crate::available() {
        panic!("the build found the arm64 model but it cannot run now: {why}");
    }
    match ensure(&AssetOptions::from_env()) {
        Ok(a) => a,
        Err(e) => panic!("the Linux guest's kernel and initramfs: {e}"),
    }
}

/// A test's settings of the Linux guest `a`: `vcpus` vCPUs and 256 MiB of
/// RAM booting with `cmdline`, its console echoed where `S2MMU_LINUX_ECHO`
/// is set, no dirty logging, the default placement. The 600 s limit bounds
/// a hung guest, not a speed: under load on a 2-core machine a boot alone
/// took 111 s. Tests change what they test with
/// `LinuxConfig { .., ..linux_config(..) }`.
pub fn linux_config(a: &LinuxAssets, vcpus: usize, cmdline: &str) -> LinuxConfig {
    LinuxConfig {
        vcpus,
        mem: 256 << 20,
        kernel: a.image.clone(),
        initrd: a.initramfs.clone(),
        cmdline: cmdline.into(),
        echo: std::env::var_os("S2MMU_LINUX_ECHO").is_some(),
        timeout: Duration::from_secs(600),
        dirty: Default::default(),
        ram_pages: Default::default(),
        engine: Default::default(),
    }
}

/// Settings no machine boots from (its kernel and initramfs do not exist),
/// for the checks that a configuration is refused before QEMU starts: one
/// vCPU, 256 MiB, a 1 s limit.
pub fn unbootable_config() -> LinuxConfig {
    LinuxConfig {
        vcpus: 1,
        mem: 256 << 20,
        kernel: "/nonexistent/Image".into(),
        initrd: "/nonexistent/initrd".into(),
        cmdline: String::new(),
        echo: false,
        timeout: Duration::from_secs(1),
        dirty: Default::default(),
        ram_pages: Default::default(),
        engine: Default::default(),
    }
}

/// A test of the Linux guest: `#[test]`, ignored with its reason where the
/// build of the calling crate did not set `s2mmu_linux_runnable` (its
/// build script does where the guest can run), holding the binary's turn
/// on QEMU ([`serial`](crate::test_support::serial)) for its whole body.
/// `fn name(a) { .. }` binds the guest's assets
/// ([`linux_assets`](crate::test_support::linux_assets)) to `a`;
/// `fn name() { .. }` takes only the turn. One invocation may hold several
/// tests. Tests that boot the guest with the engine at EL2 start with
/// `el2`: they are ignored unless this crate's build also set
/// `s2mmu_el2_linux` (the aarch64-unknown-none target was there).
///
/// ```ignore
/// s2mmu_arm64::linux_test! {
///     /// The guest's kernel is there.
///     fn has_a_kernel(a) {
///         assert!(a.image.is_file());
///     }
/// }
/// ```
#[macro_export]
macro_rules! linux_test {
    (el2 $($t:tt)*) => {
        $crate::linux_test! {
            @each [all(s2mmu_linux_runnable, s2mmu_el2_linux)]
            "needs the Linux guest (scripts/setup.sh) and the aarch64-unknown-none target (rustup target add aarch64-unknown-none)"
            $($t)*
        }
    };
    (@each [$($c:tt)*] $r:tt) => {};
    (@each [$($c:tt)*] $r:tt $(#[$m:meta])* fn $name:ident($a:ident) $body:block $($rest:tt)*) => {
        $crate::linux_test! {
            @each [$($c)*] $r
            $(#[$m])*
            fn $name() {
                let $a = $crate::test_support::linux_assets();
                $body
            }
            $($rest)*
        }
    };
    (@each [$($c:tt)*] $r:tt $(#[$m:meta])* fn $name:ident() $body:block $($rest:tt)*) => {
        $(#[$m])*
        #[test]
        #[cfg_attr(not($($c)*), ignore = $r)]
        fn $name() {
            let _one = $crate::test_support::serial();
            $body
        }
        $crate::linux_test! { @each [$($c)*] $r $($rest)* }
    };
    ($($t:tt)*) => {
        $crate::linux_test! {
            @each [s2mmu_linux_runnable]
            "needs the Linux guest: QEMU, the EL2 image, the cross compiler, dtc and the kernel packages (scripts/setup.sh)"
            $($t)*
        }
    };
}
