//! A Linux guest as the migration library's destination: [`LinuxDest`]
//! starts a blank QEMU machine of the geometry the HEADER describes, the
//! STATE body (the Linux state of `vm_state`) is decoded and checked
//! against it before any vCPU starts, and the resumed guest runs from it
//! with CNTVOFF set so that its virtual time goes on without a jump
//! (`LinuxVm::load_guest_state`).

use crate::fault_hook::{kill_self, EXIT_IN_POSTCOPY, FAULT_AT_STATE, KILL_QEMU_IN_POSTCOPY};
use crate::session_postcopy::{untouched_digest, LinuxFinal};
use crate::session_source::{LinuxSessionVm, LINUX_BACKING};
use s2mmu::format::FormatId;
use s2mmu_arm64::linux::dirty::HarvestConfig;
use s2mmu_arm64::linux::migrate::LinuxVm;
use s2mmu_arm64::linux::vm::{self, Engine, LinuxConfig};
use s2mmu_arm64::machine::RamPages;
use s2mmu_migrate::session::dest::{DestFactory, DestGuest, ResumedGuest};
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::vm::{GuestCounters, GuestRun, SessionVm};
use s2mmu_migrate::wire::Header;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Builds the destination's Linux guest: a new QEMU machine per
/// migration, kept (see [`LinuxDest::built`]) after the session ends.
pub struct LinuxDest {
    /// Whether the guest's console also goes to stdout.
    pub echo: bool,
    /// How long the destination's guest may run in all.
    pub timeout: Duration,
    /// Which host pages back each machine's RAM ([`RamPages::Auto`] from
    /// [`LinuxDest::new`]).
    pub ram_pages: RamPages,
    /// Where each machine's engine runs (the default, [`Engine::El2`], from
    /// [`LinuxDest::new`]).
    pub engine: Engine,
    built: Mutex<Option<Arc<LinuxSessionVm>>>,
    /// A blank machine started before the stream ([`LinuxDest::prestart`]):
    /// its vCPU count, RAM size and the machine.
    ready: Mutex<Option<(usize, u64, LinuxVm)>>,
}

impl LinuxDest {
    /// A factory whose guests echo their console when `echo` and may run
    /// `timeout` in all.
    pub fn new(echo: bool, timeout: Duration) -> LinuxDest {
        LinuxDest {
            echo,
            timeout,
            ram_pages: RamPages::Auto,
            engine: Engine::default(),
            built: Mutex::new(None),
            ready: Mutex::new(None),
        }
    }

    /// The last guest built (it outlives the session: its console, its
    /// run after the session's `run_after`).
    pub fn built(&self) -> Option<Arc<LinuxSessionVm>> {
        self.built.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Starts the blank QEMU machine a stream of `vcpus` vCPUs and `mem`
    /// bytes of RAM will use, before the stream comes. Starting QEMU took
    /// 1.4 to 5.1 s here, and a machine started on the HEADER does it
    /// while the source waits for ACCEPT within its I/O deadline (5 s by
    /// default), which it missed now and then; a HEADER of another shape
    /// drops this machine and starts its own as before.
    ///
    /// # Errors
    /// The machine does not start (QEMU, the EL2 image, the shared RAM).
    ///
    /// A machine of that shape started already and not used yet is kept
    /// (nothing starts): a listening destination calls this again after
    /// each failed attempt, which may have failed before its HEADER.
    pub fn prestart(&self, vcpus: usize, mem: u64) -> Result<(), String> {
        if self.prestarted(vcpus, mem) {
            return Ok(());
        }
        let vm = LinuxVm::blank(&self.blank_config(vcpus, mem)).map_err(|e| e.to_string())?;
        *self.ready.lock().unwrap_or_else(|p| p.into_inner()) = Some((vcpus, mem, vm));
        Ok(())
    }

    /// Whether a blank machine of `vcpus` vCPUs and `mem` bytes waits for
    /// the next stream.
    pub fn prestarted(&self, vcpus: usize, mem: u64) -> bool {
        matches!(
            &*self.ready.lock().unwrap_or_else(|p| p.into_inner()),
            Some((v, m, _)) if *v == vcpus && *m == mem
        )
    }

    /// Drops the last guest built (a failed attempt's, never resumed):
    /// its QEMU machine ends and its guest RAM is freed.
    pub fn discard_built(&self) {
        self.built.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// A blank machine's settings: no kernel, everything comes in the stream.
    fn blank_config(&self, vcpus: usize, mem: u64) -> LinuxConfig {
        LinuxConfig {
            vcpus,
            mem,
            kernel: PathBuf::new(),
            initrd: PathBuf::new(),
            cmdline: String::new(),
            echo: self.echo,
            timeout: self.timeout,
            dirty: HarvestConfig::default(),
            ram_pages: self.ram_pages,
            engine: self.engine,
        }
    }
}

fn refuse(why: String) -> MigrateError {
    MigrateError::Setup(format!("Linux destination: {why}"))
}

impl DestFactory for LinuxDest {
    type Guest = LinuxDestGuest;

    fn build(&self, h: &Header) -> Result<LinuxDestGuest, MigrateError> {
        if h.format != FormatId::of::<s2mmu::format::arm64::Arm64Stage2>() {
            return Err(MigrateError::FormatMismatch {
                stream: h.format.name(),
                destination: FormatId::of::<s2mmu::format::arm64::Arm64Stage2>().name(),
            });
        }
        if h.backing != LINUX_BACKING || h.slots != 1 || h.gpa_base != vm::RAM_IPA {
            return Err(refuse(format!(
                "the stream's guest ({} backing, {} slots at {:#x}) is not a Linux guest \
                 ({LINUX_BACKING} backing, 1 slot at {:#x})",
                h.backing,
                h.slots,
                h.gpa_base,
                vm::RAM_IPA
            )));
        }
        let vcpus = usize::try_from(h.vcpus).unwrap_or(usize::MAX);
        let ready = self.ready.lock().unwrap_or_else(|p| p.into_inner()).take();
        let vm = match ready {
            Some((v, m, vm)) if v == vcpus && m == h.mem_size => vm,
            _ => LinuxVm::blank(&self.blank_config(vcpus, h.mem_size))
                .map_err(|e| refuse(e.to_string()))?,
        };
        let vm = Arc::new(LinuxSessionVm::new(vm));
        *self.built.lock().unwrap_or_else(|p| p.into_inner()) = Some(vm.clone());
        Ok(LinuxDestGuest { vm })
    }
}

/// The destination's Linux guest: no vCPU runs until [`DestGuest::start`].
pub struct LinuxDestGuest {
    vm: Arc<LinuxSessionVm>,
}

/// A STATE body that decoded and fits the guest.
pub struct CheckedState(Vec<u8>);

impl DestGuest for LinuxDestGuest {
    type Vm = LinuxSessionVm;
    type State = CheckedState;
    type Running = LinuxRunning;

    fn vm(&self) -> &Arc<LinuxSessionVm> {
        &self.vm
    }

    fn decode_state(
        &self,
        body: &[u8],
        header: &Header,
        at_byte: u64,
    ) -> Result<CheckedState, MigrateError> {
        let vcpus = usize::try_from(header.vcpus).unwrap_or(usize::MAX);
        crate::state::linux::decode(body, vcpus, header.mem_size).map_err(|e| {
            MigrateError::Malformed {
                record: "STATE",
                at_byte,
                why: format!("the Linux guest's state: {e}"),
            }
        })?;
        // The blank machine's CPUs leave their park at the state's load,
        // each vCPU's CPU kicked once its STATE command is posted
        // (`LinuxVm::load_guest_state`).
        let mut copy = Vec::new();
        copy.try_reserve_exact(body.len())
            .map_err(|e| refuse(format!("STATE of {} bytes: {e}", body.len())))?;
        copy.extend_from_slice(body);
        fault_at_state(&self.vm);
        Ok(CheckedState(copy))
    }

    fn start(&self, state: &CheckedState) -> Result<LinuxRunning, MigrateError> {
        {
            let mut vm = self.vm.lock();
            // A machine whose QEMU is gone takes no state: that is what
            // failed, not the state.
            vm.machine()
                .check_alive()
                .map_err(|e| refuse(format!("its QEMU machine: {e}")))?;
            crate::state::load(&mut vm, &state.0)
                .map_err(|e| MigrateError::BadState { why: e.to_string() })?;
            vm.resume_vcpus().map_err(|e| MigrateError::BadState {
                why: crate::state::vm_error(e).to_string(),
            })?;
        }
        Ok(LinuxRunning {
            vm: self.vm.clone(),
        })
    }
}

/// The fault [`FAULT_AT_STATE`] asks for at STATE, if any.
fn fault_at_state(vm: &LinuxSessionVm) {
    let Some(v) = std::env::var_os(FAULT_AT_STATE) else {
        return;
    };
    match v.to_str() {
        Some("exit") => {
            eprintln!("s2mmu: {FAULT_AT_STATE}=exit: the destination process is killed at STATE");
            kill_self();
        }
        Some("kill-qemu") => {
            eprintln!(
                "s2mmu: {FAULT_AT_STATE}=kill-qemu: the destination's QEMU machine is killed at STATE"
            );
            vm.lock().machine().kill_qemu();
        }
        // These fire later, in the page-fetch hook.
        Some(EXIT_IN_POSTCOPY | KILL_QEMU_IN_POSTCOPY) => {}
        _ => eprintln!(
            "s2mmu: {FAULT_AT_STATE}={v:?} is none of exit, kill-qemu, {EXIT_IN_POSTCOPY} and \
             {KILL_QEMU_IN_POSTCOPY}: ignored"
        ),
    }
}

/// The resumed Linux guest.
pub struct LinuxRunning {
    vm: Arc<LinuxSessionVm>,
}

impl LinuxRunning {
    /// The VM.
    pub fn vm(&self) -> &Arc<LinuxSessionVm> {
        &self.vm
    }
}

impl GuestRun for LinuxRunning {
    fn pause(&self) {
        self.vm.pause_vcpus();
    }

    /// Post-copy's break: the guest is left running. A vCPU waiting in
    /// the page-fetch hook for a page the broken connection did not bring
    /// cannot park, so a pause would wait (60 s, then fail with some vCPUs
    /// parked and none resumed after the recovery); every other vCPU runs
    /// on pages that are here, and any missing page it touches makes it
    /// wait too until the recovery brings it (or post-copy is given up).
    fn request_pause(&self) {}

    fn resume(&self) {
        self.vm.resume_vcpus();
    }

    // The stub's stamp at the guest's entry, on the host's clock
    // (`LinuxVm::first_instruction_at`).
    fn first_instruction_at(&self) -> Option<std::time::Instant> {
        self.vm.lock().first_instruction_at()
    }

    fn counters(&self) -> GuestCounters {
        GuestCounters::default()
    }

    fn set_throttle_ns(&self, _: u64) {}

    fn pace(&self) -> u64 {
        0
    }

    fn set_pace(&self, _: u64) {}
}

impl ResumedGuest for LinuxRunning {
    fn final_state(&self) -> Vec<u8> {
        // The guest is paused: its whole state, the pages it wrote since
        // the resume and the digest of the others (empty if any cannot be
        // had; the source's check of FINAL then refuses it by name).
        let state = crate::state::save(&mut self.vm.lock());
        let written = self.vm.take_written();
        let (Ok(state), Ok(written)) = (state, written) else {
            return Vec::new();
        };
        match untouched_digest(self.vm.ram(), &written) {
            Ok(untouched) => LinuxFinal {
                state,
                written,
                untouched,
            }
            .encode(),
            Err(_) => Vec::new(),
        }
    }
}
