//! The writer guest's destination ([`super::writer`]): a blank guest of
//! the same layout that takes the stream, restores the state, reads it
//! back through KVM for the caller to compare, and runs on.

use super::cpu_state::KvmState;
use super::session_vm::{KvmDirtyLog, KvmVm, NewVcpus};
use super::vcpus::{ExitHandler, KvmVcpus};
use super::writer::{exits, fresh_vm, layout, state_err, wire_format, WriterGuest};
use kvm_ioctls::VcpuExit;
use s2mmu_migrate::session::dest::{DestFactory, DestGuest, ResumedGuest};
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::vm::{GuestRun, SessionVm};
use s2mmu_migrate::wire::Header;
use std::sync::{Arc, Mutex};

/// What a destination's guest started from, and how it ran.
#[derive(Clone, Debug, Default)]
pub struct DestReport {
    /// Every page's hash before the vCPUs ran.
    pub hashes: Vec<u64>,
    /// The state as KVM holds it after the restore, before the vCPUs ran.
    pub state: KvmState,
    /// Why vCPUs stopped on their own since (a failed state check).
    pub errors: Vec<String>,
}

/// Filled when the destination's guest starts.
pub type Started = Arc<Mutex<Option<DestReport>>>;

/// The destination's factory: a blank guest of the same layout.
pub struct WriterDest {
    /// The dirty log the destination's VM keeps (for a later migration).
    pub log: KvmDirtyLog,
    /// Filled when the guest starts.
    pub started: Started,
    /// A planted fault for tests: the destination drops every vCPU's
    /// XSAVE area from the decoded state, so it is not restored (the
    /// guest's SSE check must catch it).
    pub drop_xsave: bool,
}

/// A blank guest waiting for the stream.
pub struct BlankWriter {
    vm: Arc<KvmVm>,
    fds: Mutex<Option<NewVcpus>>,
    started: Started,
    drop_xsave: bool,
}

impl DestFactory for WriterDest {
    type Guest = BlankWriter;
    fn build(&self, h: &Header) -> Result<BlankWriter, MigrateError> {
        let size: u64 = layout().iter().map(|r| r.1).sum();
        if h.mem_size != size || h.slots != 3 || h.gpa_base != 0 {
            return Err(MigrateError::Setup(format!(
                "not the writer guest's shape: {h:?}"
            )));
        }
        if h.format != wire_format() {
            return Err(MigrateError::Setup(format!(
                "tables {:?}, not EPT",
                h.format
            )));
        }
        let setup = |e: crate::Error| MigrateError::Setup(e.to_string());
        let kvm = crate::open_kvm().map_err(setup)?;
        let (vm, fds) = fresh_vm(&kvm, self.log, h.vcpus).map_err(setup)?;
        Ok(BlankWriter {
            vm,
            fds: Mutex::new(Some(fds)),
            started: self.started.clone(),
            drop_xsave: self.drop_xsave,
        })
    }
}

/// The writer's exits, with each vCPU's failure also in `started`.
fn reporting_exits(started: Started) -> Arc<ExitHandler> {
    let inner = exits();
    Arc::new(move |i, exit: &VcpuExit<'_>| {
        inner(i, exit).inspect_err(|why| {
            let mut s = started.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(r) = s.as_mut() {
                r.errors.push(format!("vCPU {i}: {why}"));
            }
        })
    })
}

impl DestGuest for BlankWriter {
    type Vm = KvmVm;
    type State = KvmState;
    type Running = WriterGuest;
    fn vm(&self) -> &Arc<KvmVm> {
        &self.vm
    }
    fn decode_state(&self, body: &[u8], h: &Header, _: u64) -> Result<KvmState, MigrateError> {
        let mut st = KvmState::decode(body, h.vcpus as usize).map_err(state_err)?;
        if self.drop_xsave {
            st.vcpus.iter_mut().for_each(|v| v.fpu = None);
        }
        Ok(st)
    }
    fn start(&self, state: &KvmState) -> Result<WriterGuest, MigrateError> {
        let fds = self.fds.lock().unwrap_or_else(|p| p.into_inner()).take();
        let fds = fds.ok_or_else(|| state_err("the guest was started already"))?;
        let handler = reporting_exits(self.started.clone());
        let vcpus = KvmVcpus::start(fds, Some(state), handler, true).map_err(state_err)?;
        let back = vcpus.save().map_err(state_err)?;
        *self.started.lock().unwrap_or_else(|p| p.into_inner()) = Some(DestReport {
            hashes: self.vm.ram().page_hashes(),
            state: back,
            errors: Vec::new(),
        });
        vcpus.resume();
        Ok(WriterGuest {
            vm: self.vm.clone(),
            vcpus,
            sent: Mutex::new(None),
            report: Some(reporter(self.started.clone())),
        })
    }
}

impl ResumedGuest for WriterGuest {
    /// The state KVM holds now; a failure to read or encode it goes to
    /// the destination's report ([`DestReport::errors`]), naming the
    /// ioctl or part, and the FINAL carries no state.
    fn final_state(&self) -> Vec<u8> {
        let st = self.vcpus.save().map_err(|e| e.to_string());
        final_bytes(st, self.report.as_deref())
    }
    fn progress(&self) -> Vec<u64> {
        self.vcpus.passes()
    }
}

/// Pushes a reason into `started`'s errors.
fn reporter(started: Started) -> Arc<dyn Fn(String) + Send + Sync> {
    Arc::new(move |why| {
        let mut s = started.lock().unwrap_or_else(|p| p.into_inner());
        s.get_or_insert_with(DestReport::default).errors.push(why);
    })
}

/// `st` encoded, or nothing with the reason given to `report` (as
/// "final state: ...").
fn final_bytes(
    st: Result<KvmState, String>,
    report: Option<&(dyn Fn(String) + Send + Sync)>,
) -> Vec<u8> {
    match st.and_then(|s| s.encode().map_err(|e| e.to_string())) {
        Ok(b) => b,
        Err(why) => {
            if let Some(report) = report {
                report(format!("final state: {why}"));
            }
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migrate::cpu_state::VcpuState;

    #[test]
    fn a_final_state_that_fails_reports_its_cause() {
        let started: Started = Arc::default();
        let ioctl = Err("KVM_GET_LAPIC failed: Invalid argument".to_string());
        let report = reporter(started.clone());
        assert!(final_bytes(ioctl, Some(&*report)).is_empty());
        let partless = KvmState {
            vcpus: vec![VcpuState::default()],
            ..KvmState::default()
        };
        assert!(final_bytes(Ok(partless), Some(&*report)).is_empty());
        let errors = started.lock().unwrap().take().unwrap().errors;
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].contains("KVM_GET_LAPIC"), "{errors:?}");
        assert!(errors[1].contains("no xsave/fpu part"), "{errors:?}");
        // A state that encodes is the FINAL's, and reports nothing.
        let ok = final_bytes(Ok(KvmState::default()), Some(&*report));
        assert!(KvmState::decode(&ok, 0).is_ok());
        assert!(started.lock().unwrap().is_none());
    }
}
