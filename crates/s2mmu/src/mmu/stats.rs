//! Lock and fault counters.

/// Lock and fault counters of one vCPU (or of the VM-wide operations).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Faults fixed by the read-lock fast path.
    pub fast: u64,
    /// Faults handled under the write lock.
    pub slow: u64,
    /// Faults that found the mapping already fixed.
    pub spurious: u64,
    /// Faults that lost a race and returned to the guest to retry.
    pub retries: u64,
    /// Faults on unmapped addresses.
    pub translation: u64,
    /// Faults on mapped but write-protected addresses.
    pub permission: u64,
    /// Huge mappings split by a fault.
    pub splits_on_fault: u64,
    /// Pages newly marked dirty.
    pub dirtied: u64,
    /// Read-lock acquisitions.
    pub read_locks: u64,
    /// Read-lock acquisitions that had to wait.
    pub read_contended: u64,
    /// Write-lock acquisitions.
    pub write_locks: u64,
    /// Write-lock acquisitions that had to wait.
    pub write_contended: u64,
    /// Nanoseconds spent waiting for the lock.
    pub lock_wait_ns: u64,
    /// Nanoseconds spent splitting huge mappings (eager or on fault).
    pub split_ns: u64,
    /// Blocks made back from tables in place when logging stopped.
    pub collapsed: u64,
    /// Eager splits that stopped early (out of table memory): the rest of
    /// the slot is split on fault.
    pub eager_split_failures: u64,
    /// Huge-page recoveries (logging stopped) that stopped early (out of
    /// table memory): the rest of the slot keeps its page mappings.
    pub recovery_failures: u64,
    /// Page-modification-log-full exits ([`crate::mmu::DirtyMode::Pml`]):
    /// a write found the vCPU's log full, which was flushed before it went on.
    pub pml_full_exits: u64,
    /// Page-modification-log entries flushed into dirty bitmaps.
    pub pml_entries: u64,
}

impl FaultStats {
    /// The counts since `earlier` (a snapshot of the same counters).
    #[must_use]
    pub fn since(&self, earlier: &FaultStats) -> FaultStats {
        FaultStats {
            fast: self.fast.saturating_sub(earlier.fast),
            slow: self.slow.saturating_sub(earlier.slow),
            spurious: self.spurious.saturating_sub(earlier.spurious),
            retries: self.retries.saturating_sub(earlier.retries),
            translation: self.translation.saturating_sub(earlier.translation),
            permission: self.permission.saturating_sub(earlier.permission),
            splits_on_fault: self.splits_on_fault.saturating_sub(earlier.splits_on_fault),
            dirtied: self.dirtied.saturating_sub(earlier.dirtied),
            read_locks: self.read_locks.saturating_sub(earlier.read_locks),
            read_contended: self.read_contended.saturating_sub(earlier.read_contended),
            write_locks: self.write_locks.saturating_sub(earlier.write_locks),
            write_contended: self.write_contended.saturating_sub(earlier.write_contended),
            lock_wait_ns: self.lock_wait_ns.saturating_sub(earlier.lock_wait_ns),
            split_ns: self.split_ns.saturating_sub(earlier.split_ns),
            collapsed: self.collapsed.saturating_sub(earlier.collapsed),
            eager_split_failures: self
                .eager_split_failures
                .saturating_sub(earlier.eager_split_failures),
            recovery_failures: self
                .recovery_failures
                .saturating_sub(earlier.recovery_failures),
            pml_full_exits: self.pml_full_exits.saturating_sub(earlier.pml_full_exits),
            pml_entries: self.pml_entries.saturating_sub(earlier.pml_entries),
        }
    }

    /// Adds `o` to `self`.
    pub fn add(&mut self, o: &FaultStats) {
        self.fast += o.fast;
        self.collapsed += o.collapsed;
        self.eager_split_failures += o.eager_split_failures;
        self.recovery_failures += o.recovery_failures;
        self.slow += o.slow;
        self.spurious += o.spurious;
        self.retries += o.retries;
        self.translation += o.translation;
        self.permission += o.permission;
        self.splits_on_fault += o.splits_on_fault;
        self.dirtied += o.dirtied;
        self.read_locks += o.read_locks;
        self.read_contended += o.read_contended;
        self.write_locks += o.write_locks;
        self.write_contended += o.write_contended;
        self.lock_wait_ns += o.lock_wait_ns;
        self.split_ns += o.split_ns;
        self.pml_full_exits += o.pml_full_exits;
        self.pml_entries += o.pml_entries;
    }

    /// Lock acquisitions that had to wait, both modes.
    pub fn contentions(&self) -> u64 {
        self.read_contended + self.write_contended
    }
}
