//! Metrics: their names, labels and the one place each is recorded. They go through the
//! `metrics` facade, so they cost nothing unless a recorder is installed (the daemon
//! installs a Prometheus one when `[daemon] listen` is set). The events are plain structs,
//! so this module depends on nothing of ours and every layer may record. Traces are in
//! [`traces`].

use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

mod traces;
pub(crate) use traces::{continue_trace, layer, traceparent_of, TraceExport, Traces, TRACEPARENT};

/// Runs by provider, stream and final status. Every run metric carries `provider` and
/// `stream`: both come from config.toml, so their values are bounded (never user ids).
pub const RUNS_TOTAL: &str = "tributary_runs_total";
/// Records by provider, stream and outcome (inserted, updated, unchanged, duplicate, failed,
/// deleted, restored).
pub const RECORDS_TOTAL: &str = "tributary_records_total";
/// Run duration in seconds, by provider and stream.
pub const RUN_DURATION_SECONDS: &str = "tributary_run_duration_seconds";
/// Unix time of the last run per provider and stream that walked its whole listing.
pub const LAST_SUCCESS_TIMESTAMP: &str = "tributary_last_success_timestamp_seconds";
/// Connections skipped by a firing because a run of theirs was still going.
pub const SKIPPED_TOTAL: &str = "tributary_connections_skipped_total";
/// Runs ended by a panic, by provider and stream.
pub const RUN_PANICS_TOTAL: &str = "tributary_run_panics_total";
/// Pages whose fast write path failed, by path (`all_new`, `usual`) and reason
/// (`key_conflict`, `refused_row`, `row_gone`, `contention`: written again the careful
/// way; `unexpected`: the page failed).
pub const STORE_FAST_PATH_FALLBACKS_TOTAL: &str = "tributary_store_fast_path_fallbacks_total";
/// Notification attempts by outcome (`delivered`, `retrying`, `given_up`).
pub const NOTIFICATION_ATTEMPTS_TOTAL: &str = "tributary_notification_attempts_total";

/// Inbound webhook deliveries by provider (a configured name, so bounded) and outcome
/// (`accepted`, `duplicate`, `unauthorized`, `stale`, `malformed`, `too_large`, `limited`,
/// `handshake`, `error`).
pub const WEBHOOK_DELIVERIES_TOTAL: &str = "tributary_webhook_deliveries_total";

/// Seconds since the oldest inbound webhook delivery still waiting to be applied (status
/// `received`) was received, by provider; 0 when none waits. Set as `/metrics` is read.
pub const WEBHOOK_LAG_SECONDS: &str = "tributary_webhook_lag_seconds";

/// Connections whose authorization the provider revoked (`needs_reconnect`), by provider.
/// Set as `/metrics` is read.
pub const CONNECTIONS_NEEDING_RECONNECT: &str = "tributary_connections_needing_reconnect";

/// Statements this process sent to the database through its main pool, counted from the
/// daemon's start when `[daemon] listen` is set (per statement, not per transaction).
pub(crate) const DATABASE_STATEMENTS_TOTAL: &str = "tributary_database_statements_total";

/// The counter of [`DATABASE_STATEMENTS_TOTAL`]: each increment is one atomic add, so the
/// pools may count every statement they send.
pub(crate) fn statement_counter() -> metrics::Counter {
    metrics::counter!(DATABASE_STATEMENTS_TOTAL)
}

/// Installs the Prometheus recorder for this process and returns the handle that renders
/// `/metrics`.
pub fn install_prometheus() -> Result<PrometheusHandle, String> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(RUN_DURATION_SECONDS.to_string()),
            &[0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0],
        )
        .map_err(|error| error.to_string())?
        .install_recorder()
        .map_err(|error| error.to_string())
}

/// A finished run, as the metrics see it.
#[derive(Clone, Debug)]
pub struct RunFinished<'a> {
    pub provider: &'a str,
    pub stream: &'a str,
    /// The final status (`succeeded`, `partial`, `failed`, `interrupted`, `deferred`).
    pub status: String,
    pub inserted: u64,
    pub updated: u64,
    pub unchanged: u64,
    pub duplicate: u64,
    pub failed: u64,
    pub deleted: u64,
    pub restored: u64,
    /// The run was ended by a panic.
    pub panicked: bool,
    pub elapsed: Duration,
    /// The run walked its whole listing.
    pub listing_complete: bool,
}

/// Records one finished run.
pub fn record_run(run: &RunFinished<'_>) {
    let provider = run.provider.to_string();
    let stream = run.stream.to_string();
    metrics::counter!(RUNS_TOTAL, "provider" => provider.clone(), "stream" => stream.clone(), "status" => run.status.clone())
        .increment(1);
    for (name, value) in [
        ("inserted", run.inserted),
        ("updated", run.updated),
        ("unchanged", run.unchanged),
        ("duplicate", run.duplicate),
        ("failed", run.failed),
        ("deleted", run.deleted),
        ("restored", run.restored),
    ] {
        metrics::counter!(RECORDS_TOTAL, "provider" => provider.clone(), "stream" => stream.clone(), "outcome" => name)
            .increment(value);
    }
    if run.panicked {
        metrics::counter!(RUN_PANICS_TOTAL, "provider" => provider.clone(), "stream" => stream.clone())
            .increment(1);
    }
    metrics::histogram!(RUN_DURATION_SECONDS, "provider" => provider.clone(), "stream" => stream.clone())
        .record(run.elapsed.as_secs_f64());
    if run.listing_complete {
        metrics::gauge!(LAST_SUCCESS_TIMESTAMP, "provider" => provider, "stream" => stream)
            .set(chrono::Utc::now().timestamp() as f64);
    }
}

/// Records a connection skipped because its lease was held.
pub fn record_skip(provider: &str) {
    metrics::counter!(SKIPPED_TOTAL, "provider" => provider.to_string()).increment(1);
}

/// Records a page whose fast write path `path` failed for `reason`.
pub fn record_fast_path_fallback(path: &'static str, reason: &'static str) {
    metrics::counter!(STORE_FAST_PATH_FALLBACKS_TOTAL, "path" => path, "reason" => reason)
        .increment(1);
}

/// Records one notification attempt that ended in `outcome`.
pub fn record_notification_attempt(outcome: &'static str) {
    metrics::counter!(NOTIFICATION_ATTEMPTS_TOTAL, "outcome" => outcome).increment(1);
}

/// Records the age of `provider`'s oldest delivery not yet applied (zero when none waits).
pub fn record_webhook_lag(provider: &str, age: Duration) {
    metrics::gauge!(WEBHOOK_LAG_SECONDS, "provider" => provider.to_string()).set(age.as_secs_f64());
}

/// Records one inbound webhook delivery of `provider` that ended in `outcome`.
pub fn record_webhook_delivery(provider: &str, outcome: &'static str) {
    metrics::counter!(WEBHOOK_DELIVERIES_TOTAL, "provider" => provider.to_string(), "outcome" => outcome)
        .increment(1);
}

/// Records how many of `provider`'s connections need a reconnect.
pub fn record_needs_reconnect(provider: &str, count: i64) {
    metrics::gauge!(CONNECTIONS_NEEDING_RECONNECT, "provider" => provider.to_string())
        .set(count as f64);
}
