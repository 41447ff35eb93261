//! Where the engine's TLB maintenance runs: on an arm64 CPU at EL2.
//!
//! [`HypSink`] is the [`TlbiSink`] of the engine's [`Arm64Tlbi`] backend.
//! Every broadcast sequence (the `...IS` forms: a break's invalidation, a
//! write protection's, an unmap's) is queued to the service CPU, a QEMU CPU
//! that stays at EL2, and the caller waits until the stub has executed it,
//! barriers included: the design's `kvm_call_hyp`. QEMU completes the
//! broadcast forms on every vCPU before the issuing CPU goes on. That holds
//! inside a vCPU's stage-2 abort too: a split on fault breaks the block,
//! and its invalidation must complete before the engine makes the table
//! (break, DSB, TLBI, DSB, make), which an answer the stub runs after the
//! host wrote the table cannot give. Only a sequence that is local to the
//! faulting CPU (the `TLBI IPAS2LE1; VMALLE1` after a permission relaxation,
//! which needs no break) goes into the abort's answer, executed on that
//! CPU before it returns to the guest, as KVM's fault path does on the
//! vCPU's own CPU.

use crate::layout::{self, mb};
use crate::machine::Machine;
use crate::Result;
use s2mmu::tlb::arm64::{Arm64Tlbi, Barrier, Insn, TlbiOp, TlbiSink};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The stub's code for an instruction (mirrored in `asm/hyp.S`).
pub fn encode(insn: Insn) -> (u64, u64) {
    match insn {
        Insn::Barrier(b) => (
            match b {
                Barrier::DsbIshst => 1,
                Barrier::DsbIsh => 2,
                Barrier::DsbNshst => 3,
                Barrier::DsbNsh => 4,
                Barrier::Isb => 5,
            },
            0,
        ),
        Insn::Tlbi { op, operand } => (
            match op {
                TlbiOp::Ipas2e1is => 0x10,
                TlbiOp::Ipas2e1 => 0x11,
                TlbiOp::Ripas2e1is => 0x12,
                TlbiOp::Vmalle1is => 0x13,
                TlbiOp::Vmalle1 => 0x14,
                TlbiOp::Vmalls12e1is => 0x15,
                TlbiOp::Ipas2le1is => 0x16,
                TlbiOp::Ipas2le1 => 0x17,
            },
            operand,
        ),
    }
}

/// The whole-VMID sequence, what an over-long list is replaced with.
const WHOLE_VMID: [(u64, u64); 3] = [(1, 0), (0x15, 0), (2, 0)];

/// Whether every instruction of a sequence acts on the issuing CPU only
/// (`DSB NSH*`, `ISB`, `TLBI IPAS2E1`, `TLBI IPAS2LE1`, `TLBI VMALLE1`).
fn is_local(insns: &[(u64, u64)]) -> bool {
    insns
        .iter()
        .all(|&(code, _)| matches!(code, 3..=5 | 0x11 | 0x14 | 0x17))
}

thread_local! {
    /// The answer being built by this thread's vCPU fault, if any.
    static FAULT_INSNS: RefCell<Option<Vec<(u64, u64)>>> = const { RefCell::new(None) };
    /// The sequence this thread is issuing.
    static SEQUENCE: RefCell<Vec<(u64, u64)>> = const { RefCell::new(Vec::new()) };
}

/// Counters of the maintenance the engine issued.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TlbiCounters {
    /// Sequences issued while a vCPU's abort was handled (in its answer
    /// when local to that CPU, else by the service CPU before the engine
    /// went on).
    pub fault_sequences: u64,
    /// Of those, the broadcast ones the service CPU executed.
    pub fault_service_sequences: u64,
    /// Sequences executed by the service CPU for host threads.
    pub host_sequences: u64,
    /// TLBI instructions in all of them.
    pub tlbis: u64,
    /// Round trips to the service CPU.
    pub service_calls: u64,
    /// Wall time host threads waited for the service CPU, in ns.
    pub service_ns: u64,
    /// Of `service_ns`, the service CPU's own time on the calls (from its
    /// counter stamps at pickup and at the end, [`Mailbox::last_command_time`]);
    /// the rest is the wait for an idle stub to pick a call up and for the
    /// host to see the answer.
    ///
    /// [`Mailbox::last_command_time`]: crate::machine::Mailbox::last_command_time
    pub service_work_ns: u64,
    /// Host sequences dropped on purpose ([`HypSink::drop_host_sequences`]).
    pub dropped: u64,
}

/// The engine's TLBI sink on the arm64 model.
pub struct HypSink {
    machine: Arc<Machine>,
    service_cpu: usize,
    vtcr: AtomicU64,
    vttbr: AtomicU64,
    service: Mutex<()>,
    drop_next: AtomicU64,
    answer_broadcasts: AtomicBool,
    skew_ipa: AtomicU64,
    drop_stage1: AtomicBool,
    fault_sequences: AtomicU64,
    fault_service_sequences: AtomicU64,
    host_sequences: AtomicU64,
    tlbis: AtomicU64,
    service_calls: AtomicU64,
    service_ns: AtomicU64,
    service_work_ns: AtomicU64,
    dropped: AtomicU64,
}

impl HypSink {
    /// A sink that sends host-thread maintenance to `service_cpu`.
    pub fn new(machine: Arc<Machine>, service_cpu: usize) -> HypSink {
        HypSink {
            machine,
            service_cpu,
            vtcr: AtomicU64::new(0),
            vttbr: AtomicU64::new(0),
            service: Mutex::new(()),
            drop_next: AtomicU64::new(0),
            answer_broadcasts: AtomicBool::new(false),
            skew_ipa: AtomicU64::new(0),
            drop_stage1: AtomicBool::new(false),
            fault_sequences: AtomicU64::new(0),
            fault_service_sequences: AtomicU64::new(0),
            host_sequences: AtomicU64::new(0),
            tlbis: AtomicU64::new(0),
            service_calls: AtomicU64::new(0),
            service_ns: AtomicU64::new(0),
            service_work_ns: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// The VM context (VTCR_EL2, VTTBR_EL2) maintenance runs in.
    pub fn set_context(&self, vtcr: u64, vttbr: u64) {
        self.vtcr.store(vtcr, Ordering::Release);
        self.vttbr.store(vttbr, Ordering::Release);
    }

    /// Fault injection for the check that proves a missing invalidation is
    /// caught: the next `n` sequences issued by host threads are dropped
    /// instead of executed. Never use outside such a test.
    pub fn drop_host_sequences(&self, n: u64) {
        self.drop_next.store(n, Ordering::Release);
    }

    /// Fault injection for the check that proves the break-before-make
    /// monitor catches a make before its break is invalidated: with `on`,
    /// a fault's broadcast invalidations go into the abort's answer, run by
    /// the stub after the host has made the new entry (what this sink did
    /// before it ran them through the service CPU). QEMU does not model TLB
    /// conflicts, so the guest runs on; the monitor ([`s2mmu::bbm`]) is
    /// what sees it. Never use outside such a test.
    pub fn answer_fault_broadcasts(&self, on: bool) {
        self.answer_broadcasts.store(on, Ordering::Release);
    }

    /// Fault injection for the checks that judge a TLBI's operand
    /// ([`crate::walk_cache`]): from now on every by-IPA operand
    /// (`TLBI IPAS2E1IS`, `IPAS2LE1IS`, their local forms, the base of
    /// `RIPAS2E1IS`) has `by`
    /// added to its address field (4 KiB units in an `IPAS2*` operand,
    /// granules in a range's base: one page either way with 4K pages), so
    /// it names another page than the one the engine asked for (0: as
    /// asked). Never use outside such a test.
    pub fn skew_ipa_operands(&self, by: u64) {
        self.skew_ipa.store(by, Ordering::Release);
    }

    /// Fault injection for the same checks: with `on`, the stage-1
    /// invalidation that ends each sequence (`TLBI VMALLE1IS` or
    /// `VMALLE1`) is left out, so combined stage-1+2 entries survive a
    /// stage-2 change. Never use outside such a test.
    pub fn drop_stage1_flushes(&self, on: bool) {
        self.drop_stage1.store(on, Ordering::Release);
    }

    /// `insn` as the injected faults change it; `None`: left out.
    fn injected(&self, insn: Insn) -> Option<Insn> {
        match insn {
            Insn::Tlbi {
                op: TlbiOp::Vmalle1is | TlbiOp::Vmalle1,
                ..
            } if self.drop_stage1.load(Ordering::Acquire) => None,
            Insn::Tlbi {
                op:
                    op @ (TlbiOp::Ipas2e1is
                    | TlbiOp::Ipas2e1
                    | TlbiOp::Ipas2le1is
                    | TlbiOp::Ipas2le1
                    | TlbiOp::Ripas2e1is),
                operand,
            } => Some(Insn::Tlbi {
                op,
                // The address field is the operand's low bits (IPA >> 12,
                // or the range's BADDR in granules).
                operand: operand.wrapping_add(self.skew_ipa.load(Ordering::Acquire)),
            }),
            other => Some(other),
        }
    }

    /// The counters so far.
    pub fn counters(&self) -> TlbiCounters {
        TlbiCounters {
            fault_sequences: self.fault_sequences.load(Ordering::Relaxed),
            fault_service_sequences: self.fault_service_sequences.load(Ordering::Relaxed),
            host_sequences: self.host_sequences.load(Ordering::Relaxed),
            tlbis: self.tlbis.load(Ordering::Relaxed),
            service_calls: self.service_calls.load(Ordering::Relaxed),
            service_ns: self.service_ns.load(Ordering::Relaxed),
            service_work_ns: self.service_work_ns.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
        }
    }

    /// Runs `f` (a vCPU's fault handling) with the maintenance it issues
    /// collected for the abort's answer instead of sent to the service CPU;
    /// returns `f`'s result and that list.
    pub fn collect_for_fault<R>(&self, f: impl FnOnce() -> R) -> (R, Vec<(u64, u64)>) {
        FAULT_INSNS.with(|c| *c.borrow_mut() = Some(Vec::new()));
        let r = if self.answer_broadcasts.load(Ordering::Acquire) {
            // The injected fault: broadcasts wait in the answer, so they
            // complete only after everything `f` stored.
            let (r, queued) = s2mmu::bbm::defer_invalidations(f);
            queued.complete();
            r
        } else {
            f()
        };
        let mut insns = FAULT_INSNS
            .with(|c| c.borrow_mut().take())
            .unwrap_or_default();
        if insns.len() > mb::REPLY_CAP {
            insns = WHOLE_VMID.to_vec();
        }
        (r, insns)
    }

    /// Makes CPU `cpu` (a vCPU running guest code, or about to) exit to the
    /// host: the service CPU sends it the stub's kick SGI at EL2, which it
    /// takes as an IRQ from the guest. A CPU in an exit at EL2 takes it
    /// once it re-enters its guest, so a kick is never lost; a CPU in its
    /// command loop, between two lives of a guest, wakes and drops it
    /// there (`mb::KICKS_TAKEN`): nothing runs to be stopped, and a
    /// parked one (a restore's) looks for its command at once.
    ///
    /// # Panics
    /// If the service CPU stops answering (as for maintenance).
    pub fn kick(&self, cpu: usize) {
        if let Err(e) = self.try_kick_all(&[cpu]) {
            panic!("service CPU did not send a kick: {e}");
        }
    }

    /// [`HypSink::kick`]s every CPU of `cpus` with one SGI per 16 CPUs
    /// (the SGI's target list), so one service command for a machine's
    /// vCPUs; fails instead of panicking.
    ///
    /// # Errors
    /// As [`crate::machine::Mailbox::command`] (QEMU gone, the service
    /// CPU not answering).
    pub fn try_kick_all(&self, cpus: &[usize]) -> Result<()> {
        // ICC_SGI1R_EL1: INTID 15, Aff1 = cpu / 16, target list bit Aff0.
        let mut lists = std::collections::BTreeMap::<u64, u64>::new();
        for &cpu in cpus {
            *lists.entry(cpu as u64 / 16).or_default() |= 1 << (cpu % 16);
        }
        let _one = self.service.lock().unwrap();
        let mbox = self.machine.mailbox(self.service_cpu);
        for (aff1, list) in lists {
            let sgi = 15u64 << 24 | aff1 << 16 | list;
            mbox.command_ringing(layout::CMD_KICK, &[sgi])?;
        }
        Ok(())
    }

    /// Parks the service CPU ([`crate::machine::Mailbox::park`]): its
    /// waits for a command back off to `wait` instead of 640 µs, so QEMU
    /// wakes far less often while nothing needs it. The sink's own
    /// commands (maintenance, kicks, the wake's ping) ring the host's bell
    /// ([`crate::machine::Machine::ring_in`]) while it is parked, so they
    /// do not wait for the wait in progress. [`HypSink::wake_service`]
    /// ends it.
    ///
    /// # Errors
    /// As [`crate::machine::Mailbox::park`].
    pub fn park_service(&self, wait: Duration) -> Result<()> {
        self.machine.mailbox(self.service_cpu).park(wait)
    }

    /// Ends [`HypSink::park_service`] and has the service CPU answer a
    /// ping, rung out of the park's wait by the host's bell, so that the
    /// next command (a pause's kick, inside a migration's downtime) finds
    /// it in its short waits.
    ///
    /// # Panics
    /// If the service CPU stops answering (as for maintenance).
    pub fn wake_service(&self) {
        let _one = self.service.lock().unwrap();
        let mbox = self.machine.mailbox(self.service_cpu);
        mbox.unpark();
        if let Err(e) = mbox.command_ringing(layout::CMD_PING, &[]) {
            panic!("service CPU did not answer a ping: {e}");
        }
    }

    /// Runs `f` with the service CPU's mailbox, no other command of the
    /// sink's (maintenance, kicks) in between: the EL2 placement's
    /// commands go there.
    pub(crate) fn with_service<R>(&self, f: impl FnOnce(&crate::machine::Mailbox<'_>) -> R) -> R {
        let _one = self.service.lock().unwrap();
        f(&self.machine.mailbox(self.service_cpu))
    }

    fn run_on_service(&self, insns: &[(u64, u64)], droppable: bool) {
        if droppable
            && self
                .drop_next
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
        {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let insns = if insns.len() > mb::CMD_CAP {
            &WHOLE_VMID[..]
        } else {
            insns
        };
        let t0 = Instant::now();
        let _one = self.service.lock().unwrap();
        let mbox = self.machine.mailbox(self.service_cpu);
        mbox.set_cmd_insns(insns);
        let args = [
            insns.len() as u64,
            self.vtcr.load(Ordering::Acquire),
            self.vttbr.load(Ordering::Acquire),
        ];
        // A stuck service CPU cannot be recovered from: the engine's
        // invalidation API has no error path, and going on would lose the
        // guarantee every dirty log rests on.
        // A parked service CPU (a source's while it logs) is rung awake.
        let r = if mbox.parked() {
            mbox.command_ringing(layout::CMD_TLBI, &args)
        } else {
            mbox.command(layout::CMD_TLBI, &args)
        };
        if let Err(e) = r {
            panic!("service CPU did not execute TLB maintenance: {e}");
        }
        let total = t0.elapsed();
        let work = mbox.last_command_time();
        self.service_calls.fetch_add(1, Ordering::Relaxed);
        self.service_ns
            .fetch_add(total.as_nanos() as u64, Ordering::Relaxed);
        self.service_work_ns
            .fetch_add(work.map_or(0, |w| w.as_nanos() as u64), Ordering::Relaxed);
    }
}

impl TlbiSink for HypSink {
    fn emit(&self, insn: Insn) {
        let Some(insn) = self.injected(insn) else {
            return;
        };
        if matches!(insn, Insn::Tlbi { .. }) {
            self.tlbis.fetch_add(1, Ordering::Relaxed);
        }
        SEQUENCE.with(|c| c.borrow_mut().push(encode(insn)));
    }

    fn begin(&self) {}

    fn end(&self) {
        let insns = SEQUENCE.with(|c| std::mem::take(&mut *c.borrow_mut()));
        if insns.is_empty() {
            return;
        }
        let in_fault = FAULT_INSNS.with(|c| c.borrow().is_some());
        if in_fault {
            self.fault_sequences.fetch_add(1, Ordering::Relaxed);
            if is_local(&insns) || self.answer_broadcasts.load(Ordering::Acquire) {
                FAULT_INSNS.with(|c| c.borrow_mut().as_mut().map(|v| v.extend(insns)));
                return;
            }
            self.fault_service_sequences.fetch_add(1, Ordering::Relaxed);
        } else {
            self.host_sequences.fetch_add(1, Ordering::Relaxed);
        }
        self.run_on_service(&insns, !in_fault);
    }
}

/// The engine's TLB backend on the arm64 model.
pub type HypTlbi = Arm64Tlbi<Arc<HypSink>>;

#[cfg(test)]
mod tests {
    use super::{encode, is_local};
    use s2mmu::tlb::arm64::{Arm64Tlbi, Arm64TlbiFeatures, InsnRecorder, TlbiOp};
    use s2mmu::TlbInvalidate;

    /// Every operation has a code of its own, the stub's (`asm/hyp.S`).
    #[test]
    fn every_tlbi_op_has_its_own_stub_code() {
        let ops = [
            (TlbiOp::Ipas2e1is, 0x10),
            (TlbiOp::Ipas2e1, 0x11),
            (TlbiOp::Ripas2e1is, 0x12),
            (TlbiOp::Vmalle1is, 0x13),
            (TlbiOp::Vmalle1, 0x14),
            (TlbiOp::Vmalls12e1is, 0x15),
            (TlbiOp::Ipas2le1is, 0x16),
            (TlbiOp::Ipas2le1, 0x17),
        ];
        for (op, code) in ops {
            let insn = s2mmu::tlb::arm64::Insn::Tlbi { op, operand: 7 };
            assert_eq!(encode(insn), (code, 7), "{op:?}");
        }
    }

    /// A relaxation's sequence (last level, this CPU) stays in the fault's
    /// answer; a break's (last level, broadcast) goes to the service CPU.
    #[test]
    fn only_the_local_last_level_sequence_is_local() {
        let tlb = Arm64Tlbi::new(InsnRecorder::new(), 12, Arm64TlbiFeatures::default());
        tlb.flush_ipa_local(0x4000_0000, Some(3));
        tlb.flush_ipa(0x4000_0000, Some(3));
        let seqs: Vec<Vec<(u64, u64)>> = tlb
            .sink()
            .take()
            .into_iter()
            .map(|s| s.into_iter().map(encode).collect())
            .collect();
        assert_eq!(seqs[0][1].0, 0x17, "IPAS2LE1");
        assert!(is_local(&seqs[0]));
        assert_eq!(seqs[1][1].0, 0x16, "IPAS2LE1IS");
        assert!(!is_local(&seqs[1]));
    }
}
