//! A Linux vCPU's exits as its host thread (`lifecycle/vcpu_thread.rs`)
//! answers them: stage-2 aborts with the engine's fault path or a device
//! model on the bus, and every other exit the bus dispatches to the device
//! that claims it: HVCs (PSCI), trapped system registers (the vGIC's SGI
//! registers), physical interrupts (the timer's); the list registers at
//! each answer.

use crate::layout::{self, mb};
use crate::linux::bus::Served;
use crate::linux::devices::device::{CallDone, Conduit, SysRegAccess};
use crate::linux::inject::Injection;
use crate::linux::mmio::{self, MmioDecode};
use crate::linux::placement::{Answer, PlacedVcpu};
use crate::linux::psci;
use crate::linux::shared::{kick_insns, ExitKind, Shared};
use crate::machine::{Exit, Mailbox};
use crate::Result;
use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

thread_local! {
    /// The vCPU this thread serves (interrupts raised for it need no kick).
    pub(crate) static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// What an exit's handling asks for.
pub(crate) enum Next {
    /// Resume at this ELR after this maintenance.
    Resume(u64, Vec<(u64, u64)>),
    /// Deliver this exception to the guest's EL1 (instead of stopping
    /// the VM), then resume at its vector.
    Inject(Injection),
    /// Stop this vCPU (CPU_OFF, or the VM stops).
    Off,
}

/// ESR_EL2 exception classes the loop handles.
const EC_WFX: u64 = 0x01;
const EC_SMC: u64 = 0x17;
const EC_SYSREG: u64 = 0x18;

/// The list registers and ICH_HCR_EL2 the stub loads at the answer.
pub(crate) fn sync_lrs(sh: &Shared, id: usize, mbox: &Mailbox<'_>) {
    // In the guest before the pending interrupts are read: one raised
    // after the read finds the vCPU there and kicks it.
    sh.cpus.watch.enter(id);
    let mut lrs = [0u64; crate::linux::gic::NR_LRS];
    for (i, lr) in lrs.iter_mut().enumerate() {
        *lr = mbox.read(mb::LR0 + 8 * i as u64);
    }
    let hcr = sh.devices.gic.sync_lrs(id, &mut lrs);
    for (i, lr) in lrs.iter().enumerate() {
        mbox.write(mb::LR0 + 8 * i as u64, *lr);
    }
    mbox.write(mb::ICH_HCR, hcr);
}

/// Answers exit `e` with [`layout::ACT_INJECT`]: the stub delivers `inj`
/// to the guest's EL1 and resumes it at the vector.
pub(crate) fn reply_inject(sh: &Shared, id: usize, mbox: &Mailbox<'_>, e: &Exit, inj: &Injection) {
    sync_lrs(sh, id, mbox);
    mbox.write(mb::NEW_ELR, inj.vector);
    mbox.write(mb::INJ_PSTATE, inj.pstate);
    mbox.reply(e, layout::ACT_INJECT, [inj.esr, inj.far], &[]);
}

/// Answers an exit the host cannot serve with an exception for the
/// guest's kernel, as KVM: logs it (capped) and counts it.
fn inject(sh: &Shared, id: usize, e: &Exit, inj: Injection, what: &str) -> Next {
    sh.host_log.stats[id]
        .injected
        .fetch_add(1, Ordering::Relaxed);
    sh.log(format!(
        "vCPU {id}: {what} (ESR_EL2 {:#x}, FAR {:#x}, ELR {:#x}): injected ESR_EL1 {:#x}",
        e.esr, e.far, e.elr, inj.esr
    ));
    Next::Inject(inj)
}

/// Waits for vCPU `id`'s next exit (`None` once the RUN command has
/// finished), without a deadline of its own: a guest may idle for long.
/// QEMU's death or the VM's stop ends the wait: after a stop the vCPU is
/// kicked again while its exit does not come, and given up (`None`) after
/// [`crate::linux::watch::STOP_GRACE`].
///
/// It spins and yields briefly (a guest's faults after a harvest come in
/// bursts), then sleeps until the stub rings the CPU's doorbell
/// ([`Mailbox::sleep_until_exit`]). Polling in naps of 20 to 200 µs
/// instead would wake a near-idle guest's thread thousands of times a
/// second, and the stub, waiting for an answer that comes only after a
/// nap, would wake QEMU's main loop on a 20 µs timer the while, all of it
/// taken from a migration's threads on 2 cores.
pub(crate) fn wait_exit(
    sh: &Shared,
    id: usize,
    mbox: &Mailbox<'_>,
    last: u64,
    run: u64,
) -> Result<Option<Exit>> {
    let mut spins = 0u32;
    let mut kicked = None;
    loop {
        if let Some(e) = mbox.poll_exit(last) {
            sh.cpus.watch.exited(id);
            return Ok(Some(e));
        }
        if mbox.done(run) {
            return Ok(None);
        }
        spins = spins.saturating_add(1);
        if spins < EXIT_SPINS {
            std::hint::spin_loop();
        } else if spins < EXIT_SPINS + EXIT_YIELDS {
            std::thread::yield_now();
        } else {
            sh.vm.machine().check_alive()?;
            sh.check_deadline();
            if sh.stopping() && !sh.wait_after_stop(id, &mut kicked) {
                return Ok(None);
            }
            if let Some(e) = mbox.sleep_until_exit(last, EXIT_SLEEP) {
                sh.cpus.watch.exited(id);
                return Ok(Some(e));
            }
        }
    }
}

/// Spins before the thread yields while it waits for an exit.
const EXIT_SPINS: u32 = 256;
/// Yields before it sleeps.
const EXIT_YIELDS: u32 = 16;
/// The longest sleep: how often a thread whose guest is idle looks at
/// QEMU's life, the VM's deadline and a finished command (a stop kicks
/// the vCPU, whose exit rings the doorbell).
const EXIT_SLEEP: Duration = Duration::from_millis(10);

pub(crate) fn handle(
    sh: &Shared,
    id: usize,
    vcpu: &mut dyn PlacedVcpu,
    mbox: &Mailbox<'_>,
    e: &Exit,
) -> Result<Next> {
    let ec = e.esr >> 26;
    match e.kind {
        layout::EXIT_ABORT => abort(sh, id, vcpu, mbox, e),
        layout::EXIT_IRQ => {
            sh.count(id, ExitKind::Irq);
            let intid = mbox.read(mb::INTID) as u32;
            sh.devices.interrupt(id, intid);
            Ok(Next::Resume(e.elr, Vec::new()))
        }
        layout::EXIT_HVC => {
            sh.count(id, ExitKind::Hvc);
            Ok(call(sh, id, mbox, Conduit::Hvc)
                .map_or(Next::Off, |()| Next::Resume(e.elr, Vec::new())))
        }
        _ if ec == EC_SYSREG => {
            sh.count(id, ExitKind::Sysreg);
            let kicks = sysreg(sh, id, mbox, e);
            Ok(Next::Resume(mmio::next_insn(e.elr), kicks))
        }
        _ if ec == EC_WFX => Ok(Next::Resume(mmio::next_insn(e.elr), Vec::new())),
        _ if ec == EC_SMC => {
            // The stub leaves ELR at the SMC itself.
            Ok(call(sh, id, mbox, Conduit::Smc).map_or(Next::Off, |()| {
                Next::Resume(mmio::next_insn(e.elr), Vec::new())
            }))
        }
        _ => {
            let u = Injection::undef(e.esr, mbox.read(mb::SPSR));
            let what = format!("unhandled exception class {ec:#x}: UNDEF");
            Ok(inject(sh, id, e, u, &what))
        }
    }
}

/// An SMCCC call over `conduit`, served by the device that claims its
/// function ID; one no device claims answers NOT_SUPPORTED, as SMCCC
/// asks (SMC is not this VM's conduit: the device tree says HVC).
/// `None` when the call leaves the vCPU off.
fn call(sh: &Shared, id: usize, mbox: &Mailbox<'_>, conduit: Conduit) -> Option<()> {
    let x = [mbox.gpr(0), mbox.gpr(1), mbox.gpr(2), mbox.gpr(3)];
    let not_supported = CallDone::Resume(psci::RET_NOT_SUPPORTED as u64);
    match sh.devices.call(conduit, id, x, sh).unwrap_or(not_supported) {
        CallDone::Resume(x0) => {
            mbox.set_gpr(0, x0);
            Some(())
        }
        CallDone::Off => None,
    }
}

/// A trapped system register access (EC 0x18), served by the device that
/// claims the register (the GIC's SGI registers, which EL1 writes trap
/// while HCR_EL2.IMO is set). Any other reads as zero; a write to it is
/// logged and ignored. Returns the answer's maintenance: the kicks for the
/// vCPUs the access left an interrupt pending for.
fn sysreg(sh: &Shared, id: usize, mbox: &Mailbox<'_>, e: &Exit) -> Vec<(u64, u64)> {
    let a = SysRegAccess::decode(e.esr);
    let write = (!a.read).then(|| mbox.gpr(a.rt));
    let Some(done) = sh.devices.sysreg(id, a.reg, write) else {
        if a.read {
            mbox.set_gpr(a.rt, 0);
        } else {
            sh.log(format!(
                "vCPU {id}: write to trapped system register {} at {:#x} ignored",
                a.reg, e.elr
            ));
        }
        return Vec::new();
    };
    if a.read {
        mbox.set_gpr(a.rt, done.value);
    }
    // Pending for every target, then a kick, sent by this vCPU's CPU as
    // it resumes, for those in their guest with none on the way; the
    // others load it at their next entry.
    kick_insns(&sh.cpus.watch, done.raised)
}

fn abort(
    sh: &Shared,
    id: usize,
    vcpu: &mut dyn PlacedVcpu,
    mbox: &Mailbox<'_>,
    e: &Exit,
) -> Result<Next> {
    if sh.faults.fb_moving.load(Ordering::Acquire) && crate::linux::changes::in_fb(e.ipa()) {
        // The framebuffer's slot is being moved: as KVM with an invalid
        // slot, the guest retries the access once the move is done.
        std::thread::sleep(Duration::from_micros(100));
        return Ok(Next::Resume(e.elr, Vec::new()));
    }
    if crate::vm::fault_kind(e.dfsc()).is_none() {
        // Neither a translation nor a permission fault (an address size,
        // access flag or external abort): nothing for the engine to map.
        let a = Injection::abort(e.esr, e.far, mbox.read(mb::SPSR));
        let what = format!("stage-2 abort at IPA {:#x}: external abort", e.ipa());
        return Ok(inject(sh, id, e, a, &what));
    }
    sh.faults.page_fetch.before_fault(id, e)?;
    let t0 = Instant::now();
    let r = vcpu.stage2_abort(e)?;
    let st = &sh.host_log.stats[id];
    match r {
        // Not counted: the guest's retry is the fault the engine answers.
        Ok(Answer::Retry) => Ok(Next::Resume(e.elr, Vec::new())),
        Ok(Answer::Mapped(insns)) => {
            sh.count(id, ExitKind::Stage2Fault);
            if crate::linux::dirty_limit::dirties(e) {
                sh.faults.limit.on_write_fault(id);
            }
            st.engine_ns
                .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            Ok(Next::Resume(e.elr, insns))
        }
        Err(s2mmu::Error::RingFull { .. }) => {
            // As KVM's exit to user space: wait for the harvester to reset
            // the rings, then let the guest fault again.
            std::thread::sleep(Duration::from_micros(200));
            Ok(Next::Resume(e.elr, Vec::new()))
        }
        Err(s2mmu::Error::NoSlot { .. }) => {
            sh.count(id, ExitKind::Mmio);
            let next = mmio(sh, id, mbox, e);
            st.device_ns
                .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            next
        }
        Err(err) => Err(err.into()),
    }
}

/// An access to an IPA no memslot covers: a device on the bus (the GIC's
/// frames among them), or a logged read-as-zero/write-ignored.
fn mmio(sh: &Shared, id: usize, mbox: &Mailbox<'_>, e: &Exit) -> Result<Next> {
    let ipa = e.ipa();
    let op = match mmio::decode(e.esr, ipa, |n| mbox.gpr(n)) {
        MmioDecode::Access(op) => op,
        MmioDecode::FetchOrWalk => {
            let a = Injection::abort(e.esr, e.far, mbox.read(mb::SPSR));
            let what = format!("instruction fetch or table walk at IPA {ipa:#x} outside RAM");
            return Ok(inject(sh, id, e, a, &what));
        }
        MmioDecode::CacheMaintenance => {
            return Ok(Next::Resume(mmio::next_insn(e.elr), Vec::new()));
        }
        MmioDecode::NoSyndrome => {
            // As KVM (with QEMU's answer to KVM_EXIT_ARM_NISV): a load or
            // store pair, a writeback form, an exclusive or DC ZVA to a
            // device is refused whole, with a synchronous external abort,
            // never half done.
            let a = Injection::abort(e.esr, e.far, mbox.read(mb::SPSR));
            let what = format!("MMIO access at IPA {ipa:#x} without a syndrome");
            return Ok(inject(sh, id, e, a, &what));
        }
    };
    let v = match sh.devices.bus.access(ipa, op.size, op.write) {
        Ok((v, Served::Interrupts)) => {
            sh.kick_pending();
            v
        }
        Ok((v, Served::Plain)) => v,
        Err(u) => {
            sh.log(format!(
                "vCPU {id}: {} of {} bytes at IPA {ipa:#x} claimed by no device ({u:?}): \
                 read as zero, write ignored",
                if op.write.is_some() { "write" } else { "read" },
                op.size
            ));
            0
        }
    };
    if op.write.is_none() {
        mbox.set_gpr(op.srt, mmio::load_value(e.esr, op.size, v));
    }
    Ok(Next::Resume(mmio::next_insn(e.elr), Vec::new()))
}
