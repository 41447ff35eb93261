//! A table's invalidation backend as the break-before-make monitor sees
//! it: each completed call is a trace point ([`crate::bbm`]). Without the
//! monitor (the `bbm-trace` feature off) the backend is used as it is.

use super::TlbInvalidate;
use alloc::sync::Arc;

/// The backend `tlb` of table `table`, with its completions traced (itself
/// when the monitor is off).
#[inline(always)]
pub(crate) fn traced(table: usize, tlb: Arc<dyn TlbInvalidate>) -> Arc<dyn TlbInvalidate> {
    #[cfg(feature = "bbm-trace")]
    {
        Arc::new(TracedTlb { inner: tlb, table })
    }
    #[cfg(not(feature = "bbm-trace"))]
    {
        let _ = table;
        tlb
    }
}

/// The table's invalidation backend, with each completed call traced.
#[cfg(feature = "bbm-trace")]
struct TracedTlb {
    inner: Arc<dyn TlbInvalidate>,
    table: usize,
}

#[cfg(feature = "bbm-trace")]
impl TlbInvalidate for TracedTlb {
    fn flush_ipa(&self, ipa: u64, level: Option<u32>) {
        self.inner.flush_ipa(ipa, level);
        crate::bbm::invalidated(self.table, crate::bbm::Flush::Ipa(ipa));
    }
    fn flush_ipa_local(&self, ipa: u64, level: Option<u32>) {
        // This CPU only: it covers no break or protection other CPUs may
        // hold, so it is not traced as an invalidation.
        self.inner.flush_ipa_local(ipa, level);
    }
    fn flush_range(&self, ipa: u64, size: u64) {
        self.inner.flush_range(ipa, size);
        crate::bbm::invalidated(self.table, crate::bbm::Flush::Range(ipa, size));
    }
    fn flush_vmid(&self) {
        self.inner.flush_vmid();
        crate::bbm::invalidated(self.table, crate::bbm::Flush::All);
    }
}
