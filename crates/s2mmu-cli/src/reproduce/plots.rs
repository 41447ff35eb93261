//! The plots `reproduce` draws from the experiments' reports: seed 002's
//! dirty-memory time against the vCPU count per fault policy, and seed
//! 004's eager split against split on fault, case by case.

use s2mmu_plot::{BarChart, LineChart, Series};
use serde_json::Value;

/// A row's time in milliseconds: its median, or its one value.
fn ms(row: &Value) -> Option<f64> {
    let ns = row["median_ns"]
        .as_f64()
        .or_else(|| row["value_ns"].as_f64())?;
    Some(ns / 1e6)
}

/// Seed 002 (`dirty-log-perf --policy both`): one line per fault policy,
/// the dirty-memory time at each vCPU count. `None` when the report has no
/// such rows.
pub(super) fn vcpu_scaling(report: &Value) -> Option<LineChart> {
    let rows = report["results"].as_array()?;
    let mut series: Vec<Series> = Vec::new();
    for r in rows {
        let (Some(vcpus), Some(policy), Some(t)) =
            (r["vcpus"].as_f64(), r["policy"].as_str(), ms(r))
        else {
            continue;
        };
        match series.iter_mut().find(|s| s.name == policy) {
            Some(s) => s.points.push((vcpus, t)),
            None => series.push(Series {
                name: policy.to_string(),
                points: vec![(vcpus, t)],
            }),
        }
    }
    if series.is_empty() {
        return None;
    }
    for s in &mut series {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    Some(LineChart {
        title: "Seed 002: dirty memory time per vCPU count".into(),
        x_label: "vCPUs".into(),
        y_label: "dirty memory time, median (ms)".into(),
        series,
        phases: Vec::new(),
        log_y: false,
    })
}

/// Seed 004 (`dirty-log-perf -e`): eager split against split on fault for
/// every timed case. `None` when the report has no such rows.
pub(super) fn eager_vs_fault(report: &Value) -> Option<BarChart> {
    let rows = report["results"].as_array()?;
    let policies = ["eager_split", "split_on_fault"];
    let mut categories: Vec<String> = Vec::new();
    for r in rows {
        let (Some(case), Some(policy)) = (r["case"].as_str(), r["policy"].as_str()) else {
            continue;
        };
        if policies.contains(&policy) && ms(r).is_some() && !categories.iter().any(|c| c == case) {
            categories.push(case.to_string());
        }
    }
    let value = |case: &str, policy: &str| {
        rows.iter()
            .find(|r| r["case"] == case && r["policy"] == policy)
            .and_then(ms)
    };
    // Only the cases both policies measured.
    categories.retain(|c| policies.iter().all(|p| value(c, p).is_some()));
    if categories.is_empty() {
        return None;
    }
    let groups = policies
        .iter()
        .map(|p| {
            let v = categories
                .iter()
                .map(|c| value(c, p).unwrap_or(0.0))
                .collect();
            (p.to_string(), v)
        })
        .collect();
    Some(BarChart {
        title: "Seed 004: eager split vs split on fault".into(),
        y_label: "median (ms)".into(),
        categories: categories.iter().map(|c| c.replace('_', " ")).collect(),
        groups,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn seed_002_rows_become_one_line_per_policy() {
        let r = json!({"results": [
            {"case": "vcpus_2", "policy": "fast_path", "vcpus": 2, "median_ns": 2e6},
            {"case": "vcpus_1", "policy": "fast_path", "vcpus": 1, "value_ns": 1e6},
            {"case": "vcpus_1", "policy": "write_lock", "vcpus": 1, "median_ns": 3e6},
        ]});
        let c = vcpu_scaling(&r).unwrap();
        assert_eq!(c.series.len(), 2);
        assert_eq!(c.series[0].points, vec![(1.0, 1.0), (2.0, 2.0)]);
        assert!(vcpu_scaling(&json!({"results": []})).is_none());
    }

    #[test]
    fn seed_004_keeps_the_cases_both_policies_measured() {
        let r = json!({"results": [
            {"case": "first_pass", "policy": "eager_split", "median_ns": 6e6},
            {"case": "first_pass", "policy": "split_on_fault", "median_ns": 27e6},
            {"case": "only_one", "policy": "eager_split", "median_ns": 1e6},
            {"case": "eager_detail", "policy": "eager_split", "line": "x"},
        ]});
        let c = eager_vs_fault(&r).unwrap();
        assert_eq!(c.categories, vec!["first pass"]);
        assert_eq!(c.groups[1], ("split_on_fault".to_string(), vec![27.0]));
    }
}
