//! `s2mmu dirty-views`: its flags and the report of what
//! [`s2mmu_bench::views`] measured (several dirty views of one slot at
//! their own harvest periods, against the fastest alone).

use crate::report::{human_bytes, verdict, Report};
use s2mmu_bench::views::{per_page_cycle, run_both, Config, Outcome};
use serde_json::json;

/// Options of `dirty-views`.
#[derive(Clone, Debug, clap::Args)]
pub struct Params {
    /// Guest memory, one slot (a multiple of 2M times the vCPUs, at most 16G).
    #[arg(short = 'm', long, default_value = "256M", value_parser = crate::report::parse_size)]
    pub mem: u64,
    /// vCPU threads, each writing its own share of the slot (1..=64).
    #[arg(short = 'v', long, default_value_t = 2)]
    pub vcpus: usize,
    /// Harvest period of each view in ticks, one number per view
    /// (1..=1000 each, at most 8 views).
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    pub view_periods: Vec<u32>,
    /// Ticks to run (1..=100000).
    #[arg(long, default_value_t = 30)]
    pub ticks: u32,
    /// A tick is this long a free-running guest, at fixed times (1ms..=10s, whole
    /// milliseconds); 0s: one guest pass over every page.
    #[arg(long, default_value = "0s", value_parser = s2mmu_cli::flags::parse_duration)]
    pub tick: std::time::Duration,
    /// Hidden alias of --tick in milliseconds.
    #[arg(long, hide = true, conflicts_with = "tick")]
    pub tick_ms: Option<u64>,
    /// Pages visited at random instead of in order.
    #[arg(long)]
    pub random: bool,
    /// The engine's dirty mode: wp (write protection) or hw (hardware dirty
    /// state, no write faults); the others are refused by name.
    #[arg(long, default_value = "wp", value_parser = s2mmu_cli::dirty_mode::parse_dirty_mode)]
    pub dirty: s2mmu::mmu::DirtyMode,
    /// Hidden alias of --dirty hw.
    #[arg(long, hide = true, conflicts_with = "dirty")]
    pub hardware: bool,
    /// Views due at the same tick clear one after the other
    /// (`clear_dirty_view` each) instead of in one call
    /// (`clear_dirty_views`).
    #[arg(long)]
    pub separate_clears: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// No progress on stderr.
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

fn check(p: &Params) -> Result<(), String> {
    let hw = s2mmu::mmu::DirtyMode::HW;
    if ![s2mmu::mmu::DirtyMode::WP, hw].contains(&p.dirty) {
        return Err(format!(
            "--dirty {}: dirty-views runs wp or hw",
            p.dirty.name()
        ));
    }
    if p.tick_ms.is_none()
        && (!p.tick.subsec_nanos().is_multiple_of(1_000_000) || p.tick.as_millis() > 10_000)
    {
        return Err(format!(
            "--tick {:?}: whole milliseconds, at most 10s",
            p.tick
        ));
    }
    s2mmu_bench::views::check(&p.config())
}

impl Params {
    /// The engine's settings.
    fn config(&self) -> Config {
        Config {
            mem: self.mem,
            vcpus: self.vcpus,
            view_periods: self.view_periods.clone(),
            ticks: self.ticks,
            tick_ms: self.tick_ms.unwrap_or(self.tick.as_millis() as u64),
            random: self.random,
            hardware: self.hardware || self.dirty == s2mmu::mmu::DirtyMode::HW,
            separate_clears: self.separate_clears,
        }
    }
}

/// Runs `dirty-views` from the command line.
///
/// # Errors
/// A message naming the flag or the step that failed, or a consumer that
/// lost a write.
pub fn main(p: Params) -> Result<(), String> {
    let r = run(&p)?;
    crate::report::emit(&r, p.json);
    match r.failure() {
        Some(why) => Err(why.to_string()),
        None => Ok(()),
    }
}

/// Runs the benchmark and builds its report.
///
/// # Errors
/// A message naming the flag or the step that failed.
pub fn run(p: &Params) -> Result<Report, String> {
    check(p)?;
    let bar = crate::progress::Progress::new("dirty-views", 2, !p.quiet);
    let (many, one) = run_both(&p.config(), &bar)?;
    drop(bar);
    let fastest = *p.view_periods.iter().min().unwrap_or(&1);
    let c = p.config();
    let mut r = Report::new(
        "dirty-views",
        json!({ "mem": p.mem, "vcpus": p.vcpus, "view_periods": p.view_periods,
                "ticks": p.ticks, "tick_ms": c.tick_ms, "random": p.random,
                "separate_clears": p.separate_clears,
                "dirty": if c.hardware { "hw" } else { "wp" } }),
    );
    let (fm, f1) = (
        per_page_cycle(&many, &p.config()),
        per_page_cycle(&one, &p.config()),
    );
    let mut text = header(p);
    for (case, o) in [("views", &many), ("alone", &one)] {
        report_run(&mut r, &mut text, case, o, p);
    }
    r.compare(
        "faults per page per cycle",
        "faults_per_page_per_cycle",
        f1,
        fm,
    );
    let lost: u64 = many.consumers.iter().map(|(c, _)| c.lost).sum();
    // Consumers are sorted by period: the first is the fastest.
    let fast_protects = many.consumers.first().map_or(0, |(_, st)| st.protected);
    let slow_protects: u64 = many
        .consumers
        .iter()
        .skip(1)
        .map(|(_, st)| st.protected)
        .sum();
    let share = slow_protects as f64 / fast_protects.max(1) as f64;
    r.result(
        "views",
        "views",
        json!({ "slower_views_protects": slow_protects, "fastest_view_protects": fast_protects,
                "slower_views_protect_share": share }),
    );
    // In pass mode the guest does the same work in both runs, so the
    // fault counts compare exactly; free running, its speed varies from
    // run to run and only the protects the slower views added tell.
    let ok = lost == 0 && share <= 0.01 && (p.config().tick_ms > 0 || many.faults == one.faults);
    text += &format!(
        "Guest write faults per page per cycle of the fastest view (period {fastest}): \
         {fm:.4} with {} views ({} faults in {} guest writes), {f1:.4} with it alone ({} faults in {} writes)\n\
         Pages the slower views' clears protected: {slow_protects} ({:.3}% of the fastest view's {fast_protects}); \
         each protect costs the guest at most one fault\n\
         (free running, the guest's speed varies from run to run, and with it its faults; \
         a period that is not a multiple of the fastest adds the protect cycles of its own harvests)\n\
         [target: no protect cycle added by the slower views (at most 1% more protects; in pass mode equal faults), \
         0 lost for every view: {}]\n",
        p.view_periods.len(),
        many.faults,
        many.writes,
        one.faults,
        one.writes,
        share * 100.0,
        verdict(ok)
    );
    r.set_text(text);
    Ok(r)
}

/// One run's rows (`case`: with the other views, or alone): a table line
/// and a result per consumer, failing on lost pages, and the run's faults.
fn report_run(r: &mut Report, text: &mut String, case: &str, o: &Outcome, p: &Params) {
    for (c, st) in &o.consumers {
        let name = format!("{case}/p{}", c.period);
        *text += &format!(
            "{name:<10} {:>6} {:>8} {:>10} {:>10} {:>10} {:>8} {:>8} {:>6}\n",
            c.period,
            c.harvests,
            c.reported,
            st.protected,
            st.already_protected,
            st.flushes,
            c.over_reported,
            c.lost
        );
        r.result(
            &name,
            case,
            json!({ "period_ticks": c.period, "harvests": c.harvests,
                    "pages_reported": c.reported, "pages_protected": st.protected,
                    "pages_already_protected": st.already_protected,
                    "flushes": st.flushes, "pages_over_reported": c.over_reported,
                    "pages_opened_dirty": st.opened_dirty, "pages_lost": c.lost }),
        );
        if c.lost > 0 {
            r.fail(format!("{name} lost {} pages", c.lost));
        }
    }
    r.result(
        case,
        case,
        json!({ "guest_write_faults": o.faults, "guest_writes": o.writes,
                "faults_per_page_per_cycle": per_page_cycle(o, &p.config()) }),
    );
}

/// The title line (size, vCPUs, ticks, tracking, how views clear) and the
/// table's column heads.
fn header(p: &Params) -> String {
    format!(
        "dirty-views: {} guest, {} vCPUs, {} ticks of {}, {} tracking; {}\n\
         {:<10} {:>6} {:>8} {:>10} {:>10} {:>10} {:>8} {:>8} {:>6}\n",
        human_bytes(p.mem),
        p.vcpus,
        p.ticks,
        if p.config().tick_ms == 0 {
            "one guest pass".to_string()
        } else {
            format!("{} ms", p.config().tick_ms)
        },
        if p.config().hardware {
            "hardware dirty state"
        } else {
            "write-protection"
        },
        if p.separate_clears {
            "views due together clear one after the other"
        } else {
            "views due together clear in one call"
        },
        "consumer",
        "period",
        "harvests",
        "reported",
        "protected",
        "already",
        "flushes",
        "over",
        "lost"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(periods: &[u32], separate: bool) -> Params {
        Params {
            mem: 8 << 20,
            vcpus: 2,
            view_periods: periods.to_vec(),
            ticks: 6,
            tick: std::time::Duration::ZERO,
            tick_ms: None,
            random: false,
            dirty: s2mmu::mmu::DirtyMode::WP,
            hardware: false,
            separate_clears: separate,
            json: false,
            quiet: true,
        }
    }

    #[test]
    fn bad_flags_are_refused() {
        assert!(check(&params(&[], false)).is_err());
        assert!(check(&params(&[0], false)).is_err());
        assert!(check(&params(&[1; 9], false)).is_err());
        assert!(check(&Params {
            mem: 3 << 20,
            ..params(&[1], false)
        })
        .is_err());
        assert!(check(&params(&[1, 3], false)).is_ok());
    }
}
