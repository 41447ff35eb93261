//! The test faults a Linux destination can be asked for through the
//! environment: a destination killed on purpose at a chosen point of a
//! migration, so the tests of a failure there need no sleep race. Both
//! sides' session code uses it (the source's VM wraps its page fetch in
//! post-copy, the destination reads it at STATE), so it sits below both.

use s2mmu_arm64::linux::page_fetch::PageFetch;
use s2mmu_arm64::machine::Machine;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The environment variable that makes a destination fail on purpose
/// once its whole stream has arrived (every channel's END, so after the
/// source paused its guest for the stop-and-copy) and before its guest
/// resumes: `exit` ends this process with SIGKILL, `kill-qemu` kills the
/// destination's QEMU machine. The tests of a failure timed into the
/// stop-and-copy set it. `exit-in-postcopy` and `kill-qemu-in-postcopy`
/// do the same in post-copy instead, once the resumed guest's first
/// missing page was fetched from the source (the memory is split then:
/// see [`with_postcopy_fault`]). Another value is logged and ignored
/// (`session_dest` reads it at STATE).
pub(super) const FAULT_AT_STATE: &str = "S2MMU_TEST_DEST_FAULT_AT_STATE";

/// [`FAULT_AT_STATE`]'s values that fire in post-copy.
pub(super) const EXIT_IN_POSTCOPY: &str = "exit-in-postcopy";
pub(super) const KILL_QEMU_IN_POSTCOPY: &str = "kill-qemu-in-postcopy";

/// Ends this process as a kill from outside would.
pub(super) fn kill_self() -> ! {
    // SAFETY: kill(2) on this process has no memory effects; the
    // process ends at once, as a kill from outside would end it.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    std::process::exit(137);
}

/// The session's `fetch` as the VM's post-copy hook; with
/// [`FAULT_AT_STATE`] set to `exit-in-postcopy` or `kill-qemu-in-postcopy`
/// a hook that kills this process or `machine`'s QEMU right after the
/// first page it had to fetch from the source has arrived: the guest has
/// resumed here and runs on pages only this host holds.
pub(super) fn with_postcopy_fault(
    fetch: Arc<dyn PageFetch>,
    machine: &Arc<Machine>,
) -> Arc<dyn PageFetch> {
    let fault = match std::env::var(FAULT_AT_STATE).as_deref() {
        Ok(EXIT_IN_POSTCOPY) => Some(None),
        Ok(KILL_QEMU_IN_POSTCOPY) => Some(Some(machine.clone())),
        _ => None,
    };
    Arc::new(FaultAfterFetch {
        fetch,
        fault,
        fired: AtomicBool::new(false),
    })
}

/// The hook [`with_postcopy_fault`] makes: with a fault asked for, kills
/// the QEMU machine if given, else this process.
struct FaultAfterFetch {
    fetch: Arc<dyn PageFetch>,
    fault: Option<Option<Arc<Machine>>>,
    fired: AtomicBool,
}

impl PageFetch for FaultAfterFetch {
    fn fetch(&self, vcpu: usize, gpa: u64) -> Result<bool, String> {
        let waited = self.fetch.fetch(vcpu, gpa)?;
        let Some(kill_qemu) = &self.fault else {
            return Ok(waited);
        };
        if !waited || self.fired.swap(true, Ordering::SeqCst) {
            return Ok(waited);
        }
        let Some(m) = kill_qemu else {
            eprintln!(
                "s2mmu: {FAULT_AT_STATE}={EXIT_IN_POSTCOPY}: the destination process is killed \
                 in post-copy, after its first fetched page (IPA {gpa:#x})"
            );
            kill_self();
        };
        eprintln!(
            "s2mmu: {FAULT_AT_STATE}={KILL_QEMU_IN_POSTCOPY}: the destination's QEMU machine is \
             killed in post-copy, after its first fetched page (IPA {gpa:#x})"
        );
        m.kill_qemu();
        Ok(waited)
    }
}
