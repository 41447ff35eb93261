//! A loaded or restored Linux VM started (a boot: loaded, then started
//! at the kernel's entry): the devices and what the vCPU
//! threads share built around the engine's VM, the threads started
//! (running, or parked for a resume), and taken down again.

use super::config::LinuxConfig;
use super::vcpu_thread::{self, Ctl};
use super::{LinuxVm, Running};
use crate::linux::gic::Gic;
use crate::linux::power::VcpuControl;
use crate::linux::set::DeviceSet;
use crate::linux::shared::{HostLog, Power, RamFaults, Shared, StopReason};
use crate::linux::timer::VirtualTimer;
use crate::linux::uart::{IrqCallback, Uart, UartOutput};
use crate::linux::vcpu_state::VcpuState;
use crate::{Arm64Error, Result};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Instant;
use vm_superio::serial::SerialState;

/// What a start begins from: the devices' state, the vCPUs' power and
/// their saved registers.
pub(in crate::linux) struct StartState {
    pub(in crate::linux) gic: Gic,
    /// The UART's registers (`None`: reset).
    pub(in crate::linux) uart: Option<SerialState>,
    pub(in crate::linux) power: Power,
    pub(in crate::linux) timer: VirtualTimer,
    /// Each vCPU's registers to resume from (`None`: its power says).
    pub(in crate::linux) restore: Vec<Option<VcpuState>>,
    /// The vCPUs whose CPU is to be kicked once its first command is
    /// posted (a blank machine's, whose park ended without a kick:
    /// [`LinuxVm::unpark_for_restore`]).
    pub(in crate::linux) kick: Vec<bool>,
    /// Whether the threads start parked (until a resume).
    pub(in crate::linux) paused: bool,
}

impl StartState {
    /// A boot's start: devices in their reset state, `power` as the
    /// loader left it, running at once.
    pub(in crate::linux) fn boot(vcpus: usize, power: Power) -> StartState {
        StartState {
            gic: Gic::new(vcpus),
            uart: None,
            power,
            timer: VirtualTimer::new(),
            restore: vec![None; vcpus],
            kick: vec![false; vcpus],
            paused: false,
        }
    }
}

impl LinuxVm {
    /// Loads `cfg`'s guest into this blank VM and starts it at the
    /// kernel's entry.
    ///
    /// # Errors
    /// As [`LinuxVm::load`] and [`LinuxVm::start`].
    pub(in crate::linux) fn load_and_start(&mut self, cfg: &LinuxConfig) -> Result<()> {
        let power = self.load(cfg)?;
        self.start(StartState::boot(self.vcpus, power))?;
        self.paused = false;
        self.ran = true;
        self.written = None;
        Ok(())
    }

    /// Builds the shared VM state around the engine's VM and starts the
    /// vCPU threads from `st`, and the watchdog of the VM's timeout.
    ///
    /// # Errors
    /// A UART state that does not load, threads that do not start.
    pub(in crate::linux) fn start(&mut self, st: StartState) -> Result<()> {
        let me: Arc<OnceLock<Weak<Shared>>> = Arc::new(OnceLock::new());
        let intid = 32 + self.layout.uart_spi;
        let m2 = me.clone();
        let irq: IrqCallback = Arc::new(move || {
            if let Some(sh) = m2.get().and_then(Weak::upgrade) {
                sh.raise(0, intid);
            }
        });
        let out = if self.echo {
            UartOutput::BufferAndStdout(self.console.clone())
        } else {
            UartOutput::Buffer(self.console.clone())
        };
        let uart = Arc::new(match st.uart {
            Some(s) => {
                Uart::from_state(&s, irq, out).map_err(|e| Arm64Error::Config(e.to_string()))?
            }
            None => Uart::new(irq, out),
        });
        let devices = DeviceSet::new(self.layout, st.gic, uart.clone(), st.timer)
            .map_err(|e| Arm64Error::Config(e.to_string()))?;
        let avm = self.idle.take().expect("no vCPU threads run");
        self.limit.attach(&*avm);
        let sh = Arc::new(Shared {
            vm: avm,
            devices,
            cpus: VcpuControl::new(st.power, Instant::now() + self.timeout),
            faults: RamFaults::new(self.limit.clone()),
            host_log: HostLog::new(self.vcpus),
        });
        sh.faults.page_fetch.set(self.hook_range());
        let _ = me.set(Arc::downgrade(&sh));
        let ctl = Arc::new(Ctl::new(self.vcpus, st.paused));
        {
            let mut g = ctl.lock();
            g.restore = st.restore;
            g.kick = st.kick;
        }
        let mut threads = Vec::with_capacity(self.vcpus);
        let mut failed = crate::linux::shared::spawn_watchdog(&sh)
            .map_err(Arm64Error::Io)
            .err();
        for id in 0..self.vcpus {
            if failed.is_some() {
                break;
            }
            let (sh, ctl) = (sh.clone(), ctl.clone());
            match std::thread::Builder::new()
                .name(format!("linux-vcpu{id}"))
                .spawn(move || vcpu_thread::vcpu_main(&sh, &ctl, id))
            {
                Ok(t) => threads.push(t),
                Err(e) => failed = Some(Arm64Error::Io(format!("vCPU thread: {e}"))),
            }
        }
        self.run = Some(Running {
            sh,
            uart,
            ctl,
            threads,
        });
        match failed {
            // The threads that started stop, and the engine's VM is idle
            // again.
            Some(e) => {
                let _ = self.take_down();
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// Waits until the guest stops by itself (it powers off or resets,
    /// fails, runs out of time or is stopped from its console), its vCPU
    /// threads and watchdog ended; what they shared stays for a report.
    ///
    /// # Errors
    /// The first error a vCPU thread met; a VM that was never started.
    pub(in crate::linux) fn wait_stopped(&mut self) -> Result<()> {
        let r = self.run.as_mut().ok_or_else(never_started)?;
        let first = join_all(&mut r.threads);
        r.sh.cpus.watch.join();
        first.map_or(Ok(()), Err)
    }

    /// Stops the vCPU threads and takes the engine's VM back from them.
    pub(in crate::linux) fn take_down(&mut self) -> Result<()> {
        let Some(mut r) = self.run.take() else {
            return Ok(());
        };
        r.sh.stop(StopReason::PowerOff);
        let first = join_all(&mut r.threads);
        drop(r.uart);
        r.sh.cpus.watch.join();
        let sh = Arc::try_unwrap(r.sh)
            .map_err(|_| Arm64Error::Guest("the VM is still shared after its threads".into()))?;
        self.idle = Some(sh.vm);
        first.map_or(Ok(()), Err)
    }

    /// The running parts, once the VM has a state.
    ///
    /// # Errors
    /// The VM was never booted or restored.
    pub(in crate::linux) fn running(&self) -> Result<&Running> {
        self.run.as_ref().ok_or_else(never_started)
    }
}

fn never_started() -> Arm64Error {
    Arm64Error::Guest("the VM has no state yet (never booted or restored)".into())
}

/// Joins `threads`: the first error one met (a panic as an error).
fn join_all(threads: &mut Vec<JoinHandle<Result<()>>>) -> Option<Arm64Error> {
    let mut first = None;
    for t in threads.drain(..) {
        match t.join() {
            Ok(Err(e)) => {
                first.get_or_insert(e);
            }
            Err(_) => {
                first.get_or_insert(Arm64Error::Guest("a vCPU thread panicked".into()));
            }
            Ok(Ok(())) => {}
        }
    }
    first
}
