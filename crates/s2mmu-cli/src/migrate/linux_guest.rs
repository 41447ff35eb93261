//! `s2mmu migrate --guest linux` with the user's own guest: their kernel,
//! initramfs and command line (as `s2mmu linux` takes them), the guest's
//! identity in the HEADER (a destination given the same files refuses any
//! other guest), and both machines' consoles kept and shown.

use s2mmu_arm64::linux::vm::LinuxConfig;
use s2mmu_arm64_migrate::session_run::{GuestProgram, RunSettings};
use s2mmu_migrate::wire::IMAGE_ID_LEN;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The most bytes of `--cmdline`, as `s2mmu linux` takes.
pub const MAX_CMDLINE: usize = 1024;

/// Lines of each console printed at the end.
const TAIL_LINES: usize = 8;

/// The user's guest and where its consoles go.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct LinuxGuestArgs {
    /// With --guest linux: an uncompressed arm64 `Image` instead of Debian's (as `s2mmu linux --kernel`).
    #[arg(long, value_name = "FILE")]
    pub kernel: Option<PathBuf>,
    /// With --guest linux: an initramfs instead of the project's: the guest runs its /init, and the destination's guest must print a line of its own.
    #[arg(long, value_name = "FILE")]
    pub initrd: Option<PathBuf>,
    /// With --guest linux: the kernel command line (at most 1024 bytes) instead of the one --linux-run picks: the guest runs the user's program, and the destination's guest must print a line of its own.
    #[arg(long, value_name = "WORDS")]
    pub cmdline: Option<String>,
    /// With --guest linux: write the source machine's console to DIR/source.log and the destination's to DIR/dest.log (DIR created), and print the last lines of each.
    #[arg(long, value_name = "DIR")]
    pub console_dir: Option<PathBuf>,
    /// With --guest linux: the arguments of --linux-run's program (key=value,key=value; at most 256 bytes of letters, digits, '=', ',', '.', ':') instead of its defaults, e.g. dirtier's mem=64,rate=16384,secs=20,tick=2.
    #[arg(long, value_name = "ARGS")]
    pub linux_args: Option<String>,
    /// With --guest linux: echo each machine's console on stdout as its guest writes it (control characters shown as text), before the report.
    #[arg(long)]
    pub console_stdout: bool,
}

/// The most bytes of `--linux-args`.
pub const MAX_LINUX_ARGS: usize = 256;

/// `cmdline` with its `s2mmu.args=` word replaced by (or, without one,
/// followed by) `s2mmu.args=ARGS`.
///
/// # Errors
/// `args` too long, empty or with a character outside the allowed ones.
pub fn with_program_args(cmdline: &str, args: &str) -> Result<String, String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || "=,.:".contains(c);
    if args.is_empty() || args.len() > MAX_LINUX_ARGS || !args.chars().all(ok) {
        return Err(format!(
            "--linux-args {args:?}: 1 to {MAX_LINUX_ARGS} bytes of letters, digits, '=', ',', '.', ':'"
        ));
    }
    let mut words: Vec<String> = cmdline
        .split_whitespace()
        .filter(|w| !w.starts_with("s2mmu.args="))
        .map(String::from)
        .collect();
    words.push(format!("s2mmu.args={args}"));
    Ok(words.join(" "))
}

impl LinuxGuestArgs {
    /// Whether the guest runs the user's program, not one of --linux-run's.
    pub fn user_program(&self) -> bool {
        self.initrd.is_some() || self.cmdline.is_some()
    }

    /// Checks the flags and applies them to the program of `s`: the
    /// user's when they give an initramfs or a command line.
    ///
    /// # Errors
    /// A command line too long, a file that cannot be read.
    pub fn settle(&self, s: &mut RunSettings) -> Result<(), String> {
        if let Some(c) = &self.cmdline {
            if c.len() > MAX_CMDLINE {
                return Err(format!("--cmdline: at most {MAX_CMDLINE} bytes"));
            }
        }
        for (flag, f) in [("--kernel", &self.kernel), ("--initrd", &self.initrd)] {
            if let Some(f) = f {
                std::fs::metadata(f).map_err(|e| format!("{flag} {}: {e}", f.display()))?;
            }
        }
        if self.user_program() {
            s.program = GuestProgram::User;
        }
        if let Some(a) = &self.linux_args {
            if self.user_program() {
                return Err(
                    "--linux-args: for --linux-run's program, not with --initrd or --cmdline"
                        .into(),
                );
            }
            with_program_args("", a)?;
        }
        Ok(())
    }

    /// The machine's settings with the user's files and command line, and
    /// the guest's identity in both sides' settings: the source names it
    /// in its HEADER; a destination given a kernel or an initramfs
    /// refuses any other.
    ///
    /// # Errors
    /// A file that cannot be read.
    pub fn apply(&self, s: &mut RunSettings, cfg: &mut LinuxConfig) -> Result<(), String> {
        if let Some(k) = &self.kernel {
            cfg.kernel = k.clone();
        }
        if let Some(i) = &self.initrd {
            cfg.initrd = i.clone();
        }
        if let Some(c) = &self.cmdline {
            cfg.cmdline = c.clone();
        }
        if let Some(a) = &self.linux_args {
            cfg.cmdline = with_program_args(&cfg.cmdline, a)?;
        }
        cfg.echo |= self.console_stdout;
        let id = image_id(&cfg.kernel, &cfg.initrd)?;
        s.session.image = Some(id);
        if self.kernel.is_some() || self.initrd.is_some() {
            s.dest.image = Some(id);
        }
        Ok(())
    }

    /// Writes the consoles into `--console-dir` (when given) and prints
    /// the last lines of each on stderr.
    ///
    /// # Errors
    /// The directory or a file cannot be written.
    pub fn show(&self, source: Option<&str>, dest: Option<&str>) -> Result<(), String> {
        if let Some(dir) = &self.console_dir {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            for (name, text) in [("source.log", source), ("dest.log", dest)] {
                if let Some(t) = text {
                    let f = dir.join(name);
                    std::fs::write(&f, t).map_err(|e| format!("{}: {e}", f.display()))?;
                }
            }
        }
        if self.console_dir.is_some() || self.user_program() {
            for (side, text) in [("source", source), ("destination", dest)] {
                if let Some(t) = text {
                    eprintln!("{side}'s console, its last lines:\n{}", tail(t, TAIL_LINES));
                }
            }
        }
        Ok(())
    }
}

/// The last `n` lines of `text`, carriage returns dropped, each indented.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| format!("  | {}", l.replace('\r', "")))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The guest's identity: SHA-256 over the kernel's bytes and the
/// initramfs's, each after its length.
///
/// # Errors
/// A file that cannot be read, by name.
pub fn image_id(kernel: &Path, initrd: &Path) -> Result<[u8; IMAGE_ID_LEN], String> {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for f in [kernel, initrd] {
        let mut file = std::fs::File::open(f).map_err(|e| format!("{}: {e}", f.display()))?;
        let len = file
            .metadata()
            .map_err(|e| format!("{}: {e}", f.display()))?
            .len();
        ctx.update(&len.to_le_bytes());
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = file
                .read(&mut buf)
                .map_err(|e| format!("{}: {e}", f.display()))?;
            if n == 0 {
                break;
            }
            ctx.update(&buf[..n]);
        }
    }
    let mut id = [0u8; IMAGE_ID_LEN];
    id.copy_from_slice(ctx.finish().as_ref());
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_follows_both_files_and_their_split() {
        let dir = std::env::temp_dir().join(format!("s2mmu-image-id-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b, c) = (dir.join("a"), dir.join("b"), dir.join("c"));
        std::fs::write(&a, b"kernel").unwrap();
        std::fs::write(&b, b"initrd").unwrap();
        std::fs::write(&c, b"kernelinitrd").unwrap();
        let one = image_id(&a, &b).unwrap();
        assert_eq!(one, image_id(&a, &b).unwrap());
        assert_ne!(one, image_id(&b, &a).unwrap());
        // The same bytes split otherwise are another guest.
        std::fs::write(&b, b"").unwrap();
        assert_ne!(one, image_id(&c, &b).unwrap());
        let e = image_id(&dir.join("none"), &b).unwrap_err();
        assert!(e.contains("none"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn program_args_replace_the_defaults_and_refuse_odd_bytes() {
        let c = "quiet s2mmu.run=dirtier s2mmu.args=mem=64,secs=30";
        assert_eq!(
            with_program_args(c, "mem=8,tick=2").unwrap(),
            "quiet s2mmu.run=dirtier s2mmu.args=mem=8,tick=2"
        );
        assert_eq!(
            with_program_args("quiet", "ms=5").unwrap(),
            "quiet s2mmu.args=ms=5"
        );
        for bad in ["", "a b", "x;y", &"a".repeat(MAX_LINUX_ARGS + 1)] {
            let e = with_program_args(c, bad).unwrap_err();
            assert!(e.contains("--linux-args"), "{e}");
        }
    }

    #[test]
    fn the_tail_keeps_the_last_lines() {
        assert_eq!(tail("a\r\nb\nc\n", 2), "  | b\n  | c");
        assert_eq!(tail("", 3), "");
    }
}
