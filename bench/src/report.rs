//! What a benchmark run reports: per phase the throughput, the checks and the peak RSS,
//! as a table and as JSON.

use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, CellAlignment, Table};
use serde::{Deserialize, Serialize};

use super::verify::Check;

/// One configuration (users x records on one database), run in one process.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScaleReport {
    pub users: u32,
    pub records_per_user: u64,
    pub total_records: u64,
    /// `sqlite`, `postgres` or `mysql`.
    pub backend: String,
    /// The database URL, password redacted.
    pub database: String,
    pub concurrency: usize,
    pub latency_ms: u64,
    pub seed: u64,
    pub phases: Vec<PhaseReport>,
    /// The process's peak resident set (VmHWM) at the end, in bytes (`None` off Linux).
    pub peak_rss_bytes: Option<u64>,
    /// Every check of every phase passed.
    pub checks_passed: bool,
    /// On PostgreSQL over TLS: the first sync against one without TLS, in the same run.
    #[serde(default)]
    pub postgres_tls: Option<TlsComparison>,
}

/// A first sync over TLS against the same first sync without TLS, timed in one run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TlsComparison {
    pub tls_seconds: f64,
    pub no_tls_seconds: f64,
    /// `tls_seconds / no_tls_seconds`: 1.0 when TLS costs nothing.
    pub first_sync_ratio: f64,
}

impl TlsComparison {
    pub fn new(tls_seconds: f64, no_tls_seconds: f64) -> TlsComparison {
        TlsComparison {
            tls_seconds,
            no_tls_seconds,
            first_sync_ratio: tls_seconds / no_tls_seconds.max(1e-9),
        }
    }
}

/// The line of each report that compared TLS with no TLS.
pub fn tls_notes(reports: &[ScaleReport]) -> Vec<String> {
    reports
        .iter()
        .filter_map(|report| {
            let tls = report.postgres_tls?;
            Some(format!(
                "{} on {}: first sync over TLS / without TLS = {:.2} ({:.2} s / {:.2} s)",
                scale_label(report),
                report.backend,
                tls.first_sync_ratio,
                tls.tls_seconds,
                tls.no_tls_seconds
            ))
        })
        .collect()
}

/// One phase: a full sync of every connection.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PhaseReport {
    /// `first`, `unchanged` or `changed_10pct`.
    pub name: String,
    pub seconds: f64,
    pub records: u64,
    pub records_per_sec: f64,
    pub pages: u64,
    pub inserted: u64,
    pub updated: u64,
    pub unchanged: u64,
    pub failed: u64,
    /// Rows written to `records` as counted by triggers (only measured for `unchanged`).
    pub records_rows_written: Option<i64>,
    /// With an emulated latency: the time the pages' latencies add up to one after the
    /// other, and that divided by the concurrency (the floor the latency sets).
    pub sequential_latency_seconds: f64,
    pub latency_floor_seconds: f64,
    /// VmHWM after the phase (process-wide, so it never goes down).
    pub peak_rss_bytes: Option<u64>,
    pub checks: Vec<Check>,
}

/// A value of `/proc/self/status` in bytes (`VmHWM`, `VmRSS`), `None` where unavailable.
pub fn proc_status_bytes(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(key)?.strip_prefix(':')?;
        let kib: u64 = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
        Some(kib * 1024)
    })
}

/// The process's peak resident set size so far.
pub fn peak_rss() -> Option<u64> {
    proc_status_bytes("VmHWM")
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or_else(
        || "n/a".to_string(),
        |b| format!("{:.1}", b as f64 / 1048576.0),
    )
}

fn scale_label(report: &ScaleReport) -> String {
    let total = report.total_records;
    let total = if total >= 1_000_000 && total.is_multiple_of(1_000_000) {
        format!("{}M", total / 1_000_000)
    } else if total >= 1000 && total.is_multiple_of(1000) {
        format!("{}k", total / 1000)
    } else {
        total.to_string()
    };
    format!("{total} ({}x{})", report.users, report.records_per_user)
}

/// The results of several configurations as one table.
pub fn table(reports: &[ScaleReport]) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header(vec![
        "records",
        "database",
        "conc.",
        "latency",
        "phase",
        "seconds",
        "records/s",
        "peak RSS MiB",
        "checks",
    ]);
    for report in reports {
        for phase in &report.phases {
            let failed: Vec<&str> = phase
                .checks
                .iter()
                .filter(|check| !check.passed)
                .map(|check| check.name.as_str())
                .collect();
            let checks = if failed.is_empty() {
                format!("ok ({})", phase.checks.len())
            } else {
                format!("FAILED: {}", failed.join(", "))
            };
            table.add_row(vec![
                Cell::new(scale_label(report)),
                Cell::new(&report.backend),
                Cell::new(report.concurrency).set_alignment(CellAlignment::Right),
                Cell::new(format!("{} ms", report.latency_ms)).set_alignment(CellAlignment::Right),
                Cell::new(&phase.name),
                Cell::new(format!("{:.2}", phase.seconds)).set_alignment(CellAlignment::Right),
                Cell::new(format!("{:.0}", phase.records_per_sec))
                    .set_alignment(CellAlignment::Right),
                Cell::new(mib(phase.peak_rss_bytes)).set_alignment(CellAlignment::Right),
                Cell::new(checks),
            ]);
        }
    }
    table
}

/// Lines about the emulated latency: how long the pages' latencies would take one after
/// the other, against the time the phase took. Only phases that fetched from the API have
/// them (`store_only` fetches nothing).
pub fn latency_notes(reports: &[ScaleReport]) -> Vec<String> {
    let mut notes = Vec::new();
    for report in reports.iter().filter(|report| report.latency_ms > 0) {
        for phase in report
            .phases
            .iter()
            .filter(|phase| phase.sequential_latency_seconds > 0.0)
        {
            notes.push(format!(
                "{} on {}, {}: {} pages x {} ms = {:.0} s of latency one after the other; \
                 {:.1} s at concurrency {}; took {:.1} s",
                scale_label(report),
                report.backend,
                phase.name,
                phase.pages,
                report.latency_ms,
                phase.sequential_latency_seconds,
                phase.latency_floor_seconds,
                report.concurrency,
                phase.seconds
            ));
        }
    }
    notes
}

/// The API phase against direct SQL in the same run: the target is at least 0.5.
pub fn api_notes(reports: &[ScaleReport]) -> Vec<String> {
    let mut notes = Vec::new();
    for report in reports {
        let rate = |name: &str| {
            report
                .phases
                .iter()
                .find(|phase| phase.name == name)
                .map(|phase| phase.records_per_sec)
        };
        if let (Some(api), Some(sql)) = (rate("api_records"), rate("direct_sql")) {
            notes.push(format!(
                "{}: records read through the API / with SQL directly = {:.2} (target at least 0.5)",
                scale_label(report),
                api / sql.max(1e-9)
            ));
        }
    }
    notes
}

/// Every failed check, as `phase: name (detail)` lines.
pub fn failures(report: &ScaleReport) -> Vec<String> {
    report
        .phases
        .iter()
        .flat_map(|phase| {
            phase
                .checks
                .iter()
                .filter(|check| !check.passed)
                .map(move |check| format!("{}: {} ({})", phase.name, check.name, check.detail))
        })
        .collect()
}
