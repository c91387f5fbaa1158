//! Helpers shared by the adapters' tests.

use std::time::Duration;

use secrecy::SecretString;

use crate::http::{HttpClient, HttpSettings};
use crate::{Credentials, Page, PageItem};

/// Tiny backoff delays so retry tests stay fast.
pub(crate) fn fast_settings() -> HttpSettings {
    HttpSettings {
        timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(2),
        max_retries: 2,
        retry_initial_delay: Duration::from_millis(1),
        retry_max_delay: Duration::from_millis(5),
        ..HttpSettings::default()
    }
}

/// A client with [`fast_settings`].
pub(crate) fn fast_client() -> HttpClient {
    HttpClient::new(fast_settings()).unwrap()
}

/// Credentials holding only `token`.
pub(crate) fn token_credentials(token: &str) -> Credentials {
    Credentials {
        token: Some(SecretString::from(token)),
        ..Credentials::default()
    }
}

/// The external ids of a page's items; rejected ones as `!reason`, deleted ones as `-id`.
pub(crate) fn ids(items: &[PageItem]) -> Vec<String> {
    items
        .iter()
        .map(|item| match item {
            PageItem::Record(record) => record.external_id.clone(),
            PageItem::Rejected(rejected) => format!("!{}", rejected.message),
            PageItem::Deleted(deleted) => format!("-{}", deleted.external_id),
        })
        .collect()
}

/// Asserts that `page` holds the records `expected` and ends the listing with a reason
/// that mentions `reason` (see [`Page::stop_after`]).
pub(crate) fn assert_stops_after(page: &Page, expected: &[&str], reason: &str) {
    assert_eq!(ids(&page.items), expected);
    assert_eq!(page.next, None);
    let stop = page.stop_after.as_deref().unwrap_or_default();
    assert!(
        stop.contains(reason),
        "{stop:?} does not mention {reason:?}"
    );
}

/// proptest settings: `cases` cases, a fixed seed (so the suite is repeatable) unless
/// `PROPTEST_RNG_SEED` is set, and no regression files.
pub(crate) fn proptest_config(cases: u32, seed: u64) -> proptest::test_runner::Config {
    let mut config = proptest::test_runner::Config::with_cases(cases);
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = proptest::test_runner::RngSeed::Fixed(seed);
    }
    config.failure_persistence = None;
    config
}

/// Header text of every kind an API might send: arbitrary strings, integers of any size
/// and sign, digits past `u64`, HTTP dates up to year 9999 and date-shaped strings.
pub(crate) fn header_text() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    prop_oneof![
        any::<String>(),
        any::<u64>().prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        "[0-9]{19,40}",
        "-?[0-9]{1,4}(\\.[0-9]{1,3})?",
        (0u64..253_402_300_800).prop_map(|seconds| httpdate::fmt_http_date(
            std::time::UNIX_EPOCH + Duration::from_secs(seconds)
        )),
        "[A-Z][a-z]{2}, [0-9]{2} [A-Z][a-z]{2} [0-9]{4,6} [0-9]{2}:[0-9]{2}:[0-9]{2} GMT",
        "[0-9]{1,20},[0-9]{1,20}",
        "-?[0-9]{1,25} *, *-?[0-9]{1,25}",
    ]
}

/// `pairs` as a header map, leaving out values that cannot be sent as a header value.
pub(crate) fn header_map(pairs: &[(&'static str, &str)]) -> reqwest::header::HeaderMap {
    let mut headers = reqwest::header::HeaderMap::new();
    for (name, value) in pairs {
        if let Ok(value) = reqwest::header::HeaderValue::from_str(value) {
            headers.insert(*name, value);
        }
    }
    headers
}

/// The value of the query parameter `name` of a request an emulated API received.
pub(crate) fn query_value(request: &wiremock::Request, name: &str) -> Option<String> {
    request
        .url
        .query_pairs()
        .find(|(own, _)| own == name)
        .map(|(_, value)| value.into_owned())
}
