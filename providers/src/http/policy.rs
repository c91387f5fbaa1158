//! [`ResponsePolicy`]: how one provider's API is read, plugged into the shared retry loop.
//!
//! The client classifies every unsuccessful answer itself first (see the module
//! documentation of [`crate::http`]), as a [`Verdict`]. A provider whose API signals more
//! than the status says (GitHub's 403 that is really a rate limit, Stripe's
//! `Stripe-Should-Retry`, an error body with a readable message, Strava's usage headers)
//! passes a policy to [`HttpClient::get_json_with`](super::HttpClient::get_json_with) or
//! [`HttpClient::post_form_with`](super::HttpClient::post_form_with) and may:
//! - see the status and headers of every answer, successful or not
//!   ([`ResponsePolicy::observe`]);
//! - replace the client's verdict on an unsuccessful answer ([`ResponsePolicy::classify`]).
//!
//! Whatever the policy decides, the client still bounds the attempts by
//! `http.max_retries`, and a wait longer than `http.max_rate_limit_wait` ends the fetch at
//! once with [`FetchError::RateLimited`].

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::StatusCode;

use super::error::excerpt;
use super::FetchError;

/// One unsuccessful (non-2xx) answer, as a [`ResponsePolicy`] sees it.
#[derive(Debug)]
pub struct Answer<'a> {
    /// The requested URL as shown in messages (without userinfo).
    pub url: &'a str,
    /// The HTTP status.
    pub status: StatusCode,
    /// The response headers.
    pub headers: &'a HeaderMap,
    /// The start of the body (at most 16 KiB); empty for a redirect that was not followed.
    pub body: &'a [u8],
    /// Which attempt this answer is to, counting from 1.
    pub attempt: u32,
}

impl Answer<'_> {
    /// The header's value as text, when present and visible ASCII.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)?.to_str().ok().map(str::trim)
    }

    /// The wait the `Retry-After` header asks for (integer seconds or an HTTP date), when
    /// present and readable.
    pub fn retry_after(&self) -> Option<Duration> {
        retry_after(self.headers, SystemTime::now())
    }

    /// The body parsed as JSON, when it is JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(self.body).ok()
    }

    /// The start of the body for a one-line message (whitespace collapsed, cut with "…").
    pub fn excerpt(&self) -> String {
        excerpt(self.body)
    }
}

/// What an unsuccessful answer means for the fetch.
#[derive(Debug)]
pub enum Verdict {
    /// Worth another attempt while `http.max_retries` allows: after `wait` when given (a
    /// wait longer than `http.max_rate_limit_wait` ends the fetch with
    /// [`FetchError::RateLimited`]), else after the backoff delay. `error` is returned when
    /// no attempt is left.
    Retry {
        /// The error reported if this was the last attempt.
        error: FetchError,
        /// The wait the API asked for, used instead of the backoff delay.
        wait: Option<Duration>,
    },
    /// Ends the fetch at once with this error.
    Fail(FetchError),
}

impl Verdict {
    /// The error the verdict carries.
    pub fn error(&self) -> &FetchError {
        match self {
            Verdict::Retry { error, .. } | Verdict::Fail(error) => error,
        }
    }

    /// The same error, not retried.
    pub fn fail(self) -> Verdict {
        match self {
            Verdict::Retry { error, .. } | Verdict::Fail(error) => Verdict::Fail(error),
        }
    }

    /// The same error, retried after `wait` (or the backoff delay when `None`).
    pub fn retry(self, wait: Option<Duration>) -> Verdict {
        match self {
            Verdict::Retry { error, .. } | Verdict::Fail(error) => Verdict::Retry { error, wait },
        }
    }

    /// Replaces the message of a [`FetchError::Status`] or [`FetchError::Unauthorized`]
    /// error (e.g. with the message an API's JSON error body gives); other errors are kept
    /// as they are.
    pub fn with_message(self, message: String) -> Verdict {
        let replace = |error: FetchError| match error {
            FetchError::Status {
                url,
                status,
                attempts,
                ..
            } => FetchError::Status {
                url,
                status,
                attempts,
                message,
            },
            FetchError::Unauthorized { status, .. } => FetchError::Unauthorized { status, message },
            other => other,
        };
        match self {
            Verdict::Retry { error, wait } => Verdict::Retry {
                error: replace(error),
                wait,
            },
            Verdict::Fail(error) => Verdict::Fail(replace(error)),
        }
    }
}

/// A provider's hook into how the shared client reads answers. Both methods have defaults
/// that keep the client's own behaviour, so a policy implements only what it changes.
pub trait ResponsePolicy: Send + Sync {
    /// Sees the status and headers of every answer, successful or not, before anything
    /// else is done with it (e.g. to note rate-limit usage headers).
    fn observe(&self, status: StatusCode, headers: &HeaderMap) {
        let _ = (status, headers);
    }

    /// Decides what an unsuccessful answer means. `default` is the client's own verdict;
    /// returning it keeps the client's behaviour.
    fn classify(&self, answer: &Answer<'_>, default: Verdict) -> Verdict {
        let _ = answer;
        default
    }
}

/// The client's own behaviour, used by [`HttpClient::get_json`](super::HttpClient::get_json).
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultPolicy;

impl ResponsePolicy for DefaultPolicy {}

/// The client's own verdict on an unsuccessful answer: 401/403 are
/// [`FetchError::Unauthorized`]; 5xx and 429 are retried (after `Retry-After` on 429 and
/// 503); other statuses fail at once. `message` explains the answer (usually the start of
/// its body).
pub(super) fn default_verdict(answer: &Answer<'_>, message: String) -> Verdict {
    let status = answer.status;
    let code = status.as_u16();
    if code == 401 || code == 403 {
        return Verdict::Fail(FetchError::Unauthorized {
            status: code,
            message,
        });
    }
    let error = FetchError::Status {
        url: answer.url.to_string(),
        status: code,
        attempts: answer.attempt,
        message,
    };
    match status {
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => Verdict::Retry {
            error,
            wait: answer.retry_after(),
        },
        _ if status.is_server_error() => Verdict::Retry { error, wait: None },
        _ => Verdict::Fail(error),
    }
}

/// The longest wait a header can ask for; a longer one (or a reset time further off) is
/// read as this. Nothing in a response may make a wait overflow a clock, and a wait this
/// long ends the fetch as rate limited anyway, `http.max_rate_limit_wait` being shorter.
pub const MAX_ASKED_WAIT: Duration = Duration::from_secs(24 * 60 * 60);

/// `seconds` as a wait, at most [`MAX_ASKED_WAIT`].
pub(crate) fn asked_wait(seconds: u64) -> Duration {
    Duration::from_secs(seconds.min(MAX_ASKED_WAIT.as_secs()))
}

/// The wait a `Retry-After` header asks for: seconds, or an HTTP date (a date in the past
/// means no wait), at most [`MAX_ASKED_WAIT`]. `None` when absent or unreadable. RFC 9110
/// allows whole seconds only, but some APIs send decimals (Shopify's `2.0`): those are
/// read too rather than ignored for the backoff, which could retry too early.
pub(super) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(asked_wait(seconds));
    }
    if let Some(wait) = decimal_seconds(value) {
        return Some(wait);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(
        at.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(MAX_ASKED_WAIT),
    )
}

/// `value` as decimal seconds (`2.0`, `0.25`: digits, a point, one to nine digits), at
/// most [`MAX_ASKED_WAIT`]; `None` for anything else.
fn decimal_seconds(value: &str) -> Option<Duration> {
    let (whole, fraction) = value.split_once('.')?;
    let digits = |text: &str| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || !digits(fraction) || fraction.len() > 9 {
        return None;
    }
    let seconds = whole.parse::<u64>().ok()?;
    // Nine digits after the point are nanoseconds; fewer are padded with zeros.
    let nanos: u64 = format!("{fraction:0<9}").parse().ok()?;
    Some(
        asked_wait(seconds)
            .saturating_add(Duration::from_nanos(nanos))
            .min(MAX_ASKED_WAIT),
    )
}
