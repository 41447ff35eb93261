//! Post-copy's lines in `s2mmu migrate`'s text report (its JSON is
//! `super::outcome_json`'s).

use s2mmu_migrate::session::postcopy::PostcopyOutcome;
use s2mmu_migrate::session::source::SourceOutcome;
use std::time::Duration;

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// The summary lines of a post-copy migration.
pub fn text(pc: &PostcopyOutcome, s: &SourceOutcome, budget: Duration) -> String {
    let f = &pc.figures;
    let vs = |ns: u64| {
        if f.reference_ns > 0 {
            format!("{:.1}x the reference", ns as f64 / f.reference_ns as f64)
        } else {
            "no reference".into()
        }
    };
    let mut t = format!(
        "  post-copy            switched after round {}: {} pages missing when the destination resumed\n  downtime             {:.1} ms (stop to resume; budget {} ms): {}\n",
        pc.after_round,
        f.missing_pages,
        s.downtime.as_secs_f64() * 1e3,
        budget.as_millis(),
        if s.downtime <= budget { "within budget" } else { "OVER BUDGET" },
    );
    t.push_str(&format!(
        "  remote faults        {} (a vCPU waited for a page; {} requests): wait median {:.3} ms, p99 {:.3} ms ({})\n  answered faults      {} of them got their page as the answer to a request: median {:.3} ms, p99 {:.3} ms ({}); the rest came with the background stream\n",
        f.remote_faults,
        f.requests,
        ms(f.fault_median_ns),
        ms(f.fault_p99_ns),
        vs(f.fault_median_ns),
        f.answered_faults,
        ms(f.answered_median_ns),
        ms(f.answered_p99_ns),
        vs(f.answered_median_ns),
    ));
    t.push_str(&format!(
        "  reference            {:.3} ms: median of {} one-page requests on the same connections with nothing else sent (a round trip plus one page's transfer)\n  time to last page    {:.1} ms after the resume ({} pages in the background, {} answered, {} late copies dropped)\n  total time           {:.3} s (logging on to the background stream's end)\n",
        ms(f.reference_ns),
        f.reference_samples,
        ms(f.time_to_last_page_ns),
        f.background_pages,
        f.answered_pages,
        f.dropped_duplicates,
        s.total.as_secs_f64(),
    ));
    if f.recoveries > 0 {
        t.push_str(&format!(
            "  recoveries           {}: the connections broke and post-copy resumed over new ones\n",
            f.recoveries
        ));
    }
    t
}
