//! The simulated source guest: built from [`SimGuestConfig`], its vCPU
//! threads running the workload, migrated through
//! [`crate::session::source::run_source`].

use super::state::{decode_vcpus, workload_config, GuestState};
use super::SimVm;
use crate::hash::{digest_of, page_hash};
use crate::session::extras::SourceExtras;
use crate::session::guest::{GuestShape, SourceGuest};
use crate::session::postcopy::{Final, Postcopy};
use crate::session::replies::Connect;
use crate::session::source::{run_source, Harvest, SourceConfig, SourceOutcome};
use crate::stream_error::MigrateError;
use crate::vm::{GuestCounters, GuestRun, SessionVm};
use crate::wire::PAGE_SIZE;
use s2mmu::format::arm64::Arm64Stage2;
use s2mmu::format::FormatId;
use s2mmu::format::WithFormat;
use s2mmu::memslot::TreeMemslots;
use s2mmu::mmu::{DirtyMode, MmuPolicy, Protect};
use s2mmu_vm::{
    replay_writes, Backing, KnownFormat, Pattern, Vm, VmConfig, Workload, WorkloadConfig,
};
use std::collections::HashMap;
use std::sync::Arc;

/// Accesses of one vCPU the post-copy verification replays at most.
const MAX_REPLAY_ACCESSES: u64 = 1 << 28;

/// The simulated source guest's description.
#[derive(Clone, Debug)]
pub struct SimGuestConfig {
    /// Bytes of guest memory.
    pub mem_size: u64,
    /// vCPUs running the workload.
    pub vcpus: usize,
    /// How guest memory is backed.
    pub backing: Backing,
    /// Memslots.
    pub slots: u32,
    /// The MMU's policy (its dirty mode is `dirty`'s, see
    /// [`source_policy`]).
    pub policy: MmuPolicy,
    /// The engine's dirty-log mode, any of them (the session's harvest
    /// follows from it: [`session_harvest`]).
    pub dirty: DirtyMode,
    /// Bytes per second the whole guest dirties (0: as fast as it can).
    pub dirty_rate: u64,
    /// The guest's access pattern.
    pub pattern: Pattern,
    /// The stage-2 format of the guest's tables (arm64 or x86 EPT).
    pub format: FormatId,
    /// The lost-write check and snapshots this guest runs beside its
    /// migration (its [`crate::session::guest::RoundHook`]).
    pub extras: SourceExtras,
}

impl Default for SimGuestConfig {
    fn default() -> Self {
        SimGuestConfig {
            mem_size: 1 << 30,
            vcpus: 2,
            backing: Backing::AnonymousThp,
            slots: 1,
            policy: MmuPolicy::default(),
            dirty: DirtyMode::WP,
            dirty_rate: 64 << 20,
            pattern: Pattern::Sequential,
            format: FormatId::of::<Arm64Stage2>(),
            extras: SourceExtras::default(),
        }
    }
}

impl SimGuestConfig {
    /// What the stream's header says about this guest.
    pub fn shape(&self) -> GuestShape {
        GuestShape {
            mem_size: self.mem_size,
            slots: self.slots,
            vcpus: u32::try_from(self.vcpus).unwrap_or(u32::MAX),
            backing: self.backing.name().to_string(),
            format: self.format,
        }
    }
}

/// The policy the source's VM runs with: the guest's, with its dirty mode
/// under manual protect (nothing initially set, so the first round sends
/// all memory and logs what changes meanwhile).
pub fn source_policy(g: &SimGuestConfig) -> MmuPolicy {
    MmuPolicy {
        dirty: g.dirty.with_protect(Protect::MANUAL),
        ..g.policy
    }
}

/// How the session collects what `mode` logs: reaping rings for the ring
/// mode, GET and CLEAR of bitmaps for every other (write protection,
/// hardware dirty state, PML).
pub fn session_harvest(mode: DirtyMode) -> Harvest {
    if mode.ring_entries().is_some() {
        Harvest::Ring
    } else {
        Harvest::Bitmap
    }
}

/// A simulated guest and how to migrate it: what [`migrate_source`] and
/// [`super::in_process::migrate_in_process`] take. The guest's description
/// and the session's settings stay apart; this only carries both.
#[derive(Clone, Debug, Default)]
pub struct SimRun {
    /// The guest.
    pub guest: SimGuestConfig,
    /// The session's policy and presentation.
    pub session: SourceConfig,
}

impl SimRun {
    /// This run with `f` applied to its guest and session settings.
    #[must_use]
    pub fn with(mut self, f: impl FnOnce(&mut SimGuestConfig, &mut SourceConfig)) -> Self {
        f(&mut self.guest, &mut self.session);
        self
    }
}

/// A running simulated source guest.
pub struct SimSource<F: KnownFormat> {
    vm: Arc<SimVm<F>>,
    wl: Workload<TreeMemslots, F>,
    wl_cfg: WorkloadConfig,
    shape: GuestShape,
    extras: SourceExtras,
}

/// Runs the source side on a simulated guest built from `run.guest`:
/// [`run_source`] once it runs.
///
/// # Errors
/// [`run_source`]'s; [`MigrateError::Setup`] when the guest is out of
/// bounds or cannot start.
pub fn migrate_source(
    run: &SimRun,
    connect: &mut Connect<'_>,
) -> Result<SourceOutcome, MigrateError> {
    validate_run(run)?;
    let (guest, cfg) = (&run.guest, &run.session);
    /// The source on the format's type.
    struct Source<'a, 'c>(&'a SimGuestConfig, &'a SourceConfig, &'a mut Connect<'c>);
    impl WithFormat for Source<'_, '_> {
        type Output = Result<SourceOutcome, MigrateError>;
        fn call<F: KnownFormat>(self) -> Self::Output {
            let Source(guest, cfg, connect) = self;
            SimSource::<F>::start(guest, cfg).and_then(|g| run_source(&g, cfg, connect))
        }
    }
    guest.format.with(Source(guest, cfg, connect))
}

/// Checks `run`'s guest and session settings before anything starts.
///
/// # Errors
/// [`MigrateError::Setup`] naming what is out of bounds.
pub(crate) fn validate_run(run: &SimRun) -> Result<(), MigrateError> {
    crate::session::source::validate_shape(&run.guest.shape())?;
    crate::session::source::validate(&run.session)?;
    let x = &run.guest.extras;
    if run.session.postcopy != Postcopy::Off && (x.check || x.snapshot_every.is_some()) {
        return Err(MigrateError::Setup(
            "post-copy with the lost-write check or snapshots (`SourceExtras::check`, `snapshot_every`): both check and snapshot the source's memory round by round to the stop, and after a post-copy switch the memory is split between the hosts (not supported together)".into(),
        ));
    }
    x.validate(run.session.harvest)
}

impl<F: KnownFormat> SimSource<F> {
    /// Creates the guest and its workload, touches every page once (the
    /// guest has been running) and lets it run free at its pace.
    ///
    /// # Errors
    /// [`MigrateError::Setup`] when the session's harvest is not the one
    /// the guest's dirty mode needs, or the guest or its vCPUs cannot start.
    pub fn start(g: &SimGuestConfig, cfg: &SourceConfig) -> Result<Self, MigrateError> {
        if cfg.harvest != session_harvest(g.dirty) {
            return Err(MigrateError::Setup(format!(
                "the session harvests {:?} but the guest's dirty mode is {}",
                cfg.harvest,
                g.dirty.name()
            )));
        }
        let page = PAGE_SIZE as u64;
        let vm = Arc::new(
            Vm::<TreeMemslots, F>::new(VmConfig {
                mem_size: g.mem_size,
                backing: g.backing,
                slots: g.slots,
                gpa_base: 1 << 32,
                policy: source_policy(g),
                ..VmConfig::default()
            })
            .map_err(|e| MigrateError::Setup(format!("source guest: {e}")))?,
        );
        let wl_cfg = WorkloadConfig {
            bytes_per_vcpu: g.mem_size / g.vcpus as u64 / page * page,
            write_percent: 100,
            pattern: g.pattern,
            page_size: page,
        };
        let wl = Workload::start(vm.clone(), g.vcpus, wl_cfg).map_err(MigrateError::Setup)?;
        // The guest has been running: every page touched once.
        wl.run_pass(|| {}).map_err(MigrateError::Setup)?;
        // 0 is unpaced: a rate below a page per second per vCPU is one.
        let pace = match g.dirty_rate {
            0 => 0,
            r => (r / page / g.vcpus as u64).max(1),
        };
        wl.set_pace(pace);
        wl.run_free();
        Ok(SimSource {
            vm: Arc::new(SimVm::new(vm)),
            wl,
            wl_cfg,
            shape: g.shape(),
            extras: g.extras.clone(),
        })
    }
}

impl<F: KnownFormat> GuestRun for SimSource<F> {
    fn pause(&self) {
        GuestRun::pause(&self.wl);
    }

    fn request_pause(&self) {
        GuestRun::request_pause(&self.wl);
    }

    fn resume(&self) {
        GuestRun::resume(&self.wl);
    }

    fn counters(&self) -> GuestCounters {
        GuestRun::counters(&self.wl)
    }

    fn set_throttle_ns(&self, ns: u64) {
        self.wl.set_throttle_ns(ns);
    }

    fn pace(&self) -> u64 {
        GuestRun::pace(&self.wl)
    }

    fn set_pace(&self, pages_per_sec: u64) {
        self.wl.set_pace(pages_per_sec);
    }
}

impl<F: KnownFormat> SourceGuest for SimSource<F> {
    type Vm = SimVm<F>;
    type Hook = super::extras::ExtrasRun<F>;

    fn vm(&self) -> &Arc<SimVm<F>> {
        &self.vm
    }

    fn shape(&self) -> GuestShape {
        self.shape.clone()
    }

    fn counter_source(&self) -> Arc<dyn Fn() -> GuestCounters + Send + Sync> {
        super::counter_source(self.wl.control().clone())
    }

    fn state(&self, pace: u64) -> Result<Vec<u8>, MigrateError> {
        Ok(GuestState {
            bytes_per_vcpu: self.wl_cfg.bytes_per_vcpu,
            write_percent: self.wl_cfg.write_percent,
            pattern: u8::from(self.wl_cfg.pattern == Pattern::Random),
            pace_pages_per_sec: pace,
            vcpus: self.wl.vcpu_states(),
        }
        .encode())
    }

    fn begin_hook(&self) -> Result<Self::Hook, MigrateError> {
        super::extras::begin(&self.extras, self.vm.vm())
    }

    fn supports_postcopy(&self) -> bool {
        true
    }

    fn verify_final(&self, state: &[u8], fin: &Final) -> Result<Vec<(u16, u64)>, MigrateError> {
        let state = GuestState::decode(state, 0)?;
        verify(&self.vm, &state, fin)
    }
}

/// Checks FINAL: the destination's memory must be this (frozen) memory
/// plus exactly the writes its guest made from `state` to FINAL's vCPU
/// states, slot by slot. Returns the digests that agreed.
///
/// # Errors
/// [`MigrateError::MemoryMismatch`].
pub fn verify<F: KnownFormat>(
    vm: &SimVm<F>,
    state: &GuestState,
    fin: &Final,
) -> Result<Vec<(u16, u64)>, MigrateError> {
    let mismatch = |slot, detail| MigrateError::MemoryMismatch { slot, detail };
    let fin_vcpus =
        decode_vcpus(&fin.state).map_err(|e| mismatch(0, format!("FINAL's vCPU states: {e}")))?;
    if fin_vcpus.len() != state.vcpus.len() {
        return Err(mismatch(
            0,
            format!(
                "FINAL carries {} vCPU states, the guest has {}",
                fin_vcpus.len(),
                state.vcpus.len()
            ),
        ));
    }
    let cfg = workload_config(state);
    // The destination guest's writes: the last value of every word, by
    // page.
    let mut overlay: HashMap<u64, HashMap<u64, u64>> = HashMap::new();
    let base = vm.gpa_base();
    for (v, (from, to)) in state.vcpus.iter().zip(&fin_vcpus).enumerate() {
        replay_writes(
            &cfg,
            v,
            base + v as u64 * cfg.bytes_per_vcpu,
            *from,
            *to,
            MAX_REPLAY_ACCESSES,
            |gpa, value| {
                let page = gpa & !(PAGE_SIZE as u64 - 1);
                overlay.entry(page).or_default().insert(gpa - page, value);
            },
        )
        .map_err(|why| mismatch(0, format!("the destination's vCPU states: {why}")))?;
    }
    let mut buf = vec![0u8; PAGE_SIZE];
    let mut digests = Vec::new();
    for s in vm.slots() {
        let n = s.size / PAGE_SIZE as u64;
        let hashes: Vec<u64> = (0..n)
            .map(|i| {
                let gpa = s.gpa + i * PAGE_SIZE as u64;
                vm.vm()
                    .memory()
                    .read_into(s.mem_offset + i * PAGE_SIZE as u64, &mut buf);
                if let Some(words) = overlay.get(&gpa) {
                    for (&off, &v) in words {
                        let o = off as usize;
                        if o + 8 <= PAGE_SIZE {
                            buf[o..o + 8].copy_from_slice(&v.to_le_bytes());
                        }
                    }
                }
                page_hash(&buf, gpa)
            })
            .collect();
        let want = digest_of(&hashes);
        match fin.digests.iter().find(|(id, _)| *id == s.id) {
            Some((_, got)) if *got == want => digests.push((s.id, want)),
            Some((_, got)) => {
                return Err(mismatch(
                    s.id,
                    format!(
                        "source memory at the stop plus the destination guest's writes has digest {want:#018x}, the destination {got:#018x}"
                    ),
                ))
            }
            None => {
                return Err(mismatch(
                    s.id,
                    "the destination reported no digest for it".into(),
                ))
            }
        }
    }
    Ok(digests)
}

/// [`migrate_source`] to `addr` (`unix:PATH`: a Unix socket, a same-host
/// upgrade) secured as `net` says; after a post-copy `recover ADDR` on the
/// control socket, to the operator's address.
///
/// # Errors
/// As [`migrate_source`], and connecting or securing a connection.
pub fn migrate_source_to(
    run: &SimRun,
    addr: &str,
    net: &crate::transport::NetConfig,
) -> Result<SourceOutcome, MigrateError> {
    use crate::transport::{client, connect};
    migrate_source(run, &mut |_| {
        let control = run.session.recovery.control.as_ref();
        let to = control.and_then(|c| c.redirect());
        client(connect(to.as_deref().unwrap_or(addr), net)?, net)
    })
}
