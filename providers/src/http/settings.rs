//! [`HttpSettings`]: the `[providers.NAME.http]` table, with its defaults and validation.

use std::time::Duration;

use reqwest::header::HeaderValue;
use serde::Deserialize;

/// The default `max_records_per_page`: far more than any API pages by (they give 100 to
/// 1,000), and few enough that a page of tiny records stays small in memory.
pub const DEFAULT_MAX_RECORDS_PER_PAGE: usize = 10_000;
/// The largest `max_records_per_page` allowed.
pub const MAX_RECORDS_PER_PAGE: usize = 1_000_000;

/// The smallest `requests_per_second`: one request a day.
pub const MIN_REQUESTS_PER_SECOND: f64 = 1.0 / 86_400.0;

/// Per-provider HTTP settings: `[providers.NAME.http]` in config.toml.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpSettings {
    /// Whole-request timeout (humantime string, e.g. "30s"). Default 30s.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Connect timeout. Default 10s.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Retries after the first attempt for connection errors, timeouts, 5xx, 429 and
    /// unparseable bodies. Default 4.
    pub max_retries: u32,
    /// First backoff delay; doubles each retry, with jitter. Default 500ms.
    #[serde(with = "humantime_serde")]
    pub retry_initial_delay: Duration,
    /// Backoff cap. Default 30s.
    #[serde(with = "humantime_serde")]
    pub retry_max_delay: Duration,
    /// The longest Retry-After the client will wait; a longer one ends the fetch with
    /// FetchError::RateLimited. Default 5m.
    #[serde(with = "humantime_serde")]
    pub max_rate_limit_wait: Duration,
    /// Largest response body accepted, in bytes. Default 32 MiB.
    pub max_body_bytes: u64,
    /// User-Agent header. Default `"tributary/<crate version>"`.
    pub user_agent: String,
    /// The provider-wide request budget shared by all its connections, in requests per
    /// second; `None` is unlimited. Set from the provider table's `requests_per_second`.
    #[serde(skip)]
    pub requests_per_second: Option<f64>,
    /// The provider's name, used as the `provider` label of the HTTP metrics.
    #[serde(skip)]
    pub metrics_label: String,
    /// The most records one page may hold; a page with more is refused whole
    /// ([`crate::FetchError::TooManyRecords`]). Set from the provider table's
    /// `max_records_per_page`.
    #[serde(skip)]
    pub max_records_per_page: usize,
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            max_retries: 4,
            retry_initial_delay: Duration::from_millis(500),
            retry_max_delay: Duration::from_secs(30),
            max_rate_limit_wait: Duration::from_secs(5 * 60),
            max_body_bytes: 32 * 1024 * 1024,
            user_agent: concat!("tributary/", env!("CARGO_PKG_VERSION")).to_string(),
            requests_per_second: None,
            metrics_label: String::new(),
            max_records_per_page: DEFAULT_MAX_RECORDS_PER_PAGE,
        }
    }
}

/// The ranges of the `[providers.NAME.http]` durations, counts and sizes.
pub mod limits {
    use std::time::Duration;

    /// `timeout` and `connect_timeout`: at least a millisecond, at most an hour.
    pub const TIMEOUT: (Duration, Duration) = (Duration::from_millis(1), Duration::from_secs(3600));
    /// `max_retries`.
    pub const MAX_RETRIES: (u32, u32) = (0, 100);
    /// `retry_initial_delay` and `retry_max_delay`.
    pub const RETRY_DELAY: (Duration, Duration) = (Duration::ZERO, Duration::from_secs(3600));
    /// `max_rate_limit_wait`: at most the longest wait a header is read as.
    pub const MAX_RATE_LIMIT_WAIT: (Duration, Duration) =
        (Duration::ZERO, crate::http::MAX_ASKED_WAIT);
    /// `max_body_bytes`: at most 1 GiB.
    pub const MAX_BODY_BYTES: (u64, u64) = (1, 1 << 30);
    /// `requests_per_second`: from one a day to ten thousand.
    pub const REQUESTS_PER_SECOND: (f64, f64) = (super::MIN_REQUESTS_PER_SECOND, 10_000.0);
}

impl HttpSettings {
    /// Checks what serde cannot and returns a message naming the key that is wrong.
    pub fn validate(&self) -> Result<(), String> {
        use crate::bounds::{count_in, duration_in, named};
        let (min, max) = limits::TIMEOUT;
        duration_in(self.timeout, min, max).map_err(named("http.timeout"))?;
        duration_in(self.connect_timeout, min, max).map_err(named("http.connect_timeout"))?;
        let (min, max) = limits::MAX_RETRIES;
        count_in(self.max_retries, min, max).map_err(named("http.max_retries"))?;
        let (min, max) = limits::RETRY_DELAY;
        duration_in(self.retry_initial_delay, min, max)
            .map_err(named("http.retry_initial_delay"))?;
        duration_in(self.retry_max_delay, min, max).map_err(named("http.retry_max_delay"))?;
        if self.retry_initial_delay > self.retry_max_delay {
            return Err(format!(
                "http.retry_initial_delay ({:?}) must not be longer than http.retry_max_delay ({:?})",
                self.retry_initial_delay, self.retry_max_delay
            ));
        }
        let (min, max) = limits::MAX_RATE_LIMIT_WAIT;
        duration_in(self.max_rate_limit_wait, min, max)
            .map_err(named("http.max_rate_limit_wait"))?;
        if let Some(rate) = self.requests_per_second {
            // The budget waits 1/rate between requests; a wait longer than the rate
            // limiter (or a Duration) can hold would panic when the client is built.
            let (min, max) = limits::REQUESTS_PER_SECOND;
            if !(rate.is_finite() && (min..=max).contains(&rate)) {
                return Err(format!(
                    "requests_per_second must be between {min:e} (one request a day) and \
                     {max}, got {rate}"
                ));
            }
        }
        count_in(self.max_records_per_page, 1, MAX_RECORDS_PER_PAGE)
            .map_err(named("max_records_per_page"))?;
        let (min, max) = limits::MAX_BODY_BYTES;
        count_in(self.max_body_bytes, min, max).map_err(named("http.max_body_bytes"))?;
        if HeaderValue::from_str(&self.user_agent).is_err() {
            return Err(format!(
                "http.user_agent {:?} is not a valid HTTP header value",
                self.user_agent
            ));
        }
        Ok(())
    }
}
