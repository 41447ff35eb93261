//! Where guest memory comes from.

use std::fmt;

/// How guest memory is backed (the KVM selftests' `-s`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Backing {
    /// `MAP_PRIVATE | MAP_ANONYMOUS`, 4 KiB host pages (`anonymous`).
    #[default]
    Anonymous,
    /// Anonymous memory on a 2 MiB-aligned range with `MADV_HUGEPAGE`
    /// (`anonymous_thp`).
    AnonymousThp,
    /// hugetlbfs 2 MiB pages, which must be reserved (`anonymous_hugetlb_2mb`).
    Hugetlb2M,
    /// hugetlbfs 1 GiB pages, which must be reserved (`anonymous_hugetlb_1gb`).
    Hugetlb1G,
}

/// Every backing, in the order the selftests list them.
const ALL: [Backing; 4] = [
    Backing::Anonymous,
    Backing::AnonymousThp,
    Backing::Hugetlb2M,
    Backing::Hugetlb1G,
];

impl Backing {
    /// The selftests' name (`anonymous`, `anonymous_thp`,
    /// `anonymous_hugetlb_2mb`, `anonymous_hugetlb_1gb`).
    pub fn name(self) -> &'static str {
        match self {
            Backing::Anonymous => "anonymous",
            Backing::AnonymousThp => "anonymous_thp",
            Backing::Hugetlb2M => "anonymous_hugetlb_2mb",
            Backing::Hugetlb1G => "anonymous_hugetlb_1gb",
        }
    }

    /// Parses a selftests name ([`Backing::name`]; `anonymous_hugetlb` is
    /// the selftests' older name for 2 MiB pages).
    ///
    /// # Errors
    /// A message naming the unknown backing and listing the accepted names.
    pub fn parse(s: &str) -> Result<Backing, String> {
        if s == "anonymous_hugetlb" {
            return Ok(Backing::Hugetlb2M);
        }
        ALL.into_iter().find(|b| b.name() == s).ok_or_else(|| {
            format!(
                "unknown backing '{s}': use anonymous, anonymous_thp, anonymous_hugetlb_2mb or anonymous_hugetlb_1gb"
            )
        })
    }

    /// The host page size the backing provides: the largest stage-2
    /// mapping a fault may install over it, and (but for THP, which takes
    /// any 4 KiB multiple) what a size must be a multiple of.
    pub fn page_size(self) -> u64 {
        match self {
            Backing::Anonymous => 4 << 10,
            Backing::AnonymousThp | Backing::Hugetlb2M => 2 << 20,
            Backing::Hugetlb1G => 1 << 30,
        }
    }

    /// What a guest memory size must be a non-zero multiple of.
    pub fn size_multiple(self) -> u64 {
        match self {
            Backing::AnonymousThp => 4 << 10,
            b => b.page_size(),
        }
    }

    /// Whether the pages come from hugetlbfs (reserved up front).
    pub fn is_hugetlb(self) -> bool {
        matches!(self, Backing::Hugetlb2M | Backing::Hugetlb1G)
    }
}

impl fmt::Display for Backing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for b in ALL {
            assert_eq!(Backing::parse(b.name()), Ok(b));
            assert_eq!(b.to_string(), b.name());
        }
        assert_eq!(Backing::parse("anonymous_hugetlb"), Ok(Backing::Hugetlb2M));
        let e = Backing::parse("shmem").unwrap_err();
        assert!(e.contains("'shmem'") && e.contains("anonymous_thp"), "{e}");
    }
}
