//! `[retention]`: how long the history tables (and the API's audit) keep their rows, and when the daemon sweeps
//! them (`crate::retention`).

use std::time::Duration;

use serde::Deserialize;
use tributary_providers::bounds::{count_in, duration_in};

const HOUR: u64 = 60 * 60;
const DAY: u64 = 24 * HOUR;
/// A hundred years of 365.25 days, as durations are written.
const CENTURY: u64 = 100 * 31_557_600;

/// The ranges of the `[retention]` keys.
pub mod limits {
    use std::time::Duration;

    use super::{CENTURY, HOUR};

    /// `runs`, `resolved_errors`, `open_errors`, `deliveries`, `audit` and `webhooks`: at least an hour, so a
    /// run or delivery can be looked at after it ends.
    pub const HISTORY: (Duration, Duration) =
        (Duration::from_secs(HOUR), Duration::from_secs(CENTURY));
    /// `batch_size`: rows one statement deletes. Small, so no statement holds a lock
    /// for long; at most 10,000, far below every backend's bound-parameter limit.
    pub const BATCH_SIZE: (usize, usize) = (1, 10_000);
}

/// `[retention]`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetentionSettings {
    /// How long a run stays in `sync_runs` after it started. The last run of every
    /// connection and stream, a run with errors still kept, and a replay that resolved
    /// kept errors stay whatever their age.
    pub runs: Duration,
    /// How long a resolved error stays in `run_errors`, counted from when it was recorded.
    pub resolved_errors: Duration,
    /// How long an open error stays; `None`: until a replay resolves it.
    pub open_errors: Option<Duration>,
    /// How long a delivered or given-up notification stays in `notification_deliveries`
    /// after it was delivered or given up. Pending ones always stay.
    pub deliveries: Duration,
    /// How long a row stays in `api_audit` (one per write request made to the API) after
    /// it was answered.
    pub audit: Duration,
    /// How long an inbound webhook delivery stays in `webhook_deliveries` after it was
    /// received, once applied or unmatched. Received (not yet applied) and failed ones
    /// always stay.
    pub webhooks: Duration,
    /// How long a finished job stays in `sync_jobs` after it finished: `[daemon]
    /// keep_jobs`, the key it had before this table. Queued and running ones always stay.
    pub jobs: Duration,
    /// The most rows one delete statement removes.
    pub batch_size: usize,
    /// When the daemon sweeps: cron with seconds.
    pub sweep_schedule: String,
}

impl Default for RetentionSettings {
    fn default() -> Self {
        RetentionSettings {
            runs: Duration::from_secs(90 * DAY),
            resolved_errors: Duration::from_secs(30 * DAY),
            open_errors: None,
            deliveries: Duration::from_secs(30 * DAY),
            audit: Duration::from_secs(90 * DAY),
            webhooks: Duration::from_secs(7 * DAY),
            jobs: Duration::from_secs(7 * DAY),
            batch_size: 1_000,
            sweep_schedule: "0 37 * * * *".to_string(),
        }
    }
}

/// `[retention]` as written; absent keys take [`RetentionSettings::default`]'s values.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRetentionSettings {
    #[serde(default, with = "humantime_serde")]
    runs: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    resolved_errors: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    open_errors: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    deliveries: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    audit: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    webhooks: Option<Duration>,
    batch_size: Option<usize>,
    sweep_schedule: Option<String>,
}

/// Validates `raw`; `keep_delivered` is `[notify] keep_delivered`, the older name of
/// `deliveries`, and `validate_cron` the check of a cron expression. Errors are
/// `(key, message)`.
pub(super) fn parse(
    raw: RawRetentionSettings,
    keep_delivered: Option<Duration>,
    validate_cron: impl Fn(&str) -> Result<(), String>,
) -> Result<RetentionSettings, (String, String)> {
    let defaults = RetentionSettings::default();
    let at = |key: &str| {
        let key = format!("retention.{key}");
        move |message| (key, message)
    };
    // A `keep_delivered` was checked against `[notify]`'s own range, which it keeps.
    let (deliveries, deliveries_key) = match (raw.deliveries, keep_delivered) {
        (Some(_), Some(_)) => {
            return Err((
                "notify.keep_delivered".to_string(),
                "is the older name of retention.deliveries; set only retention.deliveries"
                    .to_string(),
            ))
        }
        (Some(deliveries), None) => (deliveries, Some("deliveries")),
        (None, Some(keep_delivered)) => (keep_delivered, None),
        (None, None) => (defaults.deliveries, None),
    };
    let settings = RetentionSettings {
        runs: raw.runs.unwrap_or(defaults.runs),
        resolved_errors: raw.resolved_errors.unwrap_or(defaults.resolved_errors),
        open_errors: raw.open_errors,
        deliveries,
        audit: raw.audit.unwrap_or(defaults.audit),
        webhooks: raw.webhooks.unwrap_or(defaults.webhooks),
        jobs: defaults.jobs,
        batch_size: raw.batch_size.unwrap_or(defaults.batch_size),
        sweep_schedule: raw.sweep_schedule.unwrap_or(defaults.sweep_schedule),
    };
    let (min, max) = limits::HISTORY;
    let mut durations = vec![
        ("runs", settings.runs),
        ("resolved_errors", settings.resolved_errors),
        ("audit", settings.audit),
        ("webhooks", settings.webhooks),
    ];
    if let Some(key) = deliveries_key {
        durations.push((key, settings.deliveries));
    }
    if let Some(open_errors) = settings.open_errors {
        durations.push(("open_errors", open_errors));
    }
    for (key, value) in durations {
        duration_in(value, min, max).map_err(at(key))?;
    }
    let (min, max) = limits::BATCH_SIZE;
    count_in(settings.batch_size, min, max).map_err(at("batch_size"))?;
    validate_cron(&settings.sweep_schedule).map_err(at("sweep_schedule"))?;
    Ok(settings)
}
