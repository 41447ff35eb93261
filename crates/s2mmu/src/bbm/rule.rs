//! The rules the monitor checks, and a broken one as a value.

use core::fmt;

/// The rule a violation broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// A valid entry was overwritten by a valid one with another output
    /// address or block size, without a break.
    ChangeWithoutBreak,
    /// An entry was made with another output address or block size while
    /// its break had not been covered by a completed invalidation.
    MakeBeforeInvalidate,
    /// A table page was freed before an invalidation covered the range its
    /// unlinked entry had mapped.
    FreeBeforeInvalidate,
    /// GET or CLEAR reported pages clean while a write protection (or
    /// clean, or unmap) of one of them was not yet invalidated.
    ReportBeforeInvalidate,
    /// An arm64 invalidation sequence lacks its barriers: a DSB that makes
    /// the table stores visible before the first TLBI (`DSB ISHST`), or one
    /// that waits for the TLBIs to complete after the last (`DSB ISH`; the
    /// `NSH` forms for a sequence of local TLBIs only). Reported with
    /// table 0 and the first TLBI's operand as the address.
    BarrierMissing,
}

/// One broken rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The rule.
    pub rule: Rule,
    /// The table ([`crate::PageTable::bbm_id`]).
    pub table: usize,
    /// First address of the entry (or of the freed table's range).
    pub ipa: u64,
    /// Level of the entry (of the freed table's parent entry).
    pub level: u32,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.rule {
            Rule::ChangeWithoutBreak => {
                "valid entry changed output address or size without a break"
            }
            Rule::MakeBeforeInvalidate => {
                "entry made before the invalidation of its break completed"
            }
            Rule::FreeBeforeInvalidate => "table page freed before the invalidation of its range",
            Rule::ReportBeforeInvalidate => {
                "page reported clean before its write protection was invalidated"
            }
            Rule::BarrierMissing => {
                "TLBI sequence without a DSB before its first or after its last TLBI"
            }
        };
        write!(
            f,
            "break-before-make: {what} (table {:#x}, IPA {:#x}, level {})",
            self.table, self.ipa, self.level
        )
    }
}
