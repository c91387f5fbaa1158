//! `rate_limit = { ... }`: an API's own rate-limit headers, read beside `Retry-After`.
//!
//! ```toml
//! rate_limit = { remaining_header = "RateLimit-Remaining", reset_header = "RateLimit-Reset", reset = "epoch" }
//! ```
//!
//! A 429 without `Retry-After` waits until the time `reset_header` gives instead of the
//! backoff delay (Pipedrive sends no `Retry-After`). An answer whose `remaining_header` is
//! 0 makes the next request with the same token wait until then, so a walk does not run
//! into the 429 at all. Either wait, beyond `http.max_rate_limit_wait`, ends the fetch as
//! rate limited: the run stops early and the next one resumes from its checkpoint.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::header::{HeaderMap, HeaderName};
use reqwest::StatusCode;
use serde::Deserialize;

use crate::http::{asked_wait, Answer, ResponsePolicy, Verdict};
use crate::FetchError;

/// `rate_limit = { ... }` of a `kind = "rest"` provider.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    /// The response header holding how many requests are left in the window, e.g.
    /// `"RateLimit-Remaining"`. When an answer says 0, the next request with the same
    /// token waits until the reset. Optional.
    #[serde(default)]
    pub remaining_header: Option<String>,
    /// The response header saying when the window resets, e.g. `"RateLimit-Reset"`.
    /// Required.
    pub reset_header: String,
    /// How `reset_header` writes the reset: `"seconds"` until it (Pipedrive's
    /// `x-ratelimit-reset`) or `"epoch"`, the Unix time of it in seconds (GitLab's
    /// `RateLimit-Reset`).
    pub reset: ResetFormat,
}

/// How a reset header writes the time the window resets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResetFormat {
    /// Seconds from the answer.
    Seconds,
    /// Unix time in seconds.
    Epoch,
}

impl RateLimitConfig {
    /// Checks the header names.
    pub(crate) fn validate(&self) -> Result<(), String> {
        let check = |key: &str, name: &str| {
            HeaderName::from_bytes(name.as_bytes())
                .map(|_| ())
                .map_err(|_| format!("rate_limit.{key} {name:?} is not a valid HTTP header name"))
        };
        check("reset_header", &self.reset_header)?;
        if let Some(name) = &self.remaining_header {
            check("remaining_header", name)?;
        }
        Ok(())
    }

    /// The wait until the reset `headers` give, at least a second (against clock skew
    /// and whole-second rounding); `None` when the header is absent or unreadable.
    fn wait(&self, headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
        let value: u64 = headers
            .get(self.reset_header.as_str())?
            .to_str()
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let seconds = match self.reset {
            ResetFormat::Seconds => value,
            ResetFormat::Epoch => {
                let now = now
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |since| since.as_secs());
                value.saturating_sub(now)
            }
        };
        Some(asked_wait(seconds).max(Duration::from_secs(1)))
    }

    /// Whether `headers` say no request is left in the window.
    fn spent(&self, headers: &HeaderMap) -> bool {
        let Some(name) = &self.remaining_header else {
            return false;
        };
        headers
            .get(name.as_str())
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            == Some(0)
    }
}

/// The provider's rate-limit state: when each token may send again.
#[derive(Clone, Debug)]
pub(crate) struct RateLimiter {
    config: RateLimitConfig,
    /// By a hash of the token (the windows are the token's), the instant its window
    /// resets; an entry is removed once passed.
    resume_at: Arc<Mutex<HashMap<u64, Instant>>>,
}

impl RateLimiter {
    pub(crate) fn new(config: RateLimitConfig) -> RateLimiter {
        RateLimiter {
            config,
            resume_at: Arc::default(),
        }
    }

    /// Waits until the window of `token` resets, when an answer said it was spent. A
    /// wait longer than `max_wait` is not waited: the fetch ends as rate limited.
    pub(crate) async fn wait_turn(
        &self,
        token: Option<&str>,
        max_wait: Duration,
    ) -> Result<(), FetchError> {
        let key = token_key(token);
        let resume_at = {
            let mut resume_at = self
                .resume_at
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let now = Instant::now();
            resume_at.retain(|_, at| *at > now);
            resume_at.get(&key).copied()
        };
        let Some(at) = resume_at else {
            return Ok(());
        };
        let wait = at.saturating_duration_since(Instant::now());
        if wait > max_wait {
            return Err(FetchError::RateLimited {
                retry_after: wait,
                limit: max_wait,
            });
        }
        tracing::info!(
            wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
            "The API's rate-limit window is spent; waiting for its reset."
        );
        tokio::time::sleep(wait).await;
        Ok(())
    }

    /// The policy of one request sent with `token`.
    pub(crate) fn policy(&self, token: Option<&str>) -> RatePolicy<'_> {
        RatePolicy {
            limiter: self,
            key: token_key(token),
        }
    }
}

/// Reads one request's answers with the provider's [`RateLimitConfig`].
pub(crate) struct RatePolicy<'a> {
    limiter: &'a RateLimiter,
    key: u64,
}

impl ResponsePolicy for RatePolicy<'_> {
    fn observe(&self, status: StatusCode, headers: &HeaderMap) {
        let config = &self.limiter.config;
        if !status.is_success() || !config.spent(headers) {
            return;
        }
        if let Some(wait) = config.wait(headers, SystemTime::now()) {
            let at = Instant::now().checked_add(wait);
            let mut resume_at = self
                .limiter
                .resume_at
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some(at) = at {
                resume_at.insert(self.key, at);
            }
        }
    }

    fn classify(&self, answer: &Answer<'_>, default: Verdict) -> Verdict {
        if answer.status != StatusCode::TOO_MANY_REQUESTS || answer.retry_after().is_some() {
            return default;
        }
        match self.limiter.config.wait(answer.headers, SystemTime::now()) {
            Some(wait) => default.retry(Some(wait)),
            None => default,
        }
    }
}

/// The key of a token's window; requests without a token share one.
fn token_key(token: Option<&str>) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    token.unwrap_or_default().hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn config(reset: ResetFormat) -> RateLimitConfig {
        RateLimitConfig {
            remaining_header: Some("x-left".to_string()),
            reset_header: "x-reset".to_string(),
            reset,
        }
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn resets_are_read_as_seconds_or_epoch_and_at_least_a_second() {
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let seconds = config(ResetFormat::Seconds);
        let epoch = config(ResetFormat::Epoch);
        let wait = |config: &RateLimitConfig, value: &str| {
            config.wait(&headers(&[("x-reset", value)]), now)
        };
        assert_eq!(wait(&seconds, "7"), Some(Duration::from_secs(7)));
        assert_eq!(wait(&seconds, "0"), Some(Duration::from_secs(1)));
        assert_eq!(wait(&epoch, "1700000030"), Some(Duration::from_secs(30)));
        assert_eq!(wait(&epoch, "1600000000"), Some(Duration::from_secs(1)));
        assert_eq!(
            wait(&seconds, "18446744073709551615"),
            Some(crate::http::MAX_ASKED_WAIT)
        );
        assert_eq!(wait(&seconds, "soon"), None);
        assert_eq!(wait(&seconds, "-3"), None);
        assert_eq!(seconds.wait(&HeaderMap::new(), now), None);
    }

    #[test]
    fn only_a_remaining_of_zero_spends_the_window() {
        let config = config(ResetFormat::Seconds);
        assert!(config.spent(&headers(&[("x-left", "0")])));
        assert!(config.spent(&headers(&[("x-left", " 0 ")])));
        assert!(!config.spent(&headers(&[("x-left", "1")])));
        assert!(!config.spent(&headers(&[("x-left", "none")])));
        assert!(!config.spent(&HeaderMap::new()));
    }
}
