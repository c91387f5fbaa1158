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

/// The external ids of a page's items; rejected ones as `!reason`.
pub(crate) fn ids(items: &[PageItem]) -> Vec<String> {
    items
        .iter()
        .map(|item| match item {
            PageItem::Record(record) => record.external_id.clone(),
            PageItem::Rejected(rejected) => format!("!{}", rejected.message),
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
