//! [`FetchError`], the one error type of fetching a page, and the helpers that keep its text
//! bounded and free of secrets (URL userinfo, the connection token).

use std::time::Duration;

use url::Url;

use crate::quote::{truncated, MAX_QUOTED_CHARS};
use crate::RecordStage;

/// The most bytes of a response body kept in an error (e.g. [`FetchError::InvalidJson`]), so
/// the body can be stored in the error report without storing a whole huge response.
pub const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// The most characters of a body quoted in an error message (e.g. the API's explanation of a
/// 401).
pub const MAX_MESSAGE_EXCERPT_CHARS: usize = 300;

/// What replaces the connection token wherever it would have shown in an error.
const REDACTED: &str = "[redacted]";

/// Tokens shorter than this are not searched for in error text: replacing a one- or
/// two-character "token" would mangle the message and hide nothing worth hiding.
const MIN_REDACTED_SECRET_LEN: usize = 4;

/// Why a page could not be fetched. The text never contains the connection token or the
/// userinfo (`user:password@`) of a URL.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The HTTP client could not be built (e.g. an invalid `http` setting), or the request
    /// could not be assembled from the provider's configuration.
    #[error("could not build the HTTP client: {message}")]
    Client {
        /// What was wrong, naming the setting.
        message: String,
    },
    /// A URL to fetch could not be built or parsed.
    #[error("invalid URL {url}: {message}")]
    InvalidUrl {
        /// The URL (or the text that should have been one).
        url: String,
        /// Why it is not usable.
        message: String,
    },
    /// The provider needs a token, but the connection has none (or one that cannot be sent).
    #[error("{message}")]
    MissingCredentials {
        /// What is missing, naming the `auth` setting that needs it.
        message: String,
    },
    /// The API answered 401 or 403: the token is wrong, expired or lacks a permission. Never
    /// retried.
    #[error("credentials were rejected (HTTP {status}): {message}")]
    Unauthorized {
        /// The HTTP status (401 or 403).
        status: u16,
        /// The start of the response body, which usually says why.
        message: String,
    },
    /// The API asked to wait (`Retry-After`) longer than `http.max_rate_limit_wait`.
    #[error(
        "rate limited: the API asked to wait {}, longer than max_rate_limit_wait ({})",
        seconds(retry_after),
        seconds(limit)
    )]
    RateLimited {
        /// How long the API asked to wait.
        retry_after: Duration,
        /// The configured `http.max_rate_limit_wait` it exceeded.
        limit: Duration,
    },
    /// A request budget (`budget` in the provider's table) is spent until later than
    /// `http.max_rate_limit_wait` from now; the request was not sent.
    #[error(
        "the request budget of {scope} is spent until {}; nothing was sent past it",
        reopens_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    )]
    BudgetSpent {
        /// What the budget belongs to, e.g. `provider strava` or `connection 7`.
        scope: String,
        /// When the spent window ends and the run may resume.
        reopens_at: chrono::DateTime<chrono::Utc>,
    },
    /// The request budget could not be read (its database is unreachable); the request
    /// was not sent.
    #[error("the request budget could not be read: {message}")]
    BudgetUnavailable {
        /// Why, from the budget's store.
        message: String,
    },
    /// The API answered with an unsuccessful status (after the retries, for 5xx and 429).
    #[error("{url} answered HTTP {status} after {}: {message}", attempts_text(*attempts))]
    Status {
        /// The requested URL.
        url: String,
        /// The HTTP status of the last answer.
        status: u16,
        /// How many requests were made.
        attempts: u32,
        /// The start of the last response body, or why the answer was not accepted.
        message: String,
    },
    /// No usable answer: connection refused, timeout, reset, a body cut short.
    #[error("request to {url} failed after {}: {message}", attempts_text(*attempts))]
    Transport {
        /// The requested URL.
        url: String,
        /// How many requests were made.
        attempts: u32,
        /// The error and its whole chain of causes.
        message: String,
    },
    /// The response body is larger than `http.max_body_bytes`. Never retried.
    #[error(
        "response body from {url} is larger than the limit of {limit} bytes (http.max_body_bytes)"
    )]
    BodyTooLarge {
        /// The requested URL.
        url: String,
        /// The configured limit in bytes.
        limit: u64,
    },
    /// A successful answer whose body is not valid JSON, even after the retries.
    #[error("response body from {url} is not valid JSON after {}: {message}", attempts_text(*attempts))]
    InvalidJson {
        /// The requested URL.
        url: String,
        /// How many requests were made.
        attempts: u32,
        /// The JSON parser's explanation (line and column).
        message: String,
        /// The last body, lossily decoded and cut to [`MAX_ERROR_BODY_BYTES`].
        body: String,
    },
    /// Valid JSON, but not the shape the provider is configured for (e.g. `records_path` is
    /// not an array).
    #[error("response from {url} does not have the expected shape: {message}")]
    Shape {
        /// The URL that answered.
        url: String,
        /// What was expected and what was found, naming the setting.
        message: String,
        /// The body as JSON text, cut to [`MAX_ERROR_BODY_BYTES`].
        body: String,
    },
    /// The page holds more records than `max_records_per_page`. Never retried; the page is
    /// not stored, and its error row keeps the start of the body.
    #[error("response from {url} holds {count} records, more than max_records_per_page = {limit}")]
    TooManyRecords {
        /// The URL that answered.
        url: String,
        /// How many records the page holds.
        count: usize,
        /// The configured `max_records_per_page`.
        limit: usize,
        /// The body as JSON text, cut to [`MAX_ERROR_BODY_BYTES`].
        body: String,
    },
    /// The pages do not advance (e.g. the same cursor twice). Raised by the pipeline's loop
    /// guard, not by the providers.
    #[error("pagination loop: {message}")]
    PaginationLoop {
        /// What repeated.
        message: String,
    },
    /// The position to fetch does not fit the provider's pagination (e.g. a checkpoint
    /// holding a cursor after `pagination.type` was changed to `"offset"`).
    #[error("{message}")]
    PositionMismatch {
        /// Which position was given and what the configuration expects.
        message: String,
    },
    /// A token refresh's answer was refused (`error`), but it rotated the refresh token,
    /// which the endpoint may already have made the only valid one: the credential store
    /// keeps `kept` (the current credentials with the new refresh token), then fails with
    /// `error`. Only a [`crate::TokenRefresher`] returns it.
    #[error("{error}")]
    RefusedWithRotation {
        /// Why the answer was refused.
        error: Box<FetchError>,
        /// The credentials to keep.
        kept: Box<crate::Credentials>,
    },
}

impl FetchError {
    /// The raw body to store in the error report, when the error has one.
    pub fn body(&self) -> Option<&str> {
        match self {
            FetchError::RefusedWithRotation { error, .. } => error.body(),
            FetchError::InvalidJson { body, .. }
            | FetchError::Shape { body, .. }
            | FetchError::TooManyRecords { body, .. } => Some(body),
            _ => None,
        }
    }

    /// A short name of the kind of failure (OpenTelemetry's `error.type`).
    pub fn kind(&self) -> &'static str {
        match self {
            FetchError::Client { .. } => "client",
            FetchError::InvalidUrl { .. } => "invalid_url",
            FetchError::MissingCredentials { .. } => "missing_credentials",
            FetchError::Unauthorized { .. } => "unauthorized",
            FetchError::RateLimited { .. } => "rate_limited",
            FetchError::BudgetSpent { .. } => "budget_spent",
            FetchError::BudgetUnavailable { .. } => "budget_unavailable",
            FetchError::Status { .. } => "status",
            FetchError::Transport { .. } => "transport",
            FetchError::BodyTooLarge { .. } => "body_too_large",
            FetchError::InvalidJson { .. } => "invalid_json",
            FetchError::Shape { .. } => "shape",
            FetchError::TooManyRecords { .. } => "too_many_records",
            FetchError::PaginationLoop { .. } => "pagination_loop",
            FetchError::PositionMismatch { .. } => "position_mismatch",
            FetchError::RefusedWithRotation { .. } => "refused_with_rotation",
        }
    }

    /// `run_errors.stage` for this error: "parse" for InvalidJson/Shape, else "fetch".
    pub fn stage(&self) -> RecordStage {
        match self {
            FetchError::RefusedWithRotation { error, .. } => error.stage(),
            FetchError::InvalidJson { .. }
            | FetchError::Shape { .. }
            | FetchError::TooManyRecords { .. } => RecordStage::Parse,
            _ => RecordStage::Fetch,
        }
    }

    /// [`FetchError::redact_secret`] for each of `secrets` (e.g. an access token, a refresh
    /// token and a client secret).
    pub(crate) fn redact_secrets<'a>(self, secrets: impl IntoIterator<Item = &'a str>) -> Self {
        secrets
            .into_iter()
            .fold(self, |error, secret| error.redact_secret(secret))
    }

    /// Replaces every occurrence of `secret` in the error's text (e.g. an API that echoes the
    /// token in its error body) with `[redacted]`.
    pub(crate) fn redact_secret(self, secret: &str) -> Self {
        if secret.len() < MIN_REDACTED_SECRET_LEN {
            return self;
        }
        let clean = |text: String| {
            if text.contains(secret) {
                text.replace(secret, REDACTED)
            } else {
                text
            }
        };
        match self {
            FetchError::Client { message } => FetchError::Client {
                message: clean(message),
            },
            FetchError::InvalidUrl { url, message } => FetchError::InvalidUrl {
                url: clean(url),
                message: clean(message),
            },
            FetchError::MissingCredentials { message } => FetchError::MissingCredentials {
                message: clean(message),
            },
            FetchError::Unauthorized { status, message } => FetchError::Unauthorized {
                status,
                message: clean(message),
            },
            FetchError::Status {
                url,
                status,
                attempts,
                message,
            } => FetchError::Status {
                url: clean(url),
                status,
                attempts,
                message: clean(message),
            },
            FetchError::Transport {
                url,
                attempts,
                message,
            } => FetchError::Transport {
                url: clean(url),
                attempts,
                message: clean(message),
            },
            FetchError::BodyTooLarge { url, limit } => FetchError::BodyTooLarge {
                url: clean(url),
                limit,
            },
            FetchError::InvalidJson {
                url,
                attempts,
                message,
                body,
            } => FetchError::InvalidJson {
                url: clean(url),
                attempts,
                message: clean(message),
                body: clean(body),
            },
            FetchError::Shape { url, message, body } => FetchError::Shape {
                url: clean(url),
                message: clean(message),
                body: clean(body),
            },
            FetchError::TooManyRecords {
                url,
                count,
                limit,
                body,
            } => FetchError::TooManyRecords {
                url: clean(url),
                count,
                limit,
                body: clean(body),
            },
            FetchError::PaginationLoop { message } => FetchError::PaginationLoop {
                message: clean(message),
            },
            FetchError::PositionMismatch { message } => FetchError::PositionMismatch {
                message: clean(message),
            },
            unchanged @ (FetchError::RateLimited { .. }
            | FetchError::BudgetSpent { .. }
            | FetchError::BudgetUnavailable { .. }) => unchanged,
            FetchError::RefusedWithRotation { error, kept } => FetchError::RefusedWithRotation {
                error: Box::new(error.redact_secret(secret)),
                kept,
            },
        }
    }
}

/// "1 attempt", "5 attempts".
fn attempts_text(attempts: u32) -> String {
    if attempts == 1 {
        "1 attempt".to_string()
    } else {
        format!("{attempts} attempts")
    }
}

/// "600s", or "0.250s" when the duration is not whole seconds.
fn seconds(duration: &Duration) -> String {
    if duration.subsec_nanos() == 0 {
        format!("{}s", duration.as_secs())
    } else {
        format!("{:.3}s", duration.as_secs_f64())
    }
}

/// What replaces a secret query parameter's value wherever a URL is quoted.
const REDACTED_PARAM: &str = "REDACTED";

/// Whether a query parameter's name says its value is a secret (`api_key`, `access_token`,
/// `client_secret`, `X-Amz-Signature`, `sig`). Over-matching costs a hidden harmless value;
/// under-matching would leak a key, so names are matched by the words they contain.
pub fn is_secret_param(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    const WORDS: [&str; 7] = [
        "key",
        "token",
        "secret",
        "password",
        "passwd",
        "signature",
        "credential",
    ];
    WORDS.iter().any(|word| lower.contains(word))
        || lower
            .split(|c: char| !c.is_ascii_alphanumeric())
            .any(|part| part == "sig" || part == "auth")
}

/// The URL as text for messages and logs: without its userinfo (`user:password@`), with
/// the value of every secret query parameter ([`is_secret_param`]) replaced, and at most
/// [`MAX_QUOTED_CHARS`] characters long.
pub(crate) fn display_url(url: &Url) -> String {
    display_url_hiding(url, &[])
}

/// [`display_url`], also hiding the values of the parameters named in `also_secret` (e.g. a
/// provider's `auth = { query = "code" }`).
pub(crate) fn display_url_hiding(url: &Url, also_secret: &[String]) -> String {
    let mut clean = url.clone();
    if !url.username().is_empty() || url.password().is_some() {
        // Only URLs that cannot have userinfo refuse these, and they have none to strip.
        let _ = clean.set_username("");
        let _ = clean.set_password(None);
    }
    hide_query_values(&mut clean, REDACTED_PARAM, |name| {
        is_secret_param(name) || also_secret.iter().any(|s| s == name)
    });
    truncated(clean.as_str(), MAX_QUOTED_CHARS)
}

/// Replaces the value of every query parameter of `url` that `secret` picks with
/// `placeholder`, keeping the others and their order.
pub fn hide_query_values(url: &mut Url, placeholder: &str, secret: impl Fn(&str) -> bool) {
    if !url.query_pairs().any(|(name, _)| secret(&name)) {
        return;
    }
    let pairs: Vec<(String, String)> = url
        .query_pairs()
        .map(|(name, value)| {
            let value = if secret(&name) {
                placeholder.to_string()
            } else {
                value.into_owned()
            };
            (name.into_owned(), value)
        })
        .collect();
    url.query_pairs_mut().clear().extend_pairs(pairs);
}

/// Like [`display_url`], for text that may not even parse as a URL. Text that does not
/// parse loses its userinfo and, past the first `?`, everything but parameter names.
pub(crate) fn display_url_text(text: &str) -> String {
    if let Ok(url) = Url::parse(text) {
        return display_url(&url);
    }
    let (before_query, query) = match text.split_once('?') {
        Some((head, query)) => (head, Some(query)),
        None => (text, None),
    };
    let mut shown = strip_userinfo_text(before_query);
    if let Some(query) = query {
        let names: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) if is_secret_param(name) => format!("{name}={REDACTED_PARAM}"),
                _ => pair.to_string(),
            })
            .collect();
        shown.push('?');
        shown.push_str(&names.join("&"));
    }
    truncated(&shown, MAX_QUOTED_CHARS)
}

fn strip_userinfo_text(text: &str) -> String {
    let Some(scheme_end) = text.find("://") else {
        return text.to_string();
    };
    let authority_start = scheme_end + 3;
    let authority_end = text[authority_start..]
        .find(['/', '#'])
        .map_or(text.len(), |end| authority_start + end);
    match text[authority_start..authority_end].rfind('@') {
        Some(at) => format!(
            "{}{}",
            &text[..authority_start],
            &text[authority_start + at + 1..]
        ),
        None => text.to_string(),
    }
}

/// A body kept for the error report: lossily decoded, cut to [`MAX_ERROR_BODY_BYTES`] on a
/// character boundary.
pub(crate) fn cap_body(bytes: &[u8]) -> String {
    let head = &bytes[..bytes.len().min(MAX_ERROR_BODY_BYTES)];
    let mut text = String::from_utf8_lossy(head).into_owned();
    truncate_at_char_boundary(&mut text, MAX_ERROR_BODY_BYTES);
    text
}

/// The start of a body for a one-line message: at most [`MAX_MESSAGE_EXCERPT_CHARS`]
/// characters, whitespace collapsed, "…" when cut.
pub(crate) fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if collapsed.is_empty() {
        return "the response body is empty".to_string();
    }
    truncated(&collapsed, MAX_MESSAGE_EXCERPT_CHARS)
}

/// The error and its chain of causes, "outer: inner: root", skipping causes whose text the
/// outer error already repeats.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

fn truncate_at_char_boundary(text: &mut String, max_bytes: usize) {
    if text.len() <= max_bytes {
        return;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_urls_are_truncated_after_their_secrets_are_hidden() {
        let long = format!(
            "https://u:pw@example.com/items?token=t0p53cr3t&q={}",
            "é".repeat(1000)
        );
        for shown in [
            display_url(&Url::parse(&long).unwrap()),
            display_url_text(&long),
        ] {
            assert_eq!(shown.chars().count(), MAX_QUOTED_CHARS + 1, "{shown}");
            assert!(shown.ends_with('…'));
            assert!(shown.starts_with("https://example.com/items?token="));
            assert!(!shown.contains("t0p53cr3t") && !shown.contains("pw"));
        }
        let unparsable = format!("https://u:pw@exa mple.com/{}", "a".repeat(1000));
        assert_eq!(
            display_url_text(&unparsable).chars().count(),
            MAX_QUOTED_CHARS + 1
        );
    }

    #[test]
    fn urls_lose_their_userinfo() {
        let url = Url::parse("https://user:pw@example.com/a?b=1").unwrap();
        assert_eq!(display_url(&url), "https://example.com/a?b=1");
        assert_eq!(
            display_url_text("https://user:pw@exa mple.com/a"),
            "https://exa mple.com/a"
        );
        assert_eq!(display_url_text("not a url"), "not a url");
    }

    #[test]
    fn secret_query_parameters_are_hidden_wherever_a_url_is_quoted() {
        let url = Url::parse(
            "https://api.example.com/v1?api_key=k-123&limit=5&access_token=t-456&\
             X-Amz-Signature=s-789&sig=s-000&clientSecret=c-111&design=blue",
        )
        .unwrap();
        let shown = display_url(&url);
        for secret in ["k-123", "t-456", "s-789", "s-000", "c-111"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(
            shown.contains("limit=5") && shown.contains("design=blue"),
            "{shown}"
        );
        assert!(shown.contains("api_key=REDACTED"), "{shown}");

        let custom = Url::parse("https://api.example.com/v1?code=c-222&page=2").unwrap();
        assert_eq!(
            display_url_hiding(&custom, &["code".to_string()]),
            "https://api.example.com/v1?code=REDACTED&page=2"
        );
        assert_eq!(
            display_url_text("https://u:pw@exa mple.com/a?token=t-333&x=1"),
            "https://exa mple.com/a?token=REDACTED&x=1"
        );
    }

    #[test]
    fn bodies_are_capped_on_a_char_boundary() {
        let body = "é".repeat(MAX_ERROR_BODY_BYTES);
        let capped = cap_body(body.as_bytes());
        assert!(capped.len() <= MAX_ERROR_BODY_BYTES);
        assert!(capped.chars().all(|c| c == 'é'));
        assert_eq!(cap_body(b"\xffabc"), "\u{fffd}abc");
    }

    #[test]
    fn excerpts_are_bounded() {
        let text = excerpt("x ".repeat(1000).as_bytes());
        assert_eq!(text.chars().count(), MAX_MESSAGE_EXCERPT_CHARS + 1);
        assert!(text.ends_with('…'));
        assert_eq!(excerpt(b"  "), "the response body is empty");
    }

    #[test]
    fn messages_name_both_waits_and_the_stage_is_right() {
        let error = FetchError::RateLimited {
            retry_after: Duration::from_secs(600),
            limit: Duration::from_secs(300),
        };
        assert_eq!(
            error.to_string(),
            "rate limited: the API asked to wait 600s, longer than max_rate_limit_wait (300s)"
        );
        assert_eq!(error.stage(), RecordStage::Fetch);
        let error = FetchError::Shape {
            url: "u".into(),
            message: "m".into(),
            body: "{}".into(),
        };
        assert_eq!(error.stage(), RecordStage::Parse);
        assert_eq!(error.body(), Some("{}"));
    }

    #[test]
    fn every_secret_is_redacted() {
        let error = FetchError::Unauthorized {
            status: 400,
            message: "refresh token rt-1234 for client cs-5678 rejected".into(),
        }
        .redact_secrets(["rt-1234", "cs-5678", "ab"]);
        assert_eq!(
            error.to_string(),
            "credentials were rejected (HTTP 400): refresh token [redacted] for client \
             [redacted] rejected"
        );
    }
}
