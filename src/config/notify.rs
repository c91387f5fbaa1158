//! `[notify]`: the webhook tributary POSTs after runs, and how its deliveries are retried.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use tributary_providers::bounds::duration_in;
use url::Url;

/// The shortest signing secret accepted: a shorter one could be guessed from signatures.
pub(crate) const MIN_SECRET_BYTES: usize = 16;

/// The ranges of the `[notify]` durations.
pub mod limits {
    use std::time::Duration;

    const HOUR: u64 = 60 * 60;
    const DAY: u64 = 24 * HOUR;

    /// `notify.timeout`: one POST, from connecting to the end of the answer.
    pub const TIMEOUT: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(300));
    /// `notify.give_up_after`, counted from when the run closed.
    pub const GIVE_UP_AFTER: (Duration, Duration) =
        (Duration::from_secs(1), Duration::from_secs(30 * DAY));
    /// `notify.retry_initial_delay` and `notify.retry_max_delay`.
    pub const RETRY_DELAY: (Duration, Duration) =
        (Duration::from_millis(1), Duration::from_secs(DAY));
    /// `notify.poll_interval`.
    pub const POLL_INTERVAL: (Duration, Duration) =
        (Duration::from_millis(10), Duration::from_secs(HOUR));
    /// `notify.keep_delivered` (a year of 365.25 days, as durations are written).
    pub const KEEP_DELIVERED: (Duration, Duration) = (
        Duration::from_secs(1),
        Duration::from_secs(100 * 31_557_600),
    );
    /// `notify.max_concurrent_deliveries`: deliveries of different connections in flight
    /// at once, per daemon.
    pub const CONCURRENT_DELIVERIES: (usize, usize) = (1, 256);
}

/// Which runs write a notification.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NotifyRuns {
    /// No `[notify]` table: none.
    #[default]
    None,
    /// Runs that inserted, updated, deleted, restored or failed records.
    Changed,
    /// Every run (`always = true`).
    All,
}

/// `[notify]`. Holds the name of the secret's variable, never the secret; its `Debug`
/// shows the URL redacted.
#[derive(Clone)]
pub struct NotifySettings {
    /// Where deliveries are POSTed.
    pub url: Url,
    /// The environment variable that holds the signing secret.
    pub secret_env: String,
    /// Also notify runs that changed nothing.
    pub always: bool,
    /// The limit of one POST.
    pub timeout: Duration,
    /// A delivery still failing this long after its run closed is given up (`failed`).
    pub give_up_after: Duration,
    /// The wait after the first failed attempt; it doubles, with jitter, each attempt.
    pub retry_initial_delay: Duration,
    /// The longest wait between two attempts.
    pub retry_max_delay: Duration,
    /// How often the daemon looks for deliveries that are due.
    pub poll_interval: Duration,
    /// The older name of `[retention] deliveries`, when given.
    pub keep_delivered: Option<Duration>,
    /// The most deliveries a daemon has in flight at once, each of another connection.
    pub max_concurrent_deliveries: usize,
}

impl std::fmt::Debug for NotifySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NotifySettings")
            .field("url", &super::redact::redact_url(self.url.as_str()))
            .field("secret_env", &self.secret_env)
            .field("always", &self.always)
            .field("timeout", &self.timeout)
            .field("give_up_after", &self.give_up_after)
            .field("retry_initial_delay", &self.retry_initial_delay)
            .field("retry_max_delay", &self.retry_max_delay)
            .field("poll_interval", &self.poll_interval)
            .field("keep_delivered", &self.keep_delivered)
            .field("max_concurrent_deliveries", &self.max_concurrent_deliveries)
            .finish()
    }
}

impl NotifySettings {
    /// Which runs notify under these settings.
    pub fn runs(&self) -> NotifyRuns {
        if self.always {
            NotifyRuns::All
        } else {
            NotifyRuns::Changed
        }
    }

    /// Reads the signing secret from `secret_env`. The error names the variable and what
    /// is wrong with it, never its value.
    pub fn signing_secret(&self) -> Result<SecretString, String> {
        let name = &self.secret_env;
        let secret = super::secret_env::secret_from_env(name)?;
        let length = secret.expose_secret().len();
        if length < MIN_SECRET_BYTES {
            return Err(format!(
                "environment variable {name} holds {length} bytes; a signing secret needs at least {MIN_SECRET_BYTES}"
            ));
        }
        Ok(secret)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNotifySettings {
    url: Option<String>,
    secret_env: Option<String>,
    #[serde(default)]
    always: bool,
    #[serde(default = "default_timeout", with = "humantime_serde")]
    timeout: Duration,
    #[serde(default = "default_give_up_after", with = "humantime_serde")]
    give_up_after: Duration,
    #[serde(default = "default_retry_initial_delay", with = "humantime_serde")]
    retry_initial_delay: Duration,
    #[serde(default = "default_retry_max_delay", with = "humantime_serde")]
    retry_max_delay: Duration,
    #[serde(default = "default_poll_interval", with = "humantime_serde")]
    poll_interval: Duration,
    #[serde(default, with = "humantime_serde")]
    keep_delivered: Option<Duration>,
    #[serde(default = "default_max_concurrent_deliveries")]
    max_concurrent_deliveries: usize,
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_give_up_after() -> Duration {
    Duration::from_secs(24 * 60 * 60)
}
fn default_retry_initial_delay() -> Duration {
    Duration::from_secs(5)
}
fn default_retry_max_delay() -> Duration {
    Duration::from_secs(15 * 60)
}
fn default_poll_interval() -> Duration {
    Duration::from_secs(1)
}
fn default_max_concurrent_deliveries() -> usize {
    8
}

/// Validates a `[notify]` table; errors are `(key, message)`.
pub(super) fn parse(
    raw: RawNotifySettings,
    env_is_set: &dyn Fn(&str) -> bool,
) -> Result<NotifySettings, (String, String)> {
    let at = |key: &str| {
        let key = format!("notify.{key}");
        move |message: String| (key.clone(), message)
    };
    let url = raw
        .url
        .ok_or_else(|| "missing: expected the https URL deliveries are POSTed to".to_string())
        .and_then(|text| validate_url(&text))
        .map_err(at("url"))?;
    let secret_env = raw
        .secret_env
        .filter(|name| !name.trim().is_empty())
        .ok_or_else(|| {
            "missing: expected the environment variable that holds the signing secret".to_string()
        })
        .map_err(at("secret_env"))?;
    if !env_is_set(&secret_env) {
        return Err(at("secret_env")(format!(
            "environment variable {secret_env} is not set"
        )));
    }
    let ranges = [
        ("timeout", raw.timeout, limits::TIMEOUT),
        ("give_up_after", raw.give_up_after, limits::GIVE_UP_AFTER),
        (
            "retry_initial_delay",
            raw.retry_initial_delay,
            limits::RETRY_DELAY,
        ),
        ("retry_max_delay", raw.retry_max_delay, limits::RETRY_DELAY),
        ("poll_interval", raw.poll_interval, limits::POLL_INTERVAL),
    ];
    for (key, value, (min, max)) in ranges {
        duration_in(value, min, max).map_err(at(key))?;
    }
    if let Some(keep_delivered) = raw.keep_delivered {
        let (min, max) = limits::KEEP_DELIVERED;
        duration_in(keep_delivered, min, max).map_err(at("keep_delivered"))?;
    }
    let (min, max) = limits::CONCURRENT_DELIVERIES;
    tributary_providers::bounds::count_in(raw.max_concurrent_deliveries, min, max)
        .map_err(at("max_concurrent_deliveries"))?;
    if raw.retry_max_delay < raw.retry_initial_delay {
        return Err(at("retry_max_delay")(
            "must be at least retry_initial_delay".to_string(),
        ));
    }
    Ok(NotifySettings {
        url,
        secret_env,
        always: raw.always,
        timeout: raw.timeout,
        give_up_after: raw.give_up_after,
        retry_initial_delay: raw.retry_initial_delay,
        retry_max_delay: raw.retry_max_delay,
        poll_interval: raw.poll_interval,
        keep_delivered: raw.keep_delivered,
        max_concurrent_deliveries: raw.max_concurrent_deliveries,
    })
}

/// An https URL, or http on loopback only, as the adapters' `base_url`: a delivery to
/// another host in clear could be read and replayed on the way.
fn validate_url(text: &str) -> Result<Url, String> {
    let url = Url::parse(text).map_err(|error| format!("not a URL ({error})"))?;
    match url.scheme() {
        "https" => {}
        "http" if tributary_providers::is_loopback(&url) => {}
        "http" => {
            return Err(format!(
                "must be an https URL: plain http is allowed only on loopback (127.0.0.1, ::1, \
                 localhost), since the notifications would travel in clear to {}",
                url.host_str().unwrap_or_default()
            ))
        }
        other => return Err(format!("must be an https URL, not {other}:")),
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("must name a host".to_string());
    }
    Ok(url)
}
