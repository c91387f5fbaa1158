//! Helpers shared by the built-in adapters (`github`, `stripe`, `strava`): base URL checks,
//! endpoints, the bearer header, watermarks and turning a JSON array into page items.

use std::collections::HashSet;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use reqwest::header::HeaderValue;
use secrecy::ExposeSecret;
use serde_json::value::RawValue;
use serde_json::Value;
use url::Url;

use crate::http::{display_url, display_url_text, Answered};
use crate::raw::NotItems;
use crate::{raw, Credentials, FetchError, IdSpec, Page, PageItem, PagePosition, Watermark};

/// Checks a `base_url` setting: https (or http on loopback), with a host, without a query
/// or fragment. A built-in adapter always sends a token, so plain http to another host
/// (most likely a typo) would send it in clear.
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
    if url.scheme() == "http" && !is_loopback(url) {
        return Err(format!(
            "{key} must be an https URL: plain http is allowed only on loopback (127.0.0.1, \
             ::1, localhost), since the connection's token would travel in clear to {}",
            url.host_str().unwrap_or_default()
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("{key} must not carry a query string or fragment"));
    }
    Ok(())
}

/// Whether the URL's host is this machine: a loopback address or `localhost`.
pub fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(address)) => address.is_loopback(),
        Some(url::Host::Ipv6(address)) => address.is_loopback(),
        Some(url::Host::Domain(name)) => {
            name.eq_ignore_ascii_case("localhost")
                || name.to_ascii_lowercase().ends_with(".localhost")
        }
        None => false,
    }
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
            "cannot fetch the page at {}: the {kind} provider pages by {expected} \
             (was the provider's kind changed since the checkpoint?)",
            position.describe()
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

/// Where a provider's records carry their watermark.
#[derive(Clone, Copy, Debug)]
pub(crate) enum WatermarkField {
    /// An RFC 3339 timestamp field, read as a [`Watermark::Time`].
    Time(&'static str),
    /// An integer field (seconds since the epoch), read as a [`Watermark::Epoch`].
    Epoch(&'static str),
}

impl WatermarkField {
    fn name(self) -> &'static str {
        match self {
            WatermarkField::Time(name) | WatermarkField::Epoch(name) => name,
        }
    }

    /// The watermark `record` holds in this field; `None` when it is missing or unreadable.
    pub(crate) fn in_record(self, record: &RawValue) -> Option<Watermark> {
        raw::lookup_raw(record, self.name()).and_then(|field| self.read(field))
    }

    /// The watermark one record's field holds; `None` when it is missing or unreadable.
    fn read(self, raw: &RawValue) -> Option<Watermark> {
        match (self, raw::to_value(raw)) {
            (WatermarkField::Time(_), Value::String(text)) => DateTime::parse_from_rfc3339(&text)
                .ok()
                .map(|time| Watermark::Time(time.with_timezone(&Utc))),
            (WatermarkField::Epoch(_), value) => value.as_i64().map(Watermark::Epoch),
            _ => None,
        }
    }
}

/// The watermarks of one page's records.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct PageWatermarks {
    /// The newest readable watermark.
    pub newest: Option<Watermark>,
    /// How many lie beyond the clock by more than [`crate::WATERMARK_CLOCK_SKEW`].
    pub ahead: u64,
}

/// Each record keyed by `spec`, or set aside with its payload, and the page's watermarks
/// (records without a readable one do not count). Each record is scanned once. Records
/// set aside for the same reason share one copy of its message.
pub(crate) fn identify_records(
    spec: &IdSpec,
    records: &[&RawValue],
    watermark_field: Option<WatermarkField>,
) -> (Vec<PageItem>, PageWatermarks) {
    let now = Utc::now();
    let mut watermarks = PageWatermarks::default();
    let mut messages: HashSet<Arc<str>> = HashSet::new();
    let items = records
        .iter()
        .map(|raw| {
            let (record, field) =
                spec.identify_with_field(raw, watermark_field.map(WatermarkField::name));
            if let Some(watermark) = watermark_field
                .zip(field)
                .and_then(|(kind, field)| kind.read(field))
            {
                if watermark.is_beyond_skew(now) {
                    watermarks.ahead = watermarks.ahead.saturating_add(1);
                }
                watermarks.newest = watermarks.newest.take().max(Some(watermark));
            }
            match record {
                Ok(record) => PageItem::Record(record),
                Err(mut rejected) => {
                    rejected.message = shared(&mut messages, rejected.message);
                    PageItem::Rejected(rejected)
                }
            }
        })
        .collect();
    (items, watermarks)
}

/// The copy of `message` already in `messages`, or `message`, kept there from now on.
fn shared(messages: &mut HashSet<Arc<str>>, message: Arc<str>) -> Arc<str> {
    if let Some(known) = messages.get(&message) {
        return Arc::clone(known);
    }
    messages.insert(Arc::clone(&message));
    message
}

/// A page of records keyed by their `id` field, with the newest `watermark_field`.
pub(crate) fn page_by_id(
    records: &[&RawValue],
    watermark_field: WatermarkField,
    next: Option<PagePosition>,
) -> Page {
    let spec = IdSpec::Field("id".to_string());
    let (items, watermarks) = identify_records(&spec, records, Some(watermark_field));
    Page {
        items,
        next,
        watermark: watermarks.newest,
        watermarks_ahead: watermarks.ahead,
        stop_after: None,
        parent_gone: None,
        filtered: 0,
    }
}

/// A body that is a JSON array of records (GitHub's issues, Strava's activities) as a page
/// keyed by `id`; `next` sees how many records the page held. `what` names the records in
/// the error for a body of another shape. The body is read in the scan that checks it is
/// JSON (see [`crate::http::HttpClient::get_read`]).
pub(crate) fn array_page_by_id(
    answered: &Answered<'_>,
    what: &str,
    watermark_field: WatermarkField,
    next: impl FnOnce(usize) -> Option<PagePosition>,
) -> Result<Page, FetchError> {
    let records = array_records(answered, what)?;
    let next = next(records.len());
    Ok(page_by_id(&records, watermark_field, next))
}

/// The records of a body that is a JSON array, for an adapter that looks at them before
/// making the page; `what` names the records in the error for a body of another shape.
/// The body is read in the scan that checks it is JSON.
pub(crate) fn array_records<'a>(
    answered: &Answered<'a>,
    what: &str,
) -> Result<Vec<&'a RawValue>, FetchError> {
    let body = answered.text;
    raw::array_items_text(body, answered.max_records).map_err(|not_items| {
        unreadable_records(
            answered.url,
            body,
            answered.max_records,
            not_items,
            |kind| format!("the body is {}, expected an array of {what}", kind.name()),
        )
    })
}

/// A body that is one JSON object (Strava's athlete) as a page of that one record, keyed
/// by `id`, without a watermark; `what` names the record in the error for a body of
/// another shape. The whole body is read with serde_json, so what it accepts is JSON.
pub(crate) fn object_page_by_id(answered: &Answered<'_>, what: &str) -> Result<Page, FetchError> {
    let body = answered.text;
    let shape_error = |message: String| FetchError::Shape {
        url: display_url(answered.url),
        message,
        body: crate::http::cap_body(body.as_bytes()),
    };
    // Never surfaced: a body serde_json cannot read is not JSON, and the client reports
    // it as such (and retries).
    let record = serde_json::from_str::<&RawValue>(body)
        .map_err(|err| shape_error(format!("the body is not JSON: {err}")))?;
    let kind = raw::json_kind(record);
    if kind != raw::JsonKind::Object {
        return Err(shape_error(format!(
            "the body is {}, expected {what} as an object",
            kind.name()
        )));
    }
    let spec = IdSpec::Field("id".to_string());
    let (items, _) = identify_records(&spec, &[record], None);
    Ok(Page {
        items,
        ..Page::default()
    })
}

/// The error for a page (`body`, from `url`) whose records could not be read: past
/// `max_records`, the cap and the count; otherwise a shape error saying `shape_message` of
/// what was found.
pub(crate) fn unreadable_records(
    url: &Url,
    body: &str,
    max_records: usize,
    not_items: NotItems,
    shape_message: impl FnOnce(raw::JsonKind) -> String,
) -> FetchError {
    let url = display_url(url);
    let body = crate::http::cap_body(body.as_bytes());
    match not_items {
        NotItems::TooMany { count } => FetchError::TooManyRecords {
            url,
            count,
            limit: max_records,
            body,
        },
        NotItems::Kind(kind) => FetchError::Shape {
            url,
            message: shape_message(kind),
            body,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_set_aside_for_one_reason_share_its_message() {
        let body: Box<RawValue> =
            serde_json::from_str(r#"[{"n":1}, {"n":2}, 3, {"id":"x"}, {"n":4}]"#).unwrap();
        let records = raw::array_items(&body, 10).unwrap();
        let spec = IdSpec::Field("id".to_string());
        let (items, _) = identify_records(&spec, &records, None);
        let messages: Vec<&Arc<str>> = items
            .iter()
            .filter_map(|item| match item {
                PageItem::Rejected(rejected) => Some(&rejected.message),
                PageItem::Record(_) | PageItem::Deleted(_) => None,
            })
            .collect();
        assert_eq!(messages.len(), 4);
        assert!(Arc::ptr_eq(messages[0], messages[1]));
        assert!(Arc::ptr_eq(messages[0], messages[3]));
        assert!(!Arc::ptr_eq(messages[0], messages[2]), "another reason");
        assert_eq!(&**messages[0], "record has no id field `id`");
    }

    #[test]
    fn base_urls_must_be_https_or_http_on_loopback() {
        let check = |text: &str| validate_base_url("base_url", &Url::parse(text).unwrap());
        assert!(check("https://api.example.com").is_ok());
        assert!(check("http://127.0.0.1:8080/api/v3").is_ok());
        assert!(check("http://127.8.0.1:8080").is_ok());
        assert!(check("http://[::1]:8080").is_ok());
        assert!(check("http://localhost:8080").is_ok());
        for clear in [
            "http://api.stripe.com",
            "http://10.0.0.1",
            "http://localhost.example.com",
            "http://[::2]",
        ] {
            let error = check(clear).unwrap_err();
            assert!(error.contains("must be an https URL"), "{clear}: {error}");
        }
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
        let body: Box<RawValue> = serde_json::from_str(
            r#"[{"id":1,"t":"2024-01-02T00:00:00Z","n":5},
                {"id":2,"t":"2024-01-03T10:00:00+02:00","n":9},
                {"id":3,"t":"not a time","n":"9"},
                {"id":4}]"#,
        )
        .unwrap();
        let records = raw::array_items(&body, 10).unwrap();
        let spec = IdSpec::Field("id".to_string());
        let expected = DateTime::parse_from_rfc3339("2024-01-03T08:00:00Z").unwrap();
        let (items, time) = identify_records(&spec, &records, Some(WatermarkField::Time("t")));
        assert_eq!(items.len(), 4);
        assert_eq!(
            time.newest,
            Some(Watermark::Time(expected.with_timezone(&Utc)))
        );
        assert_eq!(time.ahead, 0);
        let (_, epoch) = identify_records(&spec, &records, Some(WatermarkField::Epoch("n")));
        assert_eq!(epoch.newest, Some(Watermark::Epoch(9)));
        assert_eq!(
            identify_records(&spec, &[], None).1,
            PageWatermarks::default()
        );
        assert_eq!(
            watermark_epoch(&Watermark::Time(expected.into())),
            1704268800
        );
        assert_eq!(
            watermark_time(&Watermark::Epoch(1704268800)),
            Some(expected.with_timezone(&Utc))
        );
    }

    #[test]
    fn watermarks_beyond_the_clock_skew_are_counted() {
        let body: Box<RawValue> = serde_json::from_str(
            r#"[{"id":1,"t":"9999-12-31T23:59:59Z","n":253402300799},
                {"id":2,"t":"2024-01-02T00:00:00Z","n":1704153600},
                {"id":3,"t":"9999-01-01T00:00:00Z","n":9223372036854775807}]"#,
        )
        .unwrap();
        let records = raw::array_items(&body, 10).unwrap();
        let spec = IdSpec::Field("id".to_string());
        let (_, time) = identify_records(&spec, &records, Some(WatermarkField::Time("t")));
        assert_eq!(time.ahead, 2);
        let (_, epoch) = identify_records(&spec, &records, Some(WatermarkField::Epoch("n")));
        assert_eq!(
            (epoch.ahead, epoch.newest),
            (2, Some(Watermark::Epoch(i64::MAX)))
        );
        let now = Utc::now();
        let soon = Watermark::Time(now + chrono::TimeDelta::minutes(1));
        assert!(soon.is_after(now) && !soon.is_beyond_skew(now));
        assert_eq!(soon.at_most(now), Watermark::Time(now));
        assert_eq!(
            Watermark::Epoch(i64::MAX).at_most(now),
            Watermark::Epoch(now.timestamp())
        );
    }
}
