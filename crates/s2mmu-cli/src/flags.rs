//! The values every subcommand's flags share: durations with a unit, and
//! which options a user gave (for refusing those that do not apply).
//! docs/cli.md lists the whole vocabulary.

use std::time::Duration;

/// `--policy`: the engine's MMU policy.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PolicyArg {
    /// `MmuPolicy::default()`: read-lock fast path, eager split.
    #[default]
    #[value(alias = "fast")]
    Default,
    /// `MmuPolicy::baseline()`: every fault under the write lock, split on fault.
    Baseline,
}

/// The longest duration any flag takes: a day.
pub const MAX_DURATION: Duration = Duration::from_secs(86_400);

/// Parses a duration with its unit: `250us`, `500ms`, `1.5s`, `2m`, `1h`
/// (0 to a day). A bare number is refused: its unit was milliseconds in
/// one flag and seconds in another.
///
/// # Errors
/// The value and the form expected (clap adds the flag's name).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim().to_ascii_lowercase();
    let units = [
        ("us", 1e-6),
        ("ms", 1e-3),
        ("s", 1.0),
        ("m", 60.0),
        ("h", 3600.0),
    ];
    let Some((num, scale)) = units
        .iter()
        .find_map(|(u, k)| t.strip_suffix(u).map(|n| (n, *k)))
    else {
        return Err(format!(
            "'{s}' has no unit: give a duration such as 500ms, 2s or 1m"
        ));
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid duration '{s}': expected e.g. 500ms, 2s or 1m"))?;
    if !v.is_finite() || v < 0.0 || v * scale > MAX_DURATION.as_secs_f64() {
        return Err(format!(
            "duration '{s}' is out of range: 0 to 86400s (a day)"
        ));
    }
    Ok(Duration::from_secs_f64(v * scale))
}

/// The ids (field names) of the options given on the command line in
/// `m`, a subcommand's matches; defaults and environment do not count.
pub fn given(m: &clap::ArgMatches) -> Vec<String> {
    m.ids()
        .filter(|id| m.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine))
        .map(|id| id.as_str().to_owned())
        .collect()
}

/// An option's id as its long flag: `no_tls` is `--no-tls`.
pub fn flag(id: &str) -> String {
    format!("--{}", id.replace('_', "-"))
}
