//! One `qemu-system-aarch64` process running the EL2 stub, its RAM shared
//! with this process, and the mailboxes through which the two talk.

use crate::doorbell::Bells;
use crate::layout::{self, mb};
use crate::qemu_process::{collect_console, qemu_binary, spawn_qemu, BellIn};
pub use crate::ram::{RamBacking, RamPages, SharedRam};
use crate::{image, Arm64Error, Result};
use std::process::Child;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How to start a machine.
#[derive(Clone, Debug)]
pub struct MachineConfig {
    /// CPUs: guest vCPUs plus one that serves the engine's invalidations.
    pub cpus: usize,
    /// Bytes of guest data after [`layout::DATA`].
    pub data_bytes: u64,
    /// Which host pages back the RAM.
    pub ram_pages: RamPages,
}

/// A running QEMU with the EL2 stub on every CPU.
pub struct Machine {
    ram: Arc<SharedRam>,
    child: Mutex<Child>,
    console: Arc<Mutex<String>>,
    bells: Arc<Bells>,
    cpus: usize,
    /// The host's bell into the stub ([`Machine::ring_in`]).
    bell_in: BellIn,
    /// The CPU [`Mailbox::route_bell_in`] routed the bell to.
    bell_cpu: Mutex<Option<usize>>,
}

/// Most guest data a machine may have. The RAM file is sparse (tmpfs), so
/// only what the guest or the host touches takes memory: a large slot that
/// is only mapped (tlb-perf) costs its tables, not its size.
pub const MAX_DATA_BYTES: u64 = 128 << 30;

/// Longest idle wait [`Mailbox::park`] accepts: a parked CPU picks a
/// command up this late at worst.
pub const MAX_PARK: Duration = Duration::from_millis(100);

/// Longest a command or a boot may take before the machine is declared stuck.
pub const DEADLINE: Duration = Duration::from_secs(60);

impl Machine {
    /// Starts QEMU and waits until every CPU sits in the stub's command loop.
    ///
    /// # Errors
    /// [`Arm64Error::Unavailable`] without QEMU or the assembled image;
    /// [`Arm64Error::Config`] for a CPU count outside 2..=8 or a data size
    /// that is not a multiple of 2 MiB or above [`MAX_DATA_BYTES`];
    /// [`Arm64Error::Boot`] if QEMU exits or the stub does not come up.
    pub fn start(cfg: &MachineConfig) -> Result<Machine> {
        Machine::start_with(cfg, image()?)
    }

    /// [`Machine::start`] with another build of the stub (the EL2
    /// placement's, [`crate::image_el2`]).
    ///
    /// # Errors
    /// As [`Machine::start`].
    pub(crate) fn start_with(cfg: &MachineConfig, image: &[u8]) -> Result<Machine> {
        if !(2..=layout::MAX_CPUS).contains(&cfg.cpus) {
            return Err(Arm64Error::Config(format!(
                "CPUs {} outside 2..={} (guest vCPUs plus one service CPU)",
                cfg.cpus,
                layout::MAX_CPUS
            )));
        }
        if cfg.data_bytes == 0
            || !cfg.data_bytes.is_multiple_of(2 << 20)
            || cfg.data_bytes > MAX_DATA_BYTES
        {
            return Err(Arm64Error::Config(format!(
                "guest data of {:#x} bytes: must be a non-zero multiple of 2 MiB, at most {} GiB",
                cfg.data_bytes,
                MAX_DATA_BYTES >> 30
            )));
        }
        let qemu = qemu_binary()?;
        let ram_len = layout::DATA - layout::RAM_BASE + cfg.data_bytes;
        let ram = Arc::new(SharedRam::create(ram_len, cfg.ram_pages)?);
        // The stub's image, which QEMU loads.
        let elf = std::path::PathBuf::from(crate::ram_file::shm_path(".elf"));
        std::fs::write(&elf, image)
            .map_err(|e| Arm64Error::Io(format!("{}: {e}", elf.display())))?;
        let mut child = spawn_qemu(&qemu, cfg.cpus, ram_len, &ram, &elf)?;
        let bells = Arc::new(Bells::new());
        let console = collect_console(&mut child, &bells);
        let bell_in = BellIn::new(child.stdin.take());
        let m = Machine {
            ram,
            child: Mutex::new(child),
            console,
            bells,
            cpus: cfg.cpus,
            bell_in,
            bell_cpu: Mutex::new(None),
        };
        let booted = m.boot();
        // QEMU has read the image once the boot CPU runs (or has failed).
        // The RAM file has no path (ram_file.rs): it lives as long as the
        // mappings, and nothing is left in /dev/shm however the process
        // ends (a drop of the last handle on the RAM may never run: tables
        // free it through deferred frees).
        let _ = std::fs::remove_file(&elf);
        booted?;
        Ok(m)
    }

    /// Which host pages back the RAM.
    pub fn ram_backing(&self) -> &RamBacking {
        self.ram.backing()
    }

    fn boot(&self) -> Result<()> {
        let t0 = Instant::now();
        self.wait("the boot CPU", t0, || {
            self.ram.read(layout::CTL) == layout::CTL_MAGIC
        })?;
        self.ram
            .write(layout::CTL + layout::CTL_GO, self.cpus as u64);
        self.wait("every CPU", t0, || {
            (0..self.cpus as u64)
                .all(|i| self.ram.read(layout::CTL + layout::CTL_ALIVE + 8 * i) == 1)
        })?;
        let err = self.ram.read(layout::CTL + layout::CTL_PSCI_ERR);
        if err != 0 {
            return Err(Arm64Error::Boot(format!(
                "PSCI CPU_ON returned {}",
                err as i64
            )));
        }
        Ok(())
    }

    /// Waits until `done` holds, failing if QEMU exits or the deadline
    /// passes. It spins first (an answer from the stub is usually a few µs
    /// away), then yields, then sleeps in short steps: on a machine with
    /// fewer cores than QEMU has CPUs a spinning host thread would take the
    /// core a QEMU CPU needs to make the answer.
    pub(crate) fn wait(
        &self,
        what: &str,
        since: Instant,
        mut done: impl FnMut() -> bool,
    ) -> Result<()> {
        let mut spins = 0u32;
        loop {
            if done() {
                return Ok(());
            }
            spins = spins.saturating_add(1);
            if spins < 512 {
                std::hint::spin_loop();
                continue;
            }
            if spins.is_multiple_of(64) {
                self.check_alive()?;
                if since.elapsed() > DEADLINE {
                    return Err(Arm64Error::Boot(format!(
                        "timed out after {:?} waiting for {what}; console: {}",
                        DEADLINE,
                        self.console()
                    )));
                }
            }
            if spins < 1024 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    /// Whether QEMU still runs.
    ///
    /// # Errors
    /// [`Arm64Error::Boot`] (with the console) once it has exited.
    pub fn check_alive(&self) -> Result<()> {
        let mut c = self.child.lock().unwrap();
        match c.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(st)) => Err(Arm64Error::Boot(format!(
                "QEMU exited ({st}); console: {}",
                self.console()
            ))),
            Err(e) => Err(Arm64Error::Io(format!("waiting for QEMU: {e}"))),
        }
    }

    /// Kills QEMU (SIGKILL) and reaps it, as a crash would end it: every
    /// later [`Machine::check_alive`] fails by name.
    pub fn kill_qemu(&self) {
        let mut c = self.child.lock().unwrap_or_else(|p| p.into_inner());
        let _ = c.kill();
        let _ = c.wait();
    }

    /// What QEMU and the stub printed so far.
    pub fn console(&self) -> String {
        self.console.lock().unwrap().clone()
    }

    /// The shared RAM.
    pub fn ram(&self) -> &Arc<SharedRam> {
        &self.ram
    }

    /// CPUs, service CPU included.
    pub fn cpus(&self) -> usize {
        self.cpus
    }

    /// Rings the bell into the stub: one byte on QEMU's stdin, which the
    /// stub's UART receives; its interrupt ends the idle wait of the CPU
    /// [`Mailbox::route_bell_in`] chose at once, however long the wait
    /// (a parked CPU's), and the CPU looks for a command. Post the command
    /// first. Returns whether a byte went out: none while 64 are still
    /// untaken (no CPU has the bell, or the stub has not woken yet), nor
    /// after QEMU has gone; the CPU then finds the command at the end of
    /// its wait, as without a bell.
    pub fn ring_in(&self) -> bool {
        let Some(cpu) = *self.bell_cpu.lock().unwrap() else {
            return false;
        };
        self.bell_in.ring(self.mailbox(cpu).read(mb::BELLS_IN))
    }

    /// Bell bytes [`Machine::ring_in`] has written.
    pub fn bells_rung_in(&self) -> u64 {
        self.bell_in.rung()
    }

    /// CPU `cpu`'s mailbox.
    ///
    /// # Panics
    /// If `cpu` is not below [`Machine::cpus`].
    pub fn mailbox(&self, cpu: usize) -> Mailbox<'_> {
        assert!(cpu < self.cpus, "no CPU {cpu}");
        Mailbox {
            m: self,
            cpu,
            base: layout::MBOX0 + cpu as u64 * layout::MBOX_SIZE,
        }
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        let mut c = self.child.lock().unwrap();
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// An exit the stub posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exit {
    /// Its sequence number.
    pub seq: u64,
    /// [`layout::EXIT_ABORT`], [`layout::EXIT_HVC`] or [`layout::EXIT_OTHER`].
    pub kind: u64,
    /// ESR_EL2.
    pub esr: u64,
    /// FAR_EL2.
    pub far: u64,
    /// HPFAR_EL2.
    pub hpfar: u64,
    /// ELR_EL2.
    pub elr: u64,
    /// The guest's x0..x2.
    pub x: [u64; 3],
    /// The faulting access's register value (ESR ISS.SRT): an MMIO write's
    /// data.
    pub rt: u64,
}

impl Exit {
    /// The faulting IPA of an abort: HPFAR_EL2.FIPA (IPA\[51:12\] in bits
    /// \[43:4\]) and the page offset from FAR_EL2.
    pub fn ipa(&self) -> u64 {
        ((self.hpfar >> 4) & ((1 << 40) - 1)) << 12 | (self.far & 0xfff)
    }

    /// ESR's data fault status code.
    pub fn dfsc(&self) -> u64 {
        self.esr & 0x3f
    }

    /// Whether the abort was a write (ESR.WnR).
    pub fn write(&self) -> bool {
        self.esr & (1 << 6) != 0
    }

    /// The access size in bytes (ESR ISS.SAS), if the syndrome is valid
    /// (ISS.ISV: a single general-purpose register load or store).
    pub fn access_size(&self) -> Option<u64> {
        (self.esr & (1 << 24) != 0).then(|| 1 << ((self.esr >> 22) & 3))
    }
}

/// One CPU's mailbox.
pub struct Mailbox<'a> {
    m: &'a Machine,
    cpu: usize,
    base: u64,
}

impl Mailbox<'_> {
    fn w(&self, off: u64) -> &AtomicU64 {
        self.m.ram.word(self.base + off)
    }

    /// The mailbox word at byte offset `off` (a [`layout::mb`] field).
    ///
    /// # Panics
    /// If `off` is not 8-byte aligned or outside the mailbox.
    pub fn read(&self, off: u64) -> u64 {
        assert!(off < layout::MBOX_SIZE, "mailbox offset {off:#x}");
        self.w(off).load(Ordering::Acquire)
    }

    /// Writes the mailbox word at byte offset `off`.
    ///
    /// # Panics
    /// As [`Mailbox::read`].
    pub fn write(&self, off: u64, v: u64) {
        assert!(off < layout::MBOX_SIZE, "mailbox offset {off:#x}");
        self.w(off).store(v, Ordering::Release)
    }

    /// Where the guest's general registers lie during an exit: the stub's
    /// frame below its stack top.
    fn frame(&self) -> u64 {
        self.w(mb::STACK_TOP).load(Ordering::Acquire) - layout::FRAME
    }

    /// Guest register x`n` (n < 31) during an exit; 0 for 31 (XZR).
    pub fn gpr(&self, n: u64) -> u64 {
        if n >= 31 {
            return 0;
        }
        self.m.ram.read(self.frame() + 8 * n)
    }

    /// Sets guest register x`n` during an exit (the stub reloads it when it
    /// resumes); writes to 31 (XZR) are ignored.
    pub fn set_gpr(&self, n: u64, v: u64) {
        if n < 31 {
            self.m.ram.write(self.frame() + 8 * n, v)
        }
    }

    /// Posts a command without waiting (RUN); returns its sequence number.
    pub fn post(&self, cmd: u64, args: &[u64]) -> u64 {
        debug_assert!(args.len() <= 12);
        self.w(mb::CMD).store(cmd, Ordering::Relaxed);
        for (i, &a) in args.iter().enumerate() {
            self.w(mb::ARG0 + 8 * i as u64).store(a, Ordering::Relaxed);
        }
        let seq = self.w(mb::CMD_SEQ).load(Ordering::Relaxed) + 1;
        self.w(mb::CMD_SEQ).store(seq, Ordering::Release);
        seq
    }

    /// Whether command `seq` is done.
    pub fn done(&self, seq: u64) -> bool {
        self.w(mb::DONE_SEQ).load(Ordering::Acquire) == seq
    }

    /// Runs a command and waits for its status.
    ///
    /// # Errors
    /// [`Arm64Error::Boot`] if QEMU exits or the command misses the deadline.
    pub fn command(&self, cmd: u64, args: &[u64]) -> Result<u64> {
        let seq = self.post(cmd, args);
        self.wait_done(seq)
    }

    /// Waits for posted command `seq` to finish; its status.
    fn wait_done(&self, seq: u64) -> Result<u64> {
        self.m
            .wait("a command", Instant::now(), || self.done(seq))?;
        Ok(self.w(mb::RET).load(Ordering::Acquire))
    }

    /// The last finished command's own time at EL2, from the stub's
    /// counter stamps at its pickup and at its end ([`mb::T_PICKUP`],
    /// [`mb::T_DONE`]): what a round trip took less the wait for the stub
    /// to notice the command and for the host to notice the answer. `None`
    /// before the stub has stamped anything or if the stamps run backwards.
    pub fn last_command_time(&self) -> Option<Duration> {
        let hz = self.read(mb::CNTFRQ);
        let (t0, t1) = (self.read(mb::T_PICKUP), self.read(mb::T_DONE));
        if hz == 0 || t0 == 0 || t1 < t0 {
            return None;
        }
        let ns = u128::from(t1 - t0) * 1_000_000_000 / u128::from(hz);
        Some(Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX)))
    }

    /// Parks this CPU while it waits for a command: after its short waits
    /// it backs off to waits of `wait` (at most [`MAX_PARK`]) instead of
    /// 640 µs, so QEMU's threads wake far less often for a CPU with
    /// nothing to do; a command posted meanwhile waits up to `wait` to be
    /// picked up. A `wait` at or below the usual cap leaves the CPU as it
    /// was; [`Mailbox::unpark`] undoes it.
    ///
    /// # Errors
    /// [`Arm64Error::Config`] for a `wait` above [`MAX_PARK`];
    /// [`Arm64Error::Boot`] if the stub has not reported its counter
    /// frequency yet (it does so before the machine counts as started).
    pub fn park(&self, wait: Duration) -> Result<()> {
        if wait > MAX_PARK {
            return Err(Arm64Error::Config(format!(
                "park wait {wait:?} above {MAX_PARK:?}"
            )));
        }
        let hz = self.read(mb::CNTFRQ);
        if hz == 0 {
            return Err(Arm64Error::Boot("the stub has not set CNTFRQ".into()));
        }
        // At most 1 s times a u64 frequency over 10^9: fits.
        let ticks = wait.as_nanos() * u128::from(hz) / 1_000_000_000;
        self.write(mb::PARK_TICKS, u64::try_from(ticks).unwrap_or(u64::MAX));
        Ok(())
    }

    /// Makes this CPU the one [`Machine::ring_in`] wakes (the UART's
    /// receive interrupt is routed to it); the CPU routed before no longer
    /// is.
    ///
    /// # Errors
    /// As [`Mailbox::command`].
    pub fn route_bell_in(&self) -> Result<()> {
        let mut g = self.m.bell_cpu.lock().unwrap();
        self.command(layout::CMD_BELL_IN, &[])?;
        *g = Some(self.cpu);
        Ok(())
    }

    /// Bell bytes this CPU's stub has taken from its UART.
    pub fn bells_in(&self) -> u64 {
        self.read(mb::BELLS_IN)
    }

    /// Runs a command on this CPU, ringing the bell after posting it (see
    /// [`Machine::ring_in`]): a parked CPU the bell is routed to picks it
    /// up at once instead of at the end of its wait.
    ///
    /// # Errors
    /// As [`Mailbox::command`].
    pub fn command_ringing(&self, cmd: u64, args: &[u64]) -> Result<u64> {
        let seq = self.post(cmd, args);
        if *self.m.bell_cpu.lock().unwrap() == Some(self.cpu) {
            self.m.ring_in();
        }
        self.wait_done(seq)
    }

    /// Whether this CPU is parked ([`Mailbox::park`], not yet
    /// [`Mailbox::unpark`]ed).
    pub fn parked(&self) -> bool {
        self.read(mb::PARK_TICKS) != 0
    }

    /// Ends [`Mailbox::park`]: the CPU's waits return to the usual cap
    /// once the wait in progress (up to the park's) has ended.
    pub fn unpark(&self) {
        self.write(mb::PARK_TICKS, 0);
    }

    /// Writes a TLBI command's instruction list.
    pub fn set_cmd_insns(&self, insns: &[(u64, u64)]) {
        assert!(insns.len() <= mb::CMD_CAP);
        for (i, &(op, arg)) in insns.iter().enumerate() {
            let a = mb::CMD_INSNS + 16 * i as u64;
            self.w(a).store(op, Ordering::Relaxed);
            self.w(a + 8).store(arg, Ordering::Relaxed);
        }
    }

    /// The exit after `last`, if the stub has posted one.
    pub fn poll_exit(&self, last: u64) -> Option<Exit> {
        let seq = self.w(mb::EXIT_SEQ).load(Ordering::Acquire);
        (seq != last).then(|| Exit {
            seq,
            kind: self.w(mb::EXIT_KIND).load(Ordering::Relaxed),
            esr: self.w(mb::ESR).load(Ordering::Relaxed),
            far: self.w(mb::FAR).load(Ordering::Relaxed),
            hpfar: self.w(mb::HPFAR).load(Ordering::Relaxed),
            elr: self.w(mb::ELR).load(Ordering::Relaxed),
            x: [
                self.w(mb::GX0).load(Ordering::Relaxed),
                self.w(mb::GX0 + 8).load(Ordering::Relaxed),
                self.w(mb::GX0 + 16).load(Ordering::Relaxed),
            ],
            rt: self.w(mb::MMIO_DATA).load(Ordering::Relaxed),
        })
    }

    /// Sleeps until the stub posts the exit after `last` or `timeout`
    /// passes; that exit, if there is one by then. The stub rings this
    /// CPU's doorbell for an exit it posts while the host sleeps (see
    /// `doorbell.rs`), so the sleep costs no polling; a sleep the stub does
    /// not end (no exit, or a command finishing) ends at `timeout`.
    pub fn sleep_until_exit(&self, last: u64, timeout: Duration) -> Option<Exit> {
        self.write(mb::HOST_WAITING, 1);
        // The flag's store before the exit's load; the stub has a DMB
        // between its exit's store and the flag's load.
        fence(Ordering::SeqCst);
        let mut e = self.poll_exit(last);
        if e.is_none() {
            self.m.bells.wait(self.cpu, timeout);
            e = self.poll_exit(last);
        }
        self.write(mb::HOST_WAITING, 0);
        e
    }

    /// Doorbell rings the host has received from this CPU's stub.
    pub fn doorbells(&self) -> u64 {
        self.m.bells.count(self.cpu)
    }

    /// Waits for the exit after `last`, or for command `run_seq` to finish.
    ///
    /// # Errors
    /// As [`Mailbox::command`].
    pub fn wait_exit(&self, last: u64) -> Result<Exit> {
        let mut e = None;
        self.m.wait("a guest exit", Instant::now(), || {
            e = self.poll_exit(last);
            e.is_some()
        })?;
        Ok(e.expect("set when wait returns"))
    }

    /// Answers exit `exit` with `action`, `x0`/`x1` for
    /// [`layout::ACT_RESUME_X0`], and maintenance to execute first.
    /// An instruction list longer than the mailbox holds must be split by
    /// the caller.
    pub fn reply(&self, exit: &Exit, action: u64, x: [u64; 2], insns: &[(u64, u64)]) {
        assert!(insns.len() <= mb::REPLY_CAP);
        for (i, &(op, arg)) in insns.iter().enumerate() {
            let a = mb::REPLY_INSNS + 16 * i as u64;
            self.w(a).store(op, Ordering::Relaxed);
            self.w(a + 8).store(arg, Ordering::Relaxed);
        }
        self.w(mb::REPLY_NINSN)
            .store(insns.len() as u64, Ordering::Relaxed);
        self.w(mb::ACTION).store(action, Ordering::Relaxed);
        self.w(mb::REPLY_X0).store(x[0], Ordering::Relaxed);
        self.w(mb::REPLY_X0 + 8).store(x[1], Ordering::Relaxed);
        self.w(mb::REPLY_SEQ).store(exit.seq, Ordering::Release);
    }

    /// Exits answered with a resume, and the counter ticks they spent at EL2
    /// from exception entry to ERET (the stub's own count).
    pub fn exit_stats(&self) -> (u64, u64) {
        (
            self.w(mb::STAT_EXITS).load(Ordering::Acquire),
            self.w(mb::STAT_TICKS).load(Ordering::Acquire),
        )
    }

    /// The stub's error word (unknown instructions, or 0xdead after an
    /// exception at EL2).
    pub fn bad_insns(&self) -> u64 {
        self.w(mb::BAD_INSN).load(Ordering::Acquire)
    }
}
