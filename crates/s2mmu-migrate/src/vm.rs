//! The VM interface migration and snapshots run over, in the spirit of
//! cloud-hypervisor's `Pausable`, `Snapshottable` and `Migratable`: a VMM
//! that implements [`MigratableVm`] for its VM gets pre-copy migration
//! ([`crate::driver`]) and snapshots ([`crate::snapshot`]) without the
//! library knowing its vCPUs, devices or memory layout.

use std::fmt;

/// Bytes of one guest page as migration moves it.
pub const PAGE_SIZE: usize = 4096;

/// An error of the VM behind the interface, with its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmError {
    /// What failed, in the VM's words.
    pub what: String,
}

impl VmError {
    /// An error with text `what`.
    pub fn new(what: impl Into<String>) -> VmError {
        VmError { what: what.into() }
    }
}

impl fmt::Display for VmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)
    }
}

impl std::error::Error for VmError {}

/// A VM whose vCPUs can be stopped and started again.
pub trait Pausable {
    /// Stops every vCPU at an instruction boundary; devices stop raising
    /// interrupts into it. Memory and state are then stable.
    ///
    /// # Errors
    /// The VM's own (a vCPU that does not stop).
    fn pause(&mut self) -> Result<(), VmError>;

    /// Runs the vCPUs again (after [`Pausable::pause`], or for the first
    /// time after [`MigratableVm::restore_state`]). Returns once the first
    /// vCPU executes guest code again.
    ///
    /// # Errors
    /// The VM's own.
    fn resume(&mut self) -> Result<(), VmError>;
}

/// A VM that can be migrated or snapshotted: its memory as pages with a
/// dirty log, its vCPU and device state as bytes.
pub trait MigratableVm: Pausable {
    /// Guest pages of [`PAGE_SIZE`] bytes, numbered from 0.
    fn page_count(&self) -> u64;

    /// Starts dirty logging on all guest memory (every later write is in a
    /// later [`MigratableVm::harvest_dirty`]).
    ///
    /// # Errors
    /// The engine's.
    fn start_dirty_log(&mut self) -> Result<(), VmError>;

    /// Appends the pages written since the last harvest (or since
    /// logging started) to `out`, and re-arms the log for them.
    ///
    /// # Errors
    /// The engine's.
    fn harvest_dirty(&mut self, out: &mut Vec<u64>) -> Result<(), VmError>;

    /// Stops dirty logging.
    ///
    /// # Errors
    /// The engine's.
    fn stop_dirty_log(&mut self) -> Result<(), VmError>;

    /// Copies page `page` into `buf`.
    ///
    /// # Errors
    /// A page number out of range.
    fn read_page(&self, page: u64, buf: &mut [u8; PAGE_SIZE]) -> Result<(), VmError>;

    /// Writes page `page` (a paused or not yet started VM).
    ///
    /// # Errors
    /// A page number out of range.
    fn write_page(&mut self, page: u64, data: &[u8; PAGE_SIZE]) -> Result<(), VmError>;

    /// The vCPU and device state of a paused VM, encoded with
    /// [`crate::state::State`].
    ///
    /// # Errors
    /// The VM is not paused, or a vCPU's state cannot be read.
    fn save_state(&mut self) -> Result<Vec<u8>, VmError>;

    /// Loads a state [`MigratableVm::save_state`] made into a VM that has
    /// not run; it runs from it on [`Pausable::resume`]. Damaged or
    /// foreign state is refused (naming what is wrong) with the VM
    /// unchanged.
    ///
    /// # Errors
    /// The decoding's [`crate::state::StateError`] as text, or the VM's.
    fn restore_state(&mut self, state: &[u8]) -> Result<(), VmError>;

    /// A digest of all guest memory (the same content gives the same
    /// digest on every VM).
    ///
    /// # Errors
    /// The VM's.
    fn memory_digest(&self) -> Result<u64, VmError> {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        let mut buf = [0u8; PAGE_SIZE];
        for p in 0..self.page_count() {
            self.read_page(p, &mut buf)?;
            h.update(&buf);
        }
        Ok(h.digest())
    }

    /// Post-copy's hook: where the destination is to fetch a page its
    /// guest touched before the page arrived. `None` (the default): this
    /// VM supports pre-copy only.
    fn page_fetch_hook(&mut self) -> Option<&mut dyn PageFetch> {
        None
    }
}

/// Fetches a missing page on demand (post-copy).
pub trait PageFetch {
    /// Brings page `page` in before the faulting vCPU resumes.
    ///
    /// # Errors
    /// The transport's.
    fn fetch(&mut self, page: u64) -> Result<(), VmError>;
}
