//! [`HttpSettings`]: the `[providers.NAME.http]` table, with its defaults and validation.

use std::time::Duration;

use reqwest::header::HeaderValue;
use serde::Deserialize;

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
        }
    }
}

impl HttpSettings {
    /// Checks what serde cannot and returns a message naming the key that is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.timeout.is_zero() {
            return Err("http.timeout must be longer than 0s".to_string());
        }
        if self.connect_timeout.is_zero() {
            return Err("http.connect_timeout must be longer than 0s".to_string());
        }
        if self.retry_initial_delay > self.retry_max_delay {
            return Err(format!(
                "http.retry_initial_delay ({:?}) must not be longer than http.retry_max_delay ({:?})",
                self.retry_initial_delay, self.retry_max_delay
            ));
        }
        if let Some(rate) = self.requests_per_second {
            if !(rate.is_finite() && rate > 0.0) {
                return Err(format!("requests_per_second must be above 0, got {rate}"));
            }
            // The budget waits 1/rate between requests; a wait longer than the rate
            // limiter (or a Duration) can hold would panic when the client is built.
            if rate < MIN_REQUESTS_PER_SECOND {
                return Err(format!(
                    "requests_per_second must be at least {MIN_REQUESTS_PER_SECOND:e} (one \
                     request a day), got {rate}"
                ));
            }
        }
        if self.max_body_bytes == 0 {
            return Err("http.max_body_bytes must be at least 1".to_string());
        }
        if HeaderValue::from_str(&self.user_agent).is_err() {
            return Err(format!(
                "http.user_agent {:?} is not a valid HTTP header value",
                self.user_agent
            ));
        }
        Ok(())
    }
}
