//! The list of the formats the engine ships, and a format chosen at run
//! time ([`FormatId`]): its name, words and stream code, and the dispatch
//! to the type its code is generic over ([`FormatId::with`]).

use super::known::{KnownFormat, Listed, WithFormat};
use super::{arm64, ept};

/// The formats the engine ships, each as its module and type: makes the
/// list's variants ([`FormatId`] holds one), the sealed supertrait's impls
/// (a format's position in the list), [`FormatId::ALL`] and the dispatch
/// [`FormatId::with`], checks that codes and names are distinct, and gives
/// the conformance suite the configurations each format lists
/// (`conformance_configs`, in its file). Adding a format is its file (its
/// `PteFormat` and [`KnownFormat`] impls), its `pub mod` in `format/mod.rs`
/// and its entry here.
macro_rules! formats {
    ($($module:ident :: $ty:ident),+ $(,)?) => {
        /// One variant per listed format, named by its module, in the
        /// list's order.
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        enum Which {
            $(
                #[doc = concat!("`", stringify!($module), "::", stringify!($ty), "`.")]
                $module,
            )+
        }

        $(
            impl Listed for $module::$ty {
                const INDEX: usize = Which::$module as usize;
            }
        )+

        impl FormatId {
            /// Every format the engine ships, in the list's order.
            pub const ALL: &'static [FormatId] = &[$(FormatId(Which::$module)),+];

            /// Runs `code` with the format type this id stands for.
            pub fn with<W: WithFormat>(self, code: W) -> W::Output {
                match self.0 {
                    $(Which::$module => code.call::<$module::$ty>(),)+
                }
            }
        }

        const _: () = assert_distinct(
            &[$(<$module::$ty as KnownFormat>::WIRE_CODE),+],
            &[$(<$module::$ty as KnownFormat>::NAME),+],
        );

        /// Every configuration of every format, for the conformance suite.
        #[cfg(all(test, feature = "std"))]
        pub(super) fn conformance_formats(
        ) -> alloc::vec::Vec<alloc::boxed::Box<dyn super::conformance::Check>> {
            let mut v: alloc::vec::Vec<alloc::boxed::Box<dyn super::conformance::Check>> =
                alloc::vec::Vec::new();
            $(
                for f in $module::conformance_configs() {
                    v.push(alloc::boxed::Box::new(f));
                }
            )+
            v
        }
    };
}

formats!(arm64::Arm64Stage2, ept::EptStage2);

/// One of the formats the engine ships, chosen at run time. Made only from
/// a listed format ([`FormatId::of`], [`FormatId::from_name`],
/// [`FormatId::from_code`], [`FormatId::ALL`]), so every value dispatches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FormatId(Which);

/// The format's constants, read off its type.
struct Words;

impl WithFormat for Words {
    type Output = (&'static str, &'static str, &'static str, u8);
    fn call<F: KnownFormat>(self) -> Self::Output {
        (F::NAME, F::TITLE, F::HARDWARE_DIRTY_NAME, F::WIRE_CODE)
    }
}

impl FormatId {
    /// The id of format `F`.
    pub const fn of<F: KnownFormat>() -> FormatId {
        // Every `KnownFormat` is listed (the supertrait is sealed to the
        // list), at the position its `INDEX` names.
        Self::ALL[F::INDEX]
    }

    /// The format called `name` ([`KnownFormat::NAME`]); `None` for a name
    /// no listed format has.
    pub fn from_name(name: &str) -> Option<FormatId> {
        Self::ALL.iter().copied().find(|f| f.name() == name)
    }

    /// The format whose stream code is `code` ([`KnownFormat::WIRE_CODE`]);
    /// `None` for a code this build does not know.
    pub fn from_code(code: u8) -> Option<FormatId> {
        Self::ALL.iter().copied().find(|f| f.code() == code)
    }

    /// Its [`KnownFormat::NAME`].
    pub fn name(self) -> &'static str {
        self.with(Words).0
    }

    /// Its [`KnownFormat::TITLE`].
    pub fn title(self) -> &'static str {
        self.with(Words).1
    }

    /// Its [`KnownFormat::HARDWARE_DIRTY_NAME`].
    pub fn hardware_dirty_name(self) -> &'static str {
        self.with(Words).2
    }

    /// Its [`KnownFormat::WIRE_CODE`].
    pub fn code(self) -> u8 {
        self.with(Words).3
    }
}

/// Fails the build (this is evaluated in a constant) when two listed
/// formats share a wire code or a name, which would make
/// [`FormatId::from_code`] or [`FormatId::from_name`] ambiguous.
const fn assert_distinct(codes: &[u8], names: &[&str]) {
    let mut i = 0;
    while i < codes.len() {
        let mut j = i + 1;
        while j < codes.len() {
            assert!(codes[i] != codes[j], "two formats share a wire code");
            assert!(!same(names[i], names[j]), "two formats share a name");
            j += 1;
        }
        i += 1;
    }
}

/// `a == b` in a constant.
const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;
    use crate::format::arm64::Arm64Stage2;
    use crate::format::ept::EptStage2;

    /// The released codes and names: a stream or a script written against
    /// them must keep working.
    #[test]
    fn released_codes_and_names_stay() {
        let arm64 = FormatId::of::<Arm64Stage2>();
        let ept = FormatId::of::<EptStage2>();
        assert_eq!((arm64.code(), arm64.name()), (0, "arm64"));
        assert_eq!((ept.code(), ept.name()), (1, "ept"));
        assert_eq!(arm64.title(), "arm64 stage 2");
        assert_eq!(ept.hardware_dirty_name(), "x86 EPT dirty flags");
    }

    #[test]
    fn every_listed_format_round_trips_by_name_and_code() {
        assert!(FormatId::ALL.len() >= 2);
        for &f in FormatId::ALL {
            assert_eq!(FormatId::from_name(f.name()), Some(f));
            assert_eq!(FormatId::from_code(f.code()), Some(f));
        }
        assert_eq!(FormatId::from_name("riscv"), None);
        assert_eq!(FormatId::from_code(u8::MAX), None);
    }

    /// The dispatch reaches the type the id names: a 52-bit VM's format
    /// read back through `with` has that type's geometry (arm64: 16
    /// concatenated root pages over 4 levels; EPT: 5 levels, one root).
    #[test]
    fn with_runs_on_the_named_type() {
        struct Geometry;
        impl WithFormat for Geometry {
            type Output = (usize, u32, &'static str);
            fn call<F: KnownFormat>(self) -> Self::Output {
                let f = F::for_vm(52).expect("every shipped format translates 52 bits");
                (
                    f.root_pages(),
                    f.last_level() - f.start_level() + 1,
                    F::NAME,
                )
            }
        }
        let arm64 = FormatId::of::<Arm64Stage2>().with(Geometry);
        assert_eq!(arm64, (16, 4, "arm64"));
        let ept = FormatId::of::<EptStage2>().with(Geometry);
        assert_eq!(ept, (1, 5, "ept"));
    }

    #[test]
    fn distinct_codes_and_names_pass_and_duplicates_are_found() {
        assert_distinct(&[0, 1], &["a", "b"]);
        assert!(same("ept", "ept") && !same("ept", "eps") && !same("ep", "ept"));
        let dup_code = std::panic::catch_unwind(|| assert_distinct(&[3, 3], &["a", "b"]));
        assert!(dup_code.is_err());
        let dup_name = std::panic::catch_unwind(|| assert_distinct(&[3, 4], &["a", "a"]));
        assert!(dup_name.is_err());
    }
}
