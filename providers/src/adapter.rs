//! Helpers shared by the built-in adapters (`github`, `stripe`, `strava`): base URL checks,
//! endpoints, the bearer header, watermarks and turning a JSON array into page items.

use chrono::{DateTime, Utc};
use reqwest::header::HeaderValue;
use secrecy::ExposeSecret;
use serde_json::Value;
use url::Url;

use crate::http::{display_url, display_url_text};
use crate::{Credentials, FetchError, IdSpec, PageItem, PagePosition, Watermark};

/// Checks a `base_url` setting: http or https, with a host, without a query or fragment.
pub(crate) fn validate_base_url(key: &str, url: &Url) -> Result<(), String> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "{key} must be an http or https URL, not {}:",
            url.scheme()
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{key} must name a host"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("{key} must not carry a query string or fragment"));
    }
    Ok(())
}

/// `base` (its trailing slash trimmed) followed by `path` (which starts with `/`).
pub(crate) fn endpoint(base: &Url, path: &str) -> Result<Url, FetchError> {
    let joined = format!("{}{path}", base.as_str().trim_end_matches('/'));
    Url::parse(&joined).map_err(|err| FetchError::InvalidUrl {
        url: display_url_text(&joined),
        message: err.to_string(),
    })
}

/// A next-page URL given by the API, fetched as is but only on the origin of `base`, so
/// the connection's credentials never reach another host.
pub(crate) fn same_origin_url(base: &Url, text: &str) -> Result<Url, FetchError> {
    let url = Url::parse(text).map_err(|err| FetchError::InvalidUrl {
        url: display_url_text(text),
        message: err.to_string(),
    })?;
    if url.origin() != base.origin() {
        return Err(FetchError::InvalidUrl {
            url: display_url(&url),
            message: format!(
                "the next-page URL is not on the origin of base_url ({}), so it is not \
                 followed with the connection's credentials",
                base.origin().ascii_serialization()
            ),
        });
    }
    Ok(url)
}

/// The connection's token, trimmed (tokens pasted from files often end in a newline);
/// `None` when absent or blank.
pub(crate) fn token(credentials: &Credentials) -> Option<&str> {
    credentials
        .token
        .as_ref()
        .map(|token| token.expose_secret().trim())
        .filter(|token| !token.is_empty())
}

/// `Bearer TOKEN` as a header value marked sensitive, so it never shows in `Debug` output.
pub(crate) fn bearer(kind: &str, token: &str) -> Result<HeaderValue, FetchError> {
    let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
        FetchError::MissingCredentials {
            message: format!(
                "the connection's token cannot be sent to the {kind} API: it contains \
                 characters that are not allowed in an HTTP header"
            ),
        }
    })?;
    value.set_sensitive(true);
    Ok(value)
}

/// The error for a connection without a token.
pub(crate) fn missing_token(kind: &str, what: &str) -> FetchError {
    FetchError::MissingCredentials {
        message: format!("the connection has no token, but the {kind} provider needs {what}"),
    }
}

/// The error for a position of a kind the adapter never hands out (e.g. a checkpoint
/// written by another provider kind).
pub(crate) fn position_mismatch(kind: &str, position: &PagePosition, expected: &str) -> FetchError {
    FetchError::PositionMismatch {
        message: format!(
            "cannot fetch the page at {position:?}: the {kind} provider pages by {expected} \
             (was the provider's kind changed since the checkpoint?)"
        ),
    }
}

/// A watermark as a point in time (an epoch watermark is read as seconds since the epoch).
pub(crate) fn watermark_time(watermark: &Watermark) -> Option<DateTime<Utc>> {
    match watermark {
        Watermark::Time(time) => Some(*time),
        Watermark::Epoch(seconds) => DateTime::from_timestamp(*seconds, 0),
    }
}

/// A watermark as seconds since the Unix epoch (a time watermark rounds down).
pub(crate) fn watermark_epoch(watermark: &Watermark) -> i64 {
    match watermark {
        Watermark::Time(time) => time.timestamp(),
        Watermark::Epoch(seconds) => *seconds,
    }
}

/// The latest RFC 3339 timestamp in the records' `field`, as a [`Watermark::Time`].
/// Records without a readable timestamp do not count.
pub(crate) fn max_time_watermark(records: &[Value], field: &str) -> Option<Watermark> {
    records
        .iter()
        .filter_map(|record| record.get(field)?.as_str())
        .filter_map(|text| DateTime::parse_from_rfc3339(text).ok())
        .map(|time| time.with_timezone(&Utc))
        .max()
        .map(Watermark::Time)
}

/// The largest integer in the records' `field`, as a [`Watermark::Epoch`].
pub(crate) fn max_epoch_watermark(records: &[Value], field: &str) -> Option<Watermark> {
    records
        .iter()
        .filter_map(|record| record.get(field)?.as_i64())
        .max()
        .map(Watermark::Epoch)
}

/// Each record keyed by its `id` field, or set aside with its payload. The canonical
/// text and hash of a page's records are computed on the blocking pool (see
/// [`crate::http::off_thread`]).
pub(crate) async fn items_by_id(records: Vec<Value>) -> Result<Vec<PageItem>, FetchError> {
    let identify = move || {
        let spec = IdSpec::Field("id".to_string());
        records
            .into_iter()
            .map(|raw| match spec.identify(raw) {
                Ok(record) => PageItem::Record(record),
                Err(rejected) => PageItem::Rejected(rejected),
            })
            .collect()
    };
    crate::http::off_thread(identify)
        .await
        .ok_or_else(|| FetchError::Client {
            message: "the runtime is shutting down".to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn base_urls_must_be_plain_http_or_https() {
        let check = |text: &str| validate_base_url("base_url", &Url::parse(text).unwrap());
        assert!(check("https://api.example.com").is_ok());
        assert!(check("http://127.0.0.1:8080/api/v3").is_ok());
        assert!(check("ftp://example.com")
            .unwrap_err()
            .contains("http or https"));
        assert!(check("https://example.com/?a=1")
            .unwrap_err()
            .contains("query"));
    }

    #[test]
    fn endpoints_join_without_double_slashes() {
        let base = Url::parse("https://ghe.example.com/api/v3/").unwrap();
        assert_eq!(
            endpoint(&base, "/issues").unwrap().as_str(),
            "https://ghe.example.com/api/v3/issues"
        );
    }

    #[test]
    fn watermarks_take_the_latest_readable_value() {
        let records = [
            json!({"t": "2024-01-02T00:00:00Z", "n": 5}),
            json!({"t": "2024-01-03T10:00:00+02:00", "n": 9}),
            json!({"t": "not a time", "n": "9"}),
            json!({}),
        ];
        let expected = DateTime::parse_from_rfc3339("2024-01-03T08:00:00Z").unwrap();
        assert_eq!(
            max_time_watermark(&records, "t"),
            Some(Watermark::Time(expected.with_timezone(&Utc)))
        );
        assert_eq!(
            max_epoch_watermark(&records, "n"),
            Some(Watermark::Epoch(9))
        );
        assert_eq!(max_time_watermark(&[], "t"), None);
        assert_eq!(
            watermark_epoch(&Watermark::Time(expected.into())),
            1704268800
        );
        assert_eq!(
            watermark_time(&Watermark::Epoch(1704268800)),
            Some(expected.with_timezone(&Utc))
        );
    }
}
