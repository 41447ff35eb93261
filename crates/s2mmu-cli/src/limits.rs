//! Bounded flags: the value parsers and checks that refuse a number before
//! anything is allocated or a thread starts, with a message that names the
//! limit (clap puts the flag's name before it: `invalid value '1P' for
//! '--mem <SIZE>': at most 16TiB`).

use crate::report::{human_bytes, parse_size};
use std::ops::RangeInclusive;

/// A parser for a size flag (`64K`, `2M`, `1G`) that takes only sizes in
/// `range`, so clap refuses the others naming the flag and the limit.
pub fn size_in(
    range: RangeInclusive<u64>,
) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync + 'static {
    move |s: &str| {
        let n = parse_size(s)?;
        if n < *range.start() {
            return Err(format!("at least {}", human_bytes(*range.start())));
        }
        if n > *range.end() {
            return Err(format!("at most {}", human_bytes(*range.end())));
        }
        Ok(n)
    }
}

/// A parser for a count flag that takes only counts in `range`.
pub fn count_in(range: RangeInclusive<u64>) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(range)
}

/// A parser for a `u64` flag that takes only values in `range`.
pub fn u64_in(range: RangeInclusive<u64>) -> clap::builder::RangedU64ValueParser<u64> {
    clap::builder::RangedU64ValueParser::<u64>::new().range(range)
}

// The host's memory (the engines check it too, so they live with them).
pub use s2mmu_bench::host::{
    approx_bytes, available_memory, check_guest, check_memory, MAX_GUEST_MEM,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_outside_the_range_name_the_limit() {
        let p = size_in(4096..=(1 << 30));
        assert_eq!(p("1G"), Ok(1 << 30));
        assert_eq!(p("2G").unwrap_err(), "at most 1GiB");
        assert_eq!(p("1K").unwrap_err(), "at least 4KiB");
        assert!(p("-1").unwrap_err().contains("invalid size"));
        assert!(p("99999999999T").is_err());
    }

    #[test]
    fn memory_beyond_the_host_is_refused() {
        assert!(
            available_memory().is_some(),
            "/proc/meminfo has MemAvailable (Linux 3.14 or newer)"
        );
        let e = check_memory("--mem 1P", u64::MAX).unwrap_err();
        assert!(e.starts_with("--mem 1P: needs about"), "{e}");
        assert!(check_memory("--mem 4K", 4096).is_ok());
        assert_eq!(approx_bytes(3 << 29), "1.5 GiB");
    }
}
