//! Tests of the rest provider: its configuration, and fetching pages from wiremock APIs.

mod auth;
mod bodies;
mod config;
mod fetch;
mod incremental;
mod max_page;
mod paging;
mod rate_limits;
mod records;
mod streams;

use secrecy::SecretString;
use serde_json::{json, Value};
use wiremock::MockServer;

use super::{RestConfig, RestProvider};
use crate::http::{HttpClient, HttpSettings};
use crate::{
    Credentials, FetchContext, FetchError, PageItem, PagePosition, Provider, ProviderConfig,
};

const TOKEN: &str = "sekret-token-123";

fn credentials() -> Credentials {
    Credentials {
        token: Some(SecretString::from(TOKEN)),
        ..Credentials::default()
    }
}

/// A `ProviderConfig` from JSON, the way the root crate hands over a `[providers.NAME]` table.
fn provider_config(value: Value) -> Result<ProviderConfig, serde_json::Error> {
    serde_json::from_value(value)
}

/// A validated rest config for `server`: `{"kind": "rest", "base_url": ..., "path":
/// "/v1/items", "records_path": "data"}` with `extra` merged in.
fn rest_config(server: &MockServer, extra: Value) -> RestConfig {
    let mut value = json!({
        "kind": "rest",
        "base_url": server.uri(),
        "path": "/v1/items",
        "records_path": "data",
    });
    if let (Some(base), Value::Object(extra)) = (value.as_object_mut(), extra) {
        base.extend(extra);
    }
    let config = provider_config(value).unwrap();
    config.validate().unwrap();
    let ProviderConfig::Rest(config) = config else {
        panic!("expected a rest config, got {config:?}");
    };
    config
}

fn provider(server: &MockServer, extra: Value) -> RestProvider {
    let settings = HttpSettings {
        max_retries: 2,
        retry_initial_delay: std::time::Duration::from_millis(1),
        retry_max_delay: std::time::Duration::from_millis(2),
        ..HttpSettings::default()
    };
    RestProvider::new(
        rest_config(server, extra),
        HttpClient::new(settings).unwrap(),
    )
}

/// `validate()`'s message for `{"kind": "rest", "base_url": "https://api.example.com"}`
/// with `extra` merged in.
fn invalid_rest(extra: Value) -> String {
    let mut value = json!({"kind": "rest", "base_url": "https://api.example.com"});
    if let (Some(base), Value::Object(extra)) = (value.as_object_mut(), extra) {
        base.extend(extra);
    }
    provider_config(value).unwrap().validate().unwrap_err()
}

/// The query strings of the requests `server` received, in order (`""` for none).
async fn queries(server: &MockServer) -> Vec<String> {
    server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|request| request.url.query().unwrap_or_default().to_string())
        .collect()
}

/// The external ids of a page's items; rejected ones as `!reason`, deleted ones as `-id`.
fn ids(items: &[PageItem]) -> Vec<String> {
    items
        .iter()
        .map(|item| match item {
            PageItem::Record(record) => record.external_id.clone(),
            PageItem::Rejected(rejected) => format!("!{}", rejected.message),
            PageItem::Deleted(deleted) => format!("-{}", deleted.external_id),
        })
        .collect()
}

/// Fetches page after page until `next` is `None`: all ids, and the positions asked for.
async fn walk(
    provider: &RestProvider,
    credentials: &Credentials,
) -> Result<(Vec<String>, Vec<Option<PagePosition>>), FetchError> {
    let mut all = Vec::new();
    let mut positions = vec![None];
    let mut position: Option<PagePosition> = None;
    for _ in 0..10 {
        let page = provider
            .fetch_page(
                &FetchContext::full(credentials, "records"),
                position.as_ref(),
            )
            .await?;
        all.extend(ids(&page.items));
        match page.next {
            Some(next) => {
                positions.push(Some(next.clone()));
                position = Some(next);
            }
            None => return Ok((all, positions)),
        }
    }
    panic!("the walk did not end after 10 pages: {all:?}");
}
