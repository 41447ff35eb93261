//! The simulated VM as a migration's destination: the factory that builds
//! it from a HEADER ([`SimDest`]), its STATE ([`GuestState`]) checked
//! before any vCPU starts, its resumed workload, and the entry points
//! that pick the simulated guest's format from [`SimDestConfig`].

use super::state::{encode_vcpus, workload_config, GuestState};
use super::SimVm;
use crate::session::dest::{
    receive_from_with, receive_with, serve_with, DestConfig, DestFactory, DestGuest, DestOutcome,
    ResumedGuest,
};
use crate::stream_error::MigrateError;
use crate::transport::{Listener, NetConfig};
use crate::wire::{Header, PAGE_SIZE};
use s2mmu::format::FormatId;
use s2mmu::format::WithFormat;
use s2mmu::memslot::TreeMemslots;
use s2mmu::mmu::{DirtyMode, MmuPolicy};
use s2mmu_vm::{Backing, KnownFormat, Vm, VmConfig, Workload};
use std::io::{Read, Write};
use std::marker::PhantomData;
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Builds the simulated destination guest on stage-2 format `F` with the
/// destination's own MMU policy.
pub struct SimDest<F: KnownFormat> {
    /// The destination MMU's policies.
    pub policy: MmuPolicy,
    /// `F`'s code on the wire: a stream from another format is refused.
    pub format: FormatId,
    _format: PhantomData<fn() -> F>,
}

impl<F: KnownFormat> SimDest<F> {
    /// A factory for guests on `F` (whose wire code is `format`).
    pub fn new(policy: MmuPolicy, format: FormatId) -> Self {
        SimDest {
            policy,
            format,
            _format: PhantomData,
        }
    }
}

/// How a simulated destination runs: the guest's own description (its
/// MMU policy and stage-2 format) beside the session's [`DestConfig`].
#[derive(Clone, Debug)]
pub struct SimDestConfig {
    /// The destination MMU's policies.
    pub policy: MmuPolicy,
    /// The stage-2 format the guest runs on: a stream from a source on
    /// another one is refused ([`MigrateError::FormatMismatch`]).
    pub format: FormatId,
    /// The session's settings.
    pub dest: DestConfig,
}

impl SimDestConfig {
    /// A simulated destination on the arm64 format with `policy` that
    /// runs the resumed guest for `run_after` and accepts what this build
    /// can take.
    pub fn new(policy: MmuPolicy, run_after: Duration) -> Self {
        SimDestConfig {
            policy,
            format: FormatId::of::<s2mmu::format::arm64::Arm64Stage2>(),
            dest: DestConfig::with_run_after(run_after),
        }
    }

    /// The factory that builds this guest on `F`.
    pub fn factory<F: KnownFormat>(&self) -> SimDest<F> {
        SimDest::new(self.policy, self.format)
    }
}

/// The simulated destination guest: its VM, not running until
/// [`DestGuest::start`].
pub struct SimDestGuest<F: KnownFormat> {
    vm: Arc<SimVm<F>>,
}

impl<F: KnownFormat> DestFactory for SimDest<F> {
    type Guest = SimDestGuest<F>;

    fn build(&self, header: &Header) -> Result<SimDestGuest<F>, MigrateError> {
        Backing::parse(&header.backing).map_err(MigrateError::Setup)?;
        if header.format != self.format {
            return Err(MigrateError::FormatMismatch {
                stream: header.format.name(),
                destination: self.format.name(),
            });
        }
        let vm = Arc::new(build_vm::<F>(header, self.policy)?);
        Ok(SimDestGuest {
            vm: Arc::new(SimVm::new(vm)),
        })
    }
}

impl<F: KnownFormat> DestGuest for SimDestGuest<F> {
    type Vm = SimVm<F>;
    type State = GuestState;
    type Running = Workload<TreeMemslots, F>;

    fn vm(&self) -> &Arc<SimVm<F>> {
        &self.vm
    }

    fn decode_state(
        &self,
        body: &[u8],
        header: &Header,
        at_byte: u64,
    ) -> Result<GuestState, MigrateError> {
        let s = GuestState::decode(body, at_byte)?;
        check_state(&s, header)?;
        Ok(s)
    }

    fn start(&self, state: &GuestState) -> Result<Workload<TreeMemslots, F>, MigrateError> {
        start_workload(self.vm.vm(), state)
    }
}

impl<F: KnownFormat> ResumedGuest for Workload<TreeMemslots, F> {
    fn final_state(&self) -> Vec<u8> {
        encode_vcpus(&self.vcpu_states())
    }

    fn progress(&self) -> Vec<u64> {
        self.vcpu_states().iter().map(|s| s.pass).collect()
    }
}

/// [`serve_with`] into the simulated guest `cfg.format` and `cfg.policy`
/// describe, as `cfg.dest` says.
///
/// # Errors
/// As [`serve_with`].
pub fn serve(
    listener: &dyn Listener,
    cfg: &SimDestConfig,
    net: &NetConfig,
) -> Result<DestOutcome, MigrateError> {
    /// [`serve_with`] on the format's type.
    struct Serve<'a>(&'a dyn Listener, &'a SimDestConfig, &'a NetConfig);
    impl WithFormat for Serve<'_> {
        type Output = Result<DestOutcome, MigrateError>;
        fn call<F: KnownFormat>(self) -> Self::Output {
            let Serve(listener, cfg, net) = self;
            serve_with(listener, &cfg.factory::<F>(), &cfg.dest, net)
        }
    }
    cfg.format.with(Serve(listener, cfg, net))
}

/// [`receive_from_with`] into the simulated guest `cfg` describes.
///
/// # Errors
/// As [`receive_from_with`].
pub fn receive_from<R: Read + Send, W: Write + Send>(
    input: R,
    reply: W,
    cfg: &SimDestConfig,
) -> Result<DestOutcome, MigrateError> {
    /// [`receive_from_with`] on the format's type.
    struct ReceiveFrom<'a, R, W>(R, W, &'a SimDestConfig);
    impl<R: Read + Send, W: Write + Send> WithFormat for ReceiveFrom<'_, R, W> {
        type Output = Result<DestOutcome, MigrateError>;
        fn call<F: KnownFormat>(self) -> Self::Output {
            let ReceiveFrom(input, reply, cfg) = self;
            receive_from_with(input, reply, &cfg.factory::<F>(), &cfg.dest)
        }
    }
    cfg.format.with(ReceiveFrom(input, reply, cfg))
}

/// [`receive_with`] into the simulated guest `cfg` describes.
///
/// # Errors
/// As [`receive_from_with`].
pub fn receive(stream: TcpStream, cfg: &SimDestConfig) -> Result<DestOutcome, MigrateError> {
    /// [`receive_with`] on the format's type.
    struct Receive<'a>(TcpStream, &'a SimDestConfig);
    impl WithFormat for Receive<'_> {
        type Output = Result<DestOutcome, MigrateError>;
        fn call<F: KnownFormat>(self) -> Self::Output {
            let Receive(stream, cfg) = self;
            receive_with(stream, &cfg.factory::<F>(), &cfg.dest)
        }
    }
    cfg.format.with(Receive(stream, cfg))
}

/// The destination's VM: the source's geometry with the destination's
/// own MMU policy.
///
/// # Errors
/// [`MigrateError::Setup`].
pub fn build_vm<F: KnownFormat>(
    h: &Header,
    policy: MmuPolicy,
) -> Result<Vm<TreeMemslots, F>, MigrateError> {
    let backing = Backing::parse(&h.backing).map_err(MigrateError::Setup)?;
    Vm::new(VmConfig {
        mem_size: h.mem_size,
        backing,
        slots: h.slots,
        gpa_base: h.gpa_base,
        // The destination does not log dirty pages.
        policy: MmuPolicy {
            dirty: DirtyMode::WP,
            ..policy
        },
        ..VmConfig::default()
    })
    .map_err(|e| MigrateError::Setup(format!("destination guest: {e}")))
}

/// Checks the vCPU state against the header before any vCPU starts.
fn check_state(s: &GuestState, h: &Header) -> Result<(), MigrateError> {
    let bad = |why: String| Err(MigrateError::BadState { why });
    let n = s.vcpus.len() as u64;
    if n != u64::from(h.vcpus) {
        return bad(format!(
            "{n} vCPUs in STATE, the header announced {}",
            h.vcpus
        ));
    }
    if s.write_percent > 100 || s.pattern > 1 {
        return bad(format!(
            "write percent {} (at most 100), pattern {} (0 or 1)",
            s.write_percent, s.pattern
        ));
    }
    let page = PAGE_SIZE as u64;
    if s.bytes_per_vcpu < page || !s.bytes_per_vcpu.is_multiple_of(page) {
        return bad(format!(
            "vCPU regions of {} bytes (whole pages)",
            s.bytes_per_vcpu
        ));
    }
    match s.bytes_per_vcpu.checked_mul(n) {
        Some(need) if need <= h.mem_size => {}
        _ => {
            return bad(format!(
                "{n} vCPU regions of {} bytes do not fit {} bytes of guest memory",
                s.bytes_per_vcpu, h.mem_size
            ))
        }
    }
    let pages = s.bytes_per_vcpu / page;
    if let Some((i, v)) = s
        .vcpus
        .iter()
        .enumerate()
        .find(|(_, v)| v.pass == 0 || v.next_page > pages)
    {
        return bad(format!(
            "vCPU {i} at pass {}, page {} of a {pages}-page region",
            v.pass, v.next_page
        ));
    }
    Ok(())
}

/// Resume: the vCPUs continue from the transferred state, paced as on the
/// source.
pub(crate) fn start_workload<F: KnownFormat>(
    vm: &Arc<Vm<TreeMemslots, F>>,
    state: &GuestState,
) -> Result<Workload<TreeMemslots, F>, MigrateError> {
    let wl = Workload::start_at(vm.clone(), workload_config(state), &state.vcpus)
        .map_err(|why| MigrateError::BadState { why })?;
    wl.control()
        .pace_pages_per_sec
        .store(state.pace_pages_per_sec, Ordering::Relaxed);
    wl.run_free();
    Ok(wl)
}

/// Serves sources on `listener` until one migration succeeds, or
/// `attempts` of them failed; `failed` hears of each failure but the last
/// (failures so far, why). Connections that fail before they
/// authenticate never come back from [`serve`] (it logs them and goes
/// on): every failure here is an authenticated source's attempt.
///
/// # Errors
/// The last failure, with the count of failures (`attempts`).
pub fn serve_attempts(
    listener: &dyn Listener,
    cfg: &SimDestConfig,
    net: &NetConfig,
    attempts: u32,
    failed: &mut dyn FnMut(u32, &MigrateError),
) -> Result<DestOutcome, (u32, MigrateError)> {
    let mut failures = 0;
    loop {
        match serve(listener, cfg, net) {
            Ok(d) => return Ok(d),
            Err(e) => {
                failures += 1;
                if failures >= attempts {
                    return Err((failures, e));
                }
                failed(failures, &e);
            }
        }
    }
}
