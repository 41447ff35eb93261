//! The stage-2 format of the source's tables as HEADER carries it: a code
//! fixed on the wire, separate from any command line's spelling (a CLI
//! maps its own names to it).

/// A stage-2 format as the migration stream's HEADER carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireFormat {
    /// Code 0: arm64 stage 2.
    Arm64,
    /// Code 1: x86 EPT.
    Ept,
}

impl WireFormat {
    /// Every format this build knows, in code order.
    pub const ALL: [WireFormat; 2] = [WireFormat::Arm64, WireFormat::Ept];

    /// The code on the wire.
    pub const fn code(self) -> u8 {
        match self {
            WireFormat::Arm64 => 0,
            WireFormat::Ept => 1,
        }
    }

    /// The format of a code (`None`: one this build does not know).
    pub const fn of_code(code: u8) -> Option<WireFormat> {
        match code {
            0 => Some(WireFormat::Arm64),
            1 => Some(WireFormat::Ept),
            _ => None,
        }
    }

    /// Its name, as messages spell it.
    pub const fn name(self) -> &'static str {
        match self {
            WireFormat::Arm64 => "arm64",
            WireFormat::Ept => "ept",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_codes_are_refused() {
        for w in WireFormat::ALL {
            assert_eq!(WireFormat::of_code(w.code()), Some(w));
        }
        assert_eq!(WireFormat::of_code(2), None);
        assert_eq!(WireFormat::Arm64.name(), "arm64");
    }
}
