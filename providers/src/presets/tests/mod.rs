//! Tests of the presets: the merge itself, every preset file, and one wiremock emulation
//! per preset built from its API's documentation.

mod asana;
mod freshdesk;
mod gitlab;
mod harvest;
mod mechanism;
mod pipedrive;
mod shopify;

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use secrecy::SecretString;
use serde_json::Value as Json;
use wiremock::{Match, MockServer, Request, ResponseTemplate};

use super::apply;
use crate::http::HttpSettings;
use crate::{
    build_provider, Credentials, FetchContext, FetchError, NoCredentialStore, PageItem,
    PagePosition, Provider, ProviderConfig, Watermark,
};

const TOKEN: &str = "preset-token-123";

fn credentials(token: &str) -> Credentials {
    Credentials {
        token: Some(SecretString::from(token)),
        ..Credentials::default()
    }
}

/// The provider table a user writes, parsed.
fn table(text: &str) -> toml::Table {
    text.parse().unwrap()
}

/// The adapter config of a user's provider table, read the way the root crate reads it:
/// `apply`, `kind` taken out, `ProviderConfig::deserialize_kind`, `validate`.
fn config(text: &str) -> Result<ProviderConfig, String> {
    let mut table = table(text);
    apply(&mut table)?;
    let kind = match table.remove("kind") {
        Some(toml::Value::String(kind)) => kind,
        other => return Err(format!("no kind after apply: {other:?}")),
    };
    let config = ProviderConfig::deserialize_kind(&kind, toml::Value::Table(table))
        .map_err(|err| err.to_string())?;
    config.validate()?;
    Ok(config)
}

/// HTTP settings whose retries take milliseconds, so that only a `Retry-After` waits.
fn fast() -> HttpSettings {
    HttpSettings {
        max_retries: 2,
        retry_initial_delay: Duration::from_millis(1),
        retry_max_delay: Duration::from_millis(2),
        ..HttpSettings::default()
    }
}

/// The provider built from a user's provider table, as the daemon builds it.
fn provider(text: &str) -> Box<dyn Provider> {
    let config = config(text).unwrap();
    build_provider(&config, &fast()).unwrap()
}

/// A time for `since` and for the records' fields.
fn time(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .unwrap()
        .with_timezone(&Utc)
}

/// What a walk over every page gave: the ids in order, the newest watermark, the pages.
#[derive(Debug)]
struct Walk {
    ids: Vec<String>,
    watermark: Option<Watermark>,
    pages: usize,
}

/// Fetches page after page with `token` (from `since` when given) until there is no next.
async fn walk(
    provider: &dyn Provider,
    token: &str,
    since: Option<DateTime<Utc>>,
) -> Result<Walk, FetchError> {
    let credentials = credentials(token);
    let since = since.map(Watermark::Time);
    let context = FetchContext {
        stream: "records",
        parent: None,
        credentials: &credentials,
        since: since.as_ref(),
        credential_store: &NoCredentialStore,
        base_url: None,
    };
    let mut walk = Walk {
        ids: Vec::new(),
        watermark: None,
        pages: 0,
    };
    let mut position: Option<PagePosition> = None;
    for _ in 0..10 {
        let page = provider.fetch_page(&context, position.as_ref()).await?;
        walk.pages += 1;
        for item in &page.items {
            match item {
                PageItem::Record(record) => walk.ids.push(record.external_id.clone()),
                other => panic!("expected only records, got {other:?}"),
            }
        }
        walk.watermark = walk.watermark.take().max(page.watermark);
        match page.next {
            Some(next) => position = Some(next),
            None => return Ok(walk),
        }
    }
    panic!("the walk did not end after 10 pages: {walk:?}");
}

/// Matches a request whose query parameters are exactly these, in any order: no missing
/// one, no other.
struct ExactQuery(Vec<(String, String)>);

fn exact_query(pairs: &[(&str, &str)]) -> ExactQuery {
    let mut pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
    pairs.sort();
    ExactQuery(pairs)
}

impl Match for ExactQuery {
    fn matches(&self, request: &Request) -> bool {
        let mut sent: Vec<(String, String)> = request
            .url
            .query_pairs()
            .map(|(name, value)| (name.into_owned(), value.into_owned()))
            .collect();
        sent.sort();
        sent == self.0
    }
}

/// A 200 answer with a JSON body.
fn json(body: Json) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(body)
}

/// Walks `provider` against a server whose first answer is `limited` (a 429 mounted by
/// the caller with `up_to_n_times(1)`), and checks that the client waited out its
/// `Retry-After` of one second and then read the records.
async fn assert_waits_out_429(provider: &dyn Provider, token: &str, expected_ids: &[&str]) {
    let started = Instant::now();
    let walk = walk(provider, token, None).await.unwrap();
    assert_eq!(walk.ids, expected_ids);
    assert_waited_a_second(started, "the retry");
}

/// Asserts that at least the second the API asked for passed since `started` before
/// `what` was sent.
fn assert_waited_a_second(started: Instant, what: &str) {
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(950),
        "{what} came after {waited:?}, before the second the API asked to wait"
    );
}

/// The error of walking `provider`, which must be the API's refusal of the credentials.
async fn unauthorized(provider: &dyn Provider, token: &str) -> String {
    let error = walk(provider, token, None).await.unwrap_err();
    assert!(
        matches!(error, FetchError::Unauthorized { status: 401, .. }),
        "{error:?}"
    );
    error.to_string()
}

/// How many requests `server` received.
async fn requests(server: &MockServer) -> usize {
    server.received_requests().await.unwrap_or_default().len()
}
