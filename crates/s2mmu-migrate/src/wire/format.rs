//! The stage-2 format of the source's tables as HEADER carries it: a code
//! fixed on the wire, separate from any command line's spelling (a CLI
//! maps its own names to it). Each format states its code
//! ([`s2mmu::format::KnownFormat::WIRE_CODE`], in its file); nothing here
//! changes when a format is added.

use s2mmu::format::{FormatId, KnownFormat, WithFormat};

/// A stage-2 format as the migration stream's HEADER carries it: one the
/// engine ships, so it always has a code and dispatches
/// ([`WireFormat::with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireFormat(FormatId);

impl WireFormat {
    /// Format `F`'s.
    pub const fn of<F: KnownFormat>() -> WireFormat {
        WireFormat(FormatId::of::<F>())
    }

    /// Every format this build knows, in the engine's list's order.
    pub fn all() -> impl Iterator<Item = WireFormat> {
        FormatId::ALL.iter().map(|&f| WireFormat(f))
    }

    /// The code on the wire.
    pub fn code(self) -> u8 {
        self.0.code()
    }

    /// The format of a code (`None`: one this build does not know).
    pub fn of_code(code: u8) -> Option<WireFormat> {
        FormatId::from_code(code).map(WireFormat)
    }

    /// Its name, as messages spell it.
    pub fn name(self) -> &'static str {
        self.0.name()
    }

    /// The engine's id of the format.
    pub fn id(self) -> FormatId {
        self.0
    }

    /// Runs `code` on the format's type.
    pub fn with<W: WithFormat>(self, code: W) -> W::Output {
        self.0.with(code)
    }

    /// The known codes, as an error message lists them (`0: arm64, 1: ept`).
    pub fn known_codes() -> String {
        let codes: Vec<String> = Self::all()
            .map(|w| format!("{}: {}", w.code(), w.name()))
            .collect();
        codes.join(", ")
    }
}

impl From<FormatId> for WireFormat {
    fn from(f: FormatId) -> WireFormat {
        WireFormat(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use s2mmu::format::arm64::Arm64Stage2;
    use s2mmu::format::ept::EptFormat;

    /// The released codes: streams written by older builds use them.
    #[test]
    fn released_codes_stay_and_unknown_codes_are_refused() {
        assert_eq!(WireFormat::of::<Arm64Stage2>().code(), 0);
        assert_eq!(WireFormat::of::<EptFormat>().code(), 1);
        assert_eq!(WireFormat::of_code(1), Some(WireFormat::of::<EptFormat>()));
        for w in WireFormat::all() {
            assert_eq!(WireFormat::of_code(w.code()), Some(w));
        }
        assert_eq!(WireFormat::of_code(u8::MAX), None);
        assert_eq!(WireFormat::of::<Arm64Stage2>().name(), "arm64");
        assert!(WireFormat::known_codes().starts_with("0: arm64, 1: ept"));
    }
}
