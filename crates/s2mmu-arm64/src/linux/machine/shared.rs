//! What a Linux VM's vCPU threads share, grouped by the room that owns
//! each part: the engine in its placement, the devices
//! ([`DeviceSet`]), the vCPUs' power and the stop ([`VcpuControl`]), what
//! a RAM fault consults besides the engine ([`RamFaults`]), and the
//! host's log and counters ([`HostLog`]); and the guest's fixed places
//! (HCR_EL2, where RAM sits). The modules that act on a running VM (the
//! vCPU loop, the harvester, the host's changes) import this one; it
//! imports none of them.

use crate::linux::dirty_limit::DirtyLimit;
use crate::linux::page_fetch::HookSlot;
use crate::linux::placement::Placement;
use crate::linux::power::VcpuControl;
use crate::linux::psci::{self, PowerState};
use crate::linux::set::DeviceSet;
use crate::linux::watch::{self, Watch, INSN_KICK, KICK_SGI, STOP_GRACE, STOP_REKICK};
use crate::stage2;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub(crate) use crate::linux::power::Power;
pub use crate::linux::power::StopReason;
pub use crate::linux::set::DeviceLayout;

/// HCR_EL2 of a Linux guest: stage 2 (VM), interrupts and SErrors to EL2
/// (IMO, FMO, AMO: the guest sees the virtual CPU interface), broadcast
/// TLB maintenance and barriers inner shareable (FB, BSU = IS), SMC traps
/// (TSC), EL1 in AArch64 (RW), pointer authentication not trapped (APK,
/// API). WFI and WFE run in the guest: each vCPU owns its QEMU CPU, whose
/// WFI ends on a virtual interrupt or a physical one for EL2 (a kick).
pub const HCR_LINUX: u64 = stage2::HCR_VM
    | stage2::HCR_SWIO
    | 1 << 3
    | 1 << 4
    | 1 << 5
    | 1 << 9
    | 1 << 10
    | stage2::HCR_TSC
    | stage2::HCR_RW
    | 1 << 40
    | 1 << 41;
/// Where guest RAM starts in the guest's IPA space (the device tree says).
pub const RAM_IPA: u64 = 0x4000_0000;
/// The memslot of guest RAM.
pub const RAM_SLOT: u16 = 1;
/// Exit kinds counted per vCPU.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ExitKind {
    Stage2Fault,
    Mmio,
    Hvc,
    Sysreg,
    Irq,
}

/// Per-vCPU counters.
#[derive(Default)]
pub(crate) struct VcpuCounters {
    pub(crate) exits: [AtomicU64; 5],
    pub(crate) engine_ns: AtomicU64,
    pub(crate) device_ns: AtomicU64,
    pub(crate) host_ns: AtomicU64,
    pub(crate) injected: AtomicU64,
}

/// The host's log of a run and its per-vCPU counters.
pub(crate) struct HostLog {
    pub(crate) stats: Vec<VcpuCounters>,
    lines: Mutex<Vec<String>>,
}

impl HostLog {
    /// An empty log with counters for `vcpus` vCPUs.
    pub(crate) fn new(vcpus: usize) -> HostLog {
        HostLog {
            stats: (0..vcpus).map(|_| VcpuCounters::default()).collect(),
            lines: Mutex::new(Vec::new()),
        }
    }

    /// Counts an exit of kind `k` for vCPU `id`.
    pub(crate) fn count(&self, id: usize, k: ExitKind) {
        self.stats[id].exits[k as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Prints `line` and keeps it, up to [`LOG_CAP`] lines.
    pub(crate) fn line(&self, line: String) {
        let mut l = self.lines.lock().unwrap();
        if l.len() < LOG_CAP {
            eprintln!("s2mmu linux: {line}");
            l.push(line);
        }
    }

    /// Each vCPU's exits by kind, now.
    pub(crate) fn exits(&self) -> Vec<[u64; 5]> {
        self.stats
            .iter()
            .map(|s| std::array::from_fn(|k| s.exits[k].load(Ordering::Relaxed)))
            .collect()
    }

    /// The lines kept.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

/// What a guest's stage-2 fault in RAM consults besides the engine.
pub(crate) struct RamFaults {
    /// The framebuffer's memslot is moving: faults on it wait.
    pub(crate) fb_moving: AtomicBool,
    /// Post-copy's hook: called on a translation fault in RAM first.
    pub(crate) page_fetch: HookSlot,
    /// Throttle and pace, served at the guest's write faults.
    pub(crate) limit: Arc<DirtyLimit>,
}

impl RamFaults {
    /// No move, no hook, and `limit`'s brakes.
    pub(crate) fn new(limit: Arc<DirtyLimit>) -> RamFaults {
        RamFaults {
            fb_moving: AtomicBool::new(false),
            page_fetch: HookSlot::default(),
            limit,
        }
    }
}

/// What the vCPU threads share.
pub(crate) struct Shared {
    /// The engine, in its placement.
    pub(crate) vm: Box<dyn Placement>,
    pub(crate) devices: DeviceSet,
    pub(crate) cpus: VcpuControl,
    pub(crate) faults: RamFaults,
    pub(crate) host_log: HostLog,
}

/// Lines of the host's log kept (the rest are counted).
const LOG_CAP: usize = 256;

impl Shared {
    pub(crate) fn count(&self, id: usize, k: ExitKind) {
        self.host_log.count(id, k);
    }

    pub(crate) fn log(&self, line: String) {
        self.host_log.line(line);
    }

    pub(crate) fn stopping(&self) -> bool {
        self.cpus.stopping()
    }

    /// Stops the VM: every vCPU in its guest is kicked (its caller's
    /// included) and leaves it at that exit, and threads waiting for
    /// CPU_ON give up.
    pub(crate) fn stop(&self, why: StopReason) {
        self.cpus.mark_stopped(why);
        self.kick_claimed(0..self.devices.gic.vcpus());
    }

    pub(crate) fn check_deadline(&self) {
        if self.cpus.past_deadline() {
            self.stop(StopReason::Timeout);
        }
    }

    /// Makes `intid` pending for `vcpu` and kicks it if it runs its guest
    /// with no kick on the way.
    pub(crate) fn raise(&self, vcpu: usize, intid: u32) {
        self.kick_claimed(self.devices.gic.raise(vcpu, intid));
    }

    /// After a GIC register write: kicks the other vCPUs that now have an
    /// enabled interrupt pending.
    pub(crate) fn kick_pending(&self) {
        let gic = &self.devices.gic;
        for v in 0..gic.vcpus() {
            if gic.has_pending(v) {
                self.kick_claimed([v]);
            }
        }
    }
}

impl Shared {
    /// Kicks every vCPU in `targets` that runs its guest with no kick on
    /// the way, with one command to the service CPU for all of them.
    pub(crate) fn kick_claimed(&self, targets: impl IntoIterator<Item = usize>) {
        let list: Vec<usize> = targets
            .into_iter()
            .filter(|&t| self.cpus.watch.claim_kick(t))
            .collect();
        if list.is_empty() {
            return;
        }
        if let Err(e) = self.vm.kick_all(&list) {
            self.log(format!("kicking vCPUs {list:?} failed: {e}"));
        }
    }

    /// While vCPU `id`'s thread waits for an exit: after a stop, kicks
    /// the vCPU again every [`STOP_REKICK`] (a stop that came as its
    /// thread resumed it found it in the host); `false` once
    /// [`STOP_GRACE`] has passed without the exit.
    pub(crate) fn wait_after_stop(&self, id: usize, kicked: &mut Option<Instant>) -> bool {
        let Some(since) = self.cpus.watch.stopped_for() else {
            return true;
        };
        if since > STOP_GRACE {
            self.log(format!(
                "vCPU {id} did not leave its guest within {STOP_GRACE:?} of the stop: given up"
            ));
            return false;
        }
        if kicked.is_none_or(|k| k.elapsed() >= STOP_REKICK) {
            if let Err(e) = self.vm.kick_all(&[id]) {
                self.log(format!("kicking vCPU {id} after the stop failed: {e}"));
            }
            *kicked = Some(Instant::now());
        }
        true
    }

    /// PSCI CPU_OFF from vCPU `id`: its power state is off, and the VM
    /// stops ([`StopReason::CpusOff`]) if no vCPU is left on or about to
    /// start, as KVM reports the VM stopped when its last CPU is off.
    pub(crate) fn cpu_off(&self, id: usize) {
        if self.cpus.cpu_off(id) {
            self.stop(StopReason::CpusOff);
        }
    }
}

/// PSCI served against the VM's power states (see [`psci::serve`]): the
/// vCPU control answers, and the VM stops for the calls that end it.
impl psci::PowerControl for Shared {
    fn vcpus(&self) -> usize {
        self.cpus.vcpus()
    }

    fn cpu_on(&self, target: u64, entry: u64, context: u64) -> i64 {
        self.cpus.cpu_on(target, entry, context)
    }

    fn power(&self, v: usize) -> PowerState {
        self.cpus.power(v)
    }

    fn cpu_off(&self, id: usize) {
        Shared::cpu_off(self, id);
    }

    fn system_off(&self, reset: bool) {
        self.stop(if reset {
            StopReason::Reset
        } else {
            StopReason::PowerOff
        });
    }
}

/// Starts `sh`'s watchdog: at its deadline it stops the VM
/// ([`StopReason::Timeout`]).
///
/// # Errors
/// The thread could not be made (the text says why).
pub(crate) fn spawn_watchdog(sh: &Arc<Shared>) -> Result<(), String> {
    watch::spawn(sh, &sh.cpus.watch, sh.cpus.deadline, |sh: &Shared| {
        sh.stop(StopReason::Timeout)
    })
}

/// The maintenance that kicks every vCPU in `targets` that runs its guest
/// with no kick on the way, for the answer to the exit of the vCPU that
/// raised their interrupt: its own CPU sends the kick at EL2 as it
/// returns to its guest ([`INSN_KICK`]), no round trip to the service
/// CPU, as KVM's sender sends its IPI from its own CPU. A vCPU outside
/// its guest, or with a kick on the way, gets none.
pub(crate) fn kick_insns(
    watch: &Watch,
    targets: impl IntoIterator<Item = usize>,
) -> Vec<(u64, u64)> {
    let mut lists = std::collections::BTreeMap::<u64, u64>::new();
    for t in targets {
        if watch.claim_kick(t) {
            *lists.entry(t as u64 / 16).or_default() |= 1 << (t % 16);
        }
    }
    lists
        .into_iter()
        .map(|(aff1, list)| (INSN_KICK, KICK_SGI << 24 | aff1 << 16 | list))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write `v` of ICC_SGI1R_EL1 by vCPU `from`: the kicks it needs.
    fn sgi_write(gic: &Gic, watch: &Watch, from: usize, v: u64) -> Vec<(u64, u64)> {
        kick_insns(watch, crate::linux::gic_frames::raise_sgi(gic, from, v))
    }
    use crate::linux::gic::{Gic, GicAccess, GICR_STRIDE};

    /// ICC_SGI1R_EL1's IRM: every vCPU but the sender.
    const IRM: u64 = 1 << 40;

    /// A GIC of `n` vCPUs with every SGI enabled on each.
    fn gic(n: usize) -> Gic {
        let g = Gic::new(n);
        for v in 0..n as u64 {
            g.redist_access(GicAccess {
                offset: v * GICR_STRIDE + 0x1_0100,
                size: 4,
                write: Some(0xffff),
            });
        }
        g
    }

    /// The vCPUs a maintenance list kicks.
    fn kicked(insns: &[(u64, u64)]) -> Vec<usize> {
        let mut v = Vec::new();
        for &(insn, sgi1r) in insns {
            assert_eq!(insn, INSN_KICK);
            assert_eq!(sgi1r >> 24 & 0xf, KICK_SGI);
            let aff1 = (sgi1r >> 16 & 0xff) as usize;
            v.extend(
                (0..16)
                    .filter(|b| sgi1r & 1 << b != 0)
                    .map(|b| aff1 * 16 + b),
            );
        }
        v
    }

    /// What is pending and enabled for each vCPU.
    fn pending(g: &Gic) -> Vec<bool> {
        (0..g.vcpus()).map(|v| g.has_pending(v)).collect()
    }

    #[test]
    fn a_listed_sgi_kicks_only_its_target_and_leaves_the_others_in_their_guest() {
        let (g, w) = (gic(4), Watch::new(4));
        for v in 0..4 {
            w.enter(v);
        }
        assert_eq!(kicked(&sgi_write(&g, &w, 0, 3 << 24 | 0b0100)), [2]);
        assert_eq!(pending(&g), [false, false, true, false]);
        // vCPUs 0, 1 and 3 were not stopped: each still needs its own kick.
        for v in [0, 1, 3] {
            assert!(w.claim_kick(v), "vCPU {v} was kicked");
        }
        assert!(!w.claim_kick(2), "vCPU 2's kick is on the way");
    }

    #[test]
    fn a_broadcast_kicks_its_running_targets_once_and_queues_for_the_others() {
        let (g, w) = (gic(4), Watch::new(4));
        // vCPUs 0 (the sender) and 2 run their guest; 1 and 3 are in the host.
        w.enter(0);
        w.enter(2);
        assert_eq!(kicked(&sgi_write(&g, &w, 0, IRM | 5 << 24)), [2]);
        assert_eq!(pending(&g), [false, true, true, true], "queued for 1 and 3");
        assert!(w.claim_kick(0), "the sender, no target, was not kicked");
        // A second broadcast while vCPU 2's kick is on the way: none more.
        assert_eq!(
            kicked(&sgi_write(&g, &w, 0, IRM | 6 << 24)),
            Vec::<usize>::new()
        );
        // vCPU 3 enters its guest: the next SGI to it needs a kick, and
        // the one queued is in its list registers at that entry.
        w.enter(3);
        assert_eq!(kicked(&sgi_write(&g, &w, 1, IRM | 7 << 24)), [3]);
        let mut lrs = [0; crate::linux::gic::NR_LRS];
        g.sync_lrs(3, &mut lrs);
        let mut ids: Vec<u64> = lrs
            .iter()
            .filter(|&&l| l != 0)
            .map(|l| l & 0xffff_ffff)
            .collect();
        ids.sort_unstable();
        assert_eq!(ids, [5, 6, 7], "every SGI queued for vCPU 3 arrived once");
    }

    #[test]
    fn an_sgi_to_no_vcpu_kicks_nothing() {
        let (g, w) = (gic(2), Watch::new(2));
        w.enter(0);
        w.enter(1);
        // Another cluster (Aff1 = 1), and a list naming only vCPUs beyond 2.
        assert_eq!(
            kicked(&sgi_write(&g, &w, 0, 1 << 16 | 0b11)),
            Vec::<usize>::new()
        );
        assert_eq!(kicked(&sgi_write(&g, &w, 0, 0b1100)), Vec::<usize>::new());
        assert_eq!(pending(&g), [false, false]);
        assert!(w.claim_kick(0) && w.claim_kick(1));
    }
}
