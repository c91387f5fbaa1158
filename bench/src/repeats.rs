//! `tributary-bench --matrix --repeat N`: one configuration run N times, summed up as its
//! median. One phase at 100k records lasts under a second and a single run of it strays
//! widely on a shared machine, so a figure worth quoting is a median with its range.

use super::report::{PhaseReport, ScaleReport, TlsComparison};

/// The runs of one configuration as one report: each phase's median seconds and
/// records/s, the highest peak RSS, and each phase's checks from a run where one failed,
/// if any did (so the table shows the failure). `None` for no runs.
pub fn median_report(runs: &[ScaleReport]) -> Option<ScaleReport> {
    let mut summary = runs.first()?.clone();
    for (index, phase) in summary.phases.iter_mut().enumerate() {
        let of_phase = |value: fn(&PhaseReport) -> f64| {
            median(
                runs.iter()
                    .filter_map(|run| run.phases.get(index))
                    .map(value),
            )
        };
        phase.records_per_sec = of_phase(|phase| phase.records_per_sec);
        phase.seconds = of_phase(|phase| phase.seconds);
        phase.peak_rss_bytes = runs
            .iter()
            .filter_map(|run| run.phases.get(index)?.peak_rss_bytes)
            .max();
        let failing = runs
            .iter()
            .filter_map(|run| run.phases.get(index))
            .find(|phase| phase.checks.iter().any(|check| !check.passed));
        if let Some(failing) = failing {
            phase.checks = failing.checks.clone();
        }
    }
    summary.peak_rss_bytes = runs.iter().filter_map(|run| run.peak_rss_bytes).max();
    let tls: Vec<_> = runs.iter().filter_map(|run| run.postgres_tls).collect();
    if !tls.is_empty() {
        summary.postgres_tls = Some(TlsComparison {
            tls_seconds: median(tls.iter().map(|tls| tls.tls_seconds)),
            no_tls_seconds: median(tls.iter().map(|tls| tls.no_tls_seconds)),
            first_sync_ratio: median(tls.iter().map(|tls| tls.first_sync_ratio)),
        });
    }
    summary.checks_passed = runs.iter().all(|run| run.checks_passed);
    Some(summary)
}

/// "first 93–109k, unchanged 280–339k, ..." over the runs of one configuration.
pub fn ranges(runs: &[ScaleReport]) -> String {
    let Some(first) = runs.first() else {
        return String::new();
    };
    let phases: Vec<String> = first
        .phases
        .iter()
        .enumerate()
        .map(|(index, phase)| {
            let rates: Vec<f64> = runs
                .iter()
                .filter_map(|run| Some(run.phases.get(index)?.records_per_sec))
                .collect();
            let low = rates.iter().copied().fold(f64::INFINITY, f64::min);
            let high = rates.iter().copied().fold(0.0, f64::max);
            format!("{} {:.0}–{:.0}k", phase.name, low / 1e3, high / 1e3)
        })
        .collect();
    format!(
        "{} x {} on {}, latency {} ms, {} runs: {} records/s",
        first.users,
        first.records_per_user,
        first.backend,
        first.latency_ms,
        runs.len(),
        phases.join(", ")
    )
}

/// The median of `values` (the mean of the middle two for an even count); 0 for none.
fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::Check;

    fn run(rates: [f64; 2], rss: u64, checks_passed: bool) -> ScaleReport {
        let phase = |name: &str, rate: f64| PhaseReport {
            name: name.to_string(),
            seconds: 100_000.0 / rate,
            records: 100_000,
            records_per_sec: rate,
            pages: 1_000,
            inserted: 0,
            updated: 0,
            unchanged: 0,
            failed: 0,
            records_rows_written: None,
            sequential_latency_seconds: 0.0,
            latency_floor_seconds: 0.0,
            peak_rss_bytes: Some(rss),
            checks: Vec::new(),
        };
        ScaleReport {
            users: 10,
            records_per_user: 10_000,
            total_records: 100_000,
            backend: "sqlite".to_string(),
            database: "sqlite://bench.db".to_string(),
            concurrency: 4,
            latency_ms: 0,
            seed: 1,
            phases: vec![phase("first", rates[0]), phase("unchanged", rates[1])],
            peak_rss_bytes: Some(rss),
            checks_passed,
            postgres_tls: None,
        }
    }

    #[test]
    fn runs_sum_up_as_medians_with_the_highest_memory_and_every_check() {
        let mut runs = [
            run([110_000.0, 300_000.0], 25, true),
            run([90_000.0, 340_000.0], 27, true),
            run([100_000.0, 280_000.0], 26, false),
        ];
        runs[2].phases[1].checks.push(Check {
            name: "duplicate keys".to_string(),
            passed: false,
            detail: "1 key twice".to_string(),
        });
        let summary = median_report(&runs).unwrap();
        let rates: Vec<f64> = summary.phases.iter().map(|p| p.records_per_sec).collect();
        assert_eq!(rates, [100_000.0, 300_000.0]);
        assert_eq!(summary.phases[0].seconds, 1.0);
        assert_eq!(summary.peak_rss_bytes, Some(27));
        assert_eq!(summary.phases[1].peak_rss_bytes, Some(27));
        assert!(!summary.checks_passed, "one run's checks failed");
        assert!(summary.phases[0].checks.is_empty());
        let shown: Vec<(&str, bool)> = summary.phases[1]
            .checks
            .iter()
            .map(|check| (check.name.as_str(), check.passed))
            .collect();
        assert_eq!(shown, [("duplicate keys", false)]);
        assert_eq!(
            ranges(&runs),
            "10 x 10000 on sqlite, latency 0 ms, 3 runs: first 90–110k, unchanged 280–340k \
             records/s"
        );
        assert!(median_report(&[]).is_none());
    }

    #[test]
    fn an_even_number_of_runs_takes_the_middle_two() {
        let runs = [
            run([100_000.0, 1.0], 1, true),
            run([120_000.0, 1.0], 1, true),
        ];
        let summary = median_report(&runs).unwrap();
        assert_eq!(summary.phases[0].records_per_sec, 110_000.0);
        assert!(summary.checks_passed);
    }

    #[test]
    fn latency_notes_leave_out_the_phase_that_fetches_nothing() {
        let mut report = run([100_000.0, 200_000.0], 1, true);
        report.latency_ms = 20;
        report.phases[0].sequential_latency_seconds = 20.0;
        report.phases[0].latency_floor_seconds = 5.0;
        // As `store_only` reports it: no page came from the API.
        report.phases[1].name = "store_only".to_string();
        let notes = crate::report::latency_notes(&[report]);
        assert_eq!(
            notes,
            ["100k (10x10000) on sqlite, first: 1000 pages x 20 ms = 20 s of latency one after the \
              other; 5.0 s at concurrency 4; took 1.0 s"]
        );
    }
}
