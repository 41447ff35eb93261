//! The stage-2 format of the source's tables as HEADER carries it: the
//! engine's [`FormatId`], written as its code ([`FormatId::code`], each
//! format's [`s2mmu::format::KnownFormat::WIRE_CODE`], in its file), fixed
//! on the wire and separate from any command line's spelling. Nothing here
//! changes when a format is added.

use s2mmu::format::FormatId;

/// The known codes, as an error message lists them (`0: arm64, 1: ept`).
pub(crate) fn known_codes() -> String {
    let codes: Vec<String> = FormatId::ALL
        .iter()
        .map(|f| format!("{}: {}", f.code(), f.name()))
        .collect();
    codes.join(", ")
}

/// The engine's [`FormatId`], by the name this crate gave it.
#[deprecated(
    note = "use `s2mmu::format::FormatId`: `of_code` is `FormatId::from_code`, `all()` is `FormatId::ALL`"
)]
pub type WireFormat = FormatId;

#[cfg(test)]
mod tests {
    use super::*;
    use s2mmu::format::arm64::Arm64Stage2;
    use s2mmu::format::ept::EptStage2;

    /// The released codes: streams written by older builds use them.
    #[test]
    fn released_codes_stay_and_unknown_codes_are_refused() {
        assert_eq!(FormatId::of::<Arm64Stage2>().code(), 0);
        assert_eq!(FormatId::of::<EptStage2>().code(), 1);
        assert_eq!(FormatId::from_code(1), Some(FormatId::of::<EptStage2>()));
        for &f in FormatId::ALL {
            assert_eq!(FormatId::from_code(f.code()), Some(f));
        }
        assert_eq!(FormatId::from_code(u8::MAX), None);
        assert_eq!(FormatId::of::<Arm64Stage2>().name(), "arm64");
        assert!(known_codes().starts_with("0: arm64, 1: ept"));
    }

    /// The old name still builds a header's format.
    #[test]
    #[allow(deprecated)]
    fn the_old_name_is_the_engines_id() {
        let old: WireFormat = WireFormat::of::<EptStage2>();
        assert_eq!(old, FormatId::of::<EptStage2>());
        assert_eq!(old.code(), 1);
    }
}
