//! The QEMU process's pipes: its stdout and stderr collected (the stub's
//! console, with the doorbells it rings taken out), and its stdin, the
//! host's bell into the stub (`Machine::ring_in`).

use crate::doorbell::Bells;
use crate::ram::SharedRam;
use crate::{Arm64Error, Result};
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Most bell bytes [`BellIn::ring`] leaves in flight (written, not yet
/// taken by the stub): far below a pipe's capacity, so that a write never
/// blocks, whatever the stub does.
const MAX_BELLS_IN_FLIGHT: u64 = 64;

/// QEMU's stdin as the host's bell into the stub: the stub's UART
/// receives each byte written there.
pub(crate) struct BellIn {
    stdin: Mutex<Option<ChildStdin>>,
    /// Bytes written.
    rung: AtomicU64,
}

impl BellIn {
    pub(crate) fn new(stdin: Option<ChildStdin>) -> BellIn {
        BellIn {
            stdin: Mutex::new(stdin),
            rung: AtomicU64::new(0),
        }
    }

    /// Writes one byte unless [`MAX_BELLS_IN_FLIGHT`] are still untaken
    /// (`taken`: the bytes the stub has taken) or the pipe broke; whether
    /// it did.
    pub(crate) fn ring(&self, taken: u64) -> bool {
        if self.rung().saturating_sub(taken) >= MAX_BELLS_IN_FLIGHT {
            return false;
        }
        let mut g = self.stdin.lock().unwrap();
        let Some(pipe) = g.as_mut() else {
            return false;
        };
        // One byte into a pipe with room for all those in flight: the
        // write does not block.
        if pipe.write_all(b"!").and_then(|()| pipe.flush()).is_err() {
            *g = None;
            return false;
        }
        self.rung.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Bytes written.
    pub(crate) fn rung(&self) -> u64 {
        self.rung.load(Ordering::Relaxed)
    }
}

/// Finds `qemu-system-aarch64`.
pub(crate) fn qemu_binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("S2MMU_QEMU") {
        return Ok(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("qemu-system-aarch64"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Arm64Error::Unavailable(
                "qemu-system-aarch64 not found (Debian: apt-get install qemu-system-arm)".into(),
            )
        })
}

/// Starts QEMU on the shared RAM file with the stub's image.
pub(crate) fn spawn_qemu(
    qemu: &std::path::Path,
    cpus: usize,
    ram_len: u64,
    ram: &SharedRam,
    elf: &std::path::Path,
) -> Result<Child> {
    let mem_mb = ram_len >> 20;
    let ram_fd = ram.raw_fd();
    let mut cmd = Command::new(qemu);
    // SAFETY: runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: fcntl is one. It lets QEMU
    // inherit the RAM's descriptor (close-on-exec in this process, so no
    // other child gets it), which `mem-path` names.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(ram_fd, libc::F_SETFD, 0) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    cmd.args(["-M", "virt,virtualization=on,gic-version=3"])
        // pauth-impdef: a cheap pointer-authentication cipher (TCG's
        // QARMA costs a Linux guest most of its boot time); no SVE or
        // SME, so a guest's vector state is only FP/SIMD.
        .args(["-cpu", "max,pauth-impdef=on,sve=off,sme=off"])
        .args(["-accel", "tcg,thread=multi"])
        .args(["-smp", &cpus.to_string()])
        .args(["-m", &format!("{mem_mb}M")])
        .args([
            "-object",
            &format!(
                // align: QEMU maps the file 2 MiB-aligned, so its own
                // faults can take a private huge tmpfs's 2 MiB pages too.
                "memory-backend-file,id=mem,size={mem_mb}M,mem-path={},share=on,align=2M",
                ram.qemu_path()
            ),
        ])
        .args(["-machine", "memory-backend=mem"])
        // No -semihosting: with it QEMU serves HLT #0xf000 from EL1 as
        // well as EL2 (translate-a64.c: semihosting_enabled(el == 0)), so
        // a guest kernel could open, write and remove host files. The
        // stub writes to the PL011 (UART0) instead, whose output comes
        // out on QEMU's stdout.
        .args(["-display", "none", "-serial", "stdio", "-monitor", "none"])
        .arg("-nodefaults")
        .arg("-kernel")
        .arg(elf)
        // The UART's input: the host's bell into the stub (BellIn).
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Arm64Error::Unavailable(format!("{}: {e}", qemu.display())))
}

/// Collects QEMU's stdout (the stub's UART console) and stderr on
/// threads, up to 64 KiB, ringing the doorbells the stub writes there.
pub(crate) fn collect_console(child: &mut Child, bells: &Arc<Bells>) -> Arc<Mutex<String>> {
    let console = Arc::new(Mutex::new(String::new()));
    for pipe in [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let console = console.clone();
        let bells = bells.clone();
        std::thread::spawn(move || {
            let mut pipe = pipe;
            let mut buf = [0u8; 4096];
            let mut text = Vec::with_capacity(buf.len());
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                text.clear();
                bells.split(&buf[..n], &mut text);
                let mut c = console.lock().unwrap();
                if c.len() < 1 << 16 && !text.is_empty() {
                    c.push_str(&String::from_utf8_lossy(&text));
                }
            }
        });
    }
    console
}
