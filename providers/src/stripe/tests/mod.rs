//! The stripe adapter against a wiremock emulation of Stripe's list endpoints and Events
//! API as Stripe documents them. Every mock asserts the key and the pinned
//! `Stripe-Version`.

mod events;
mod streams;

use serde::Deserialize;
use serde_json::{json, Value};
use wiremock::matchers::{header, method, path, query_param, query_param_is_missing};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

use super::{StripeConfig, StripeProvider, DEFAULT_API_VERSION};
use crate::test_support::{fast_client, ids, token_credentials};
use crate::{
    FetchContext, FetchError, NoCredentialStore, Page, PagePosition, ParentRecord, Provider,
    ProviderConfig, Watermark,
};

const KEY: &str = "sk_test_51Sekret0123456789";

fn provider(server: &MockServer) -> StripeProvider {
    provider_with_limit(server, 100)
}

/// A provider asking for `limit` objects a page, so that a few objects make several pages.
fn provider_with_limit(server: &MockServer, limit: u32) -> StripeProvider {
    let config = StripeConfig {
        base_url: server.uri().parse().unwrap(),
        limit,
        ..StripeConfig::default()
    };
    config.validate().unwrap();
    StripeProvider::new(config, fast_client())
}

fn charge(id: &str, created: i64) -> Value {
    json!({"id": id, "object": "charge", "amount": 500, "currency": "eur", "created": created})
}

fn list(charges: Vec<Value>, has_more: bool) -> Value {
    json!({"object": "list", "data": charges, "has_more": has_more, "url": "/v1/charges"})
}

fn stripe_error(kind: &str, code: Option<&str>, message: &str) -> Value {
    let mut error = json!({"type": kind, "message": message});
    if let Some(code) = code {
        error["code"] = json!(code);
    }
    json!({"error": error})
}

/// A `GET /v1/charges` mock with the documented parameters and the key asserted.
fn charges() -> wiremock::MockBuilder {
    Mock::given(method("GET"))
        .and(path("/v1/charges"))
        .and(query_param("limit", "100"))
        .and(header("authorization", format!("Bearer {KEY}").as_str()))
        .and(header("stripe-version", DEFAULT_API_VERSION))
}

/// Matches a request whose query holds exactly these pairs, in any order.
struct ExactQuery(Vec<(String, String)>);

impl wiremock::Match for ExactQuery {
    fn matches(&self, request: &Request) -> bool {
        let mut pairs: Vec<(String, String)> = request.url.query_pairs().into_owned().collect();
        pairs.sort();
        pairs == self.0
    }
}

/// A `GET` of `path` with exactly the query `query`, the key and the pinned version.
fn get(path_text: &str, query: &[(&str, &str)]) -> wiremock::MockBuilder {
    let mut query: Vec<(String, String)> = query
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect();
    query.sort();
    Mock::given(method("GET"))
        .and(path(path_text))
        .and(ExactQuery(query))
        .and(header("authorization", format!("Bearer {KEY}").as_str()))
        .and(header("stripe-version", DEFAULT_API_VERSION))
}

/// A 200 answer with `body`.
fn answer(body: Value) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(body)
}

async fn fetch(
    provider: &StripeProvider,
    position: Option<&PagePosition>,
) -> Result<crate::Page, FetchError> {
    provider
        .fetch_page(
            &FetchContext::full(&token_credentials(KEY), "charges"),
            position,
        )
        .await
}

/// The page of `stream` at `position`, with the cursor `since` and the invoice `parent`.
async fn fetch_stream(
    provider: &StripeProvider,
    stream: &str,
    since: Option<&Watermark>,
    parent: Option<ParentRecord<'_>>,
    position: Option<&PagePosition>,
) -> Result<Page, FetchError> {
    let credentials = token_credentials(KEY);
    let context = FetchContext {
        stream,
        parent,
        credentials: &credentials,
        since,
        credential_store: &NoCredentialStore,
        base_url: None,
    };
    provider.fetch_page(&context, position).await
}

/// Every page of `stream`, from the first to the one without a next position.
async fn walk(
    provider: &StripeProvider,
    stream: &str,
    since: Option<&Watermark>,
    parent: Option<ParentRecord<'_>>,
) -> Vec<Page> {
    let mut pages: Vec<Page> = Vec::new();
    loop {
        let position = pages.last().and_then(|page| page.next.clone());
        if !pages.is_empty() && position.is_none() {
            return pages;
        }
        assert!(pages.len() < 20, "the walk of {stream} does not end");
        let page = fetch_stream(provider, stream, since, parent, position.as_ref())
            .await
            .unwrap_or_else(|error| panic!("{stream}: {error}"));
        pages.push(page);
    }
}

/// The cursor a position holds, for assertions.
fn cursor(text: &str) -> Option<PagePosition> {
    Some(PagePosition::Cursor {
        cursor: text.to_string(),
    })
}

/// The query strings of the requests `server` received for `path_text`, in order.
async fn queries(server: &MockServer, path_text: &str) -> Vec<String> {
    let requests = server.received_requests().await.unwrap_or_default();
    requests
        .iter()
        .filter(|request| request.url.path() == path_text)
        .map(|request| {
            let mut pairs: Vec<String> = request
                .url
                .query_pairs()
                .map(|(name, value)| format!("{name}={value}"))
                .collect();
            pairs.sort();
            pairs.join("&")
        })
        .collect()
}

/// The seconds since the epoch now.
fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

#[tokio::test]
async fn rate_limits_and_server_errors_are_retried_with_backoff() {
    let server = MockServer::start().await;
    charges()
        .respond_with(ResponseTemplate::new(429).set_body_json(stripe_error(
            "invalid_request_error",
            Some("rate_limit"),
            "Too many requests hit the API too quickly.",
        )))
        .up_to_n_times(1)
        .with_priority(1)
        .expect(1)
        .mount(&server)
        .await;
    charges()
        .respond_with(ResponseTemplate::new(500).set_body_json(stripe_error(
            "api_error",
            None,
            "Something went wrong.",
        )))
        .up_to_n_times(1)
        .with_priority(2)
        .expect(1)
        .mount(&server)
        .await;
    charges()
        .respond_with(ResponseTemplate::new(200).set_body_json(list(vec![], false)))
        .expect(1)
        .mount(&server)
        .await;
    fetch(&provider(&server), None).await.unwrap();
}

#[tokio::test]
async fn a_body_that_is_not_json_is_retried_and_a_json_body_of_another_shape_is_not() {
    let server = MockServer::start().await;
    // The list is read in the scan that checks the body is JSON: a body cut short must
    // still be retried as a body that is not JSON, not taken for a list of another shape.
    charges()
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("content-type", "application/json")
                .set_body_string(r#"{"object":"list","data":[{"id":"ch_1","created":1"#),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .expect(1)
        .mount(&server)
        .await;
    charges()
        .respond_with(
            ResponseTemplate::new(200).set_body_json(list(vec![charge("ch_1", 1)], false)),
        )
        .expect(1)
        .mount(&server)
        .await;
    let page = fetch(&provider(&server), None).await.unwrap();
    assert_eq!(ids(&page.items), ["ch_1"]);
    server.verify().await;

    server.reset().await;
    charges()
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": {}})))
        .mount(&server)
        .await;
    let error = fetch(&provider(&server), None).await.unwrap_err();
    assert!(matches!(error, FetchError::Shape { .. }), "{error:?}");
    let requests = server.received_requests().await.unwrap_or_default();
    assert_eq!(
        requests.len(),
        1,
        "a JSON body of another shape is not retried"
    );

    server.reset().await;
    let garbled = r#"{"object":"list","data":[],"has_more":false} trailing"#;
    charges()
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("content-type", "application/json")
                .set_body_string(garbled),
        )
        .mount(&server)
        .await;
    let error = fetch(&provider(&server), None).await.unwrap_err();
    let FetchError::InvalidJson { attempts, body, .. } = &error else {
        panic!("expected InvalidJson, got {error:?}");
    };
    let requests = server.received_requests().await.unwrap_or_default();
    assert_eq!(*attempts as usize, requests.len());
    assert!(requests.len() > 1, "a body that is not JSON is retried");
    assert_eq!(body, garbled);
}

#[tokio::test]
async fn stripe_should_retry_false_stops_retrying_at_once() {
    let server = MockServer::start().await;
    charges()
        .respond_with(
            ResponseTemplate::new(500)
                .insert_header("stripe-should-retry", "false")
                .set_body_json(stripe_error("api_error", None, "Do not retry this.")),
        )
        .expect(1)
        .mount(&server)
        .await;
    let error = fetch(&provider(&server), None).await.unwrap_err();
    assert!(
        matches!(&error, FetchError::Status { status: 500, attempts: 1, message, .. }
            if message == "Do not retry this. (type api_error)"),
        "{error:?}"
    );
}

#[tokio::test]
async fn stripe_should_retry_true_retries_even_a_conflict() {
    let server = MockServer::start().await;
    charges()
        .respond_with(
            ResponseTemplate::new(409)
                .insert_header("stripe-should-retry", "true")
                .set_body_json(stripe_error(
                    "invalid_request_error",
                    Some("lock_timeout"),
                    "This object cannot be accessed right now.",
                )),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .expect(1)
        .mount(&server)
        .await;
    charges()
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(list(vec![charge("ch_1", 1_700_000_000)], false)),
        )
        .expect(1)
        .mount(&server)
        .await;
    let page = fetch(&provider(&server), None).await.unwrap();
    assert_eq!(ids(&page.items), ["ch_1"]);
}

#[tokio::test]
async fn unauthorized_and_other_errors_surface_stripes_message_and_type() {
    let server = MockServer::start().await;
    Mock::given(path("/v1/charges"))
        .and(query_param("starting_after", "ch_gone"))
        .respond_with(ResponseTemplate::new(400).set_body_json(stripe_error(
            "invalid_request_error",
            Some("resource_missing"),
            "No such charge: 'ch_gone'",
        )))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(path("/v1/charges"))
        .and(query_param_is_missing("starting_after"))
        .respond_with(ResponseTemplate::new(401).set_body_json(stripe_error(
            "invalid_request_error",
            None,
            &format!("Invalid API Key provided: {KEY}"),
        )))
        .expect(1)
        .mount(&server)
        .await;
    let provider = provider(&server);
    let gone = PagePosition::Cursor {
        cursor: "ch_gone".into(),
    };
    let error = fetch(&provider, Some(&gone)).await.unwrap_err();
    assert!(
        matches!(
            &error,
            FetchError::Status {
                status: 400,
                attempts: 1,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(
        error.to_string().ends_with(
            "answered HTTP 400 after 1 attempt: No such charge: 'ch_gone' \
             (type invalid_request_error, code resource_missing)"
        ),
        "{error}"
    );
    let error = fetch(&provider, None).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "credentials were rejected (HTTP 401): Invalid API Key provided: [redacted] \
         (type invalid_request_error)"
    );
    let shown = format!("{error:?} {provider:?}");
    assert!(!shown.contains(KEY), "{shown}");
}

#[tokio::test]
async fn bodies_that_are_not_stripe_lists_are_shape_errors() {
    let server = MockServer::start().await;
    let cases = [
        (
            json!({"data": {}, "has_more": false}),
            "`data` is an object",
        ),
        (json!({"data": []}), "`has_more` is missing"),
        (
            list(vec![json!({"amount": 1})], true),
            "no last charge with a string `id`",
        ),
    ];
    let provider = provider(&server);
    for (body, expected) in cases {
        server.reset().await;
        charges()
            .respond_with(ResponseTemplate::new(200).set_body_json(body))
            .mount(&server)
            .await;
        let error = fetch(&provider, None).await.unwrap_err();
        assert!(matches!(error, FetchError::Shape { .. }), "{error:?}");
        assert!(error.to_string().contains(expected), "{error}");
    }
    let error = fetch(&provider, Some(&PagePosition::Page { page: 2 }))
        .await
        .unwrap_err();
    assert!(
        matches!(error, FetchError::PositionMismatch { .. }),
        "{error:?}"
    );
}

#[tokio::test]
async fn an_overriding_api_version_is_sent_on_every_request_of_every_kind() {
    let server = MockServer::start().await;
    let pinned = "2025-03-31.basil";
    let version = || header("stripe-version", pinned);
    let auth = || header("authorization", format!("Bearer {KEY}").as_str());
    Mock::given(path("/v1/charges"))
        .and(version())
        .and(auth())
        .respond_with(answer(list(vec![charge("ch_1", 1)], false)))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(path("/v1/events"))
        .and(version())
        .and(auth())
        .respond_with(answer(list(vec![], false)))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(path("/v1/invoices/in_1/lines"))
        .and(version())
        .and(auth())
        .respond_with(answer(list(vec![], false)))
        .expect(1)
        .mount(&server)
        .await;
    let provider = StripeProvider::new(
        StripeConfig {
            base_url: server.uri().parse().unwrap(),
            api_version: pinned.to_string(),
            ..StripeConfig::default()
        },
        fast_client(),
    );
    let page = fetch(&provider, None).await.unwrap();
    assert_eq!(ids(&page.items), ["ch_1"]);
    let since = Watermark::Epoch(now() - 60);
    fetch_stream(&provider, "charges", Some(&since), None, None)
        .await
        .unwrap();
    let invoice = ParentRecord {
        external_id: "in_1",
        payload: r#"{"id":"in_1","object":"invoice"}"#,
    };
    fetch_stream(&provider, "invoice_line_items", None, Some(invoice), None)
        .await
        .unwrap();
    let requests = server.received_requests().await.unwrap_or_default();
    assert_eq!(requests.len(), 3, "each request matched a mock");
}

#[test]
fn config_defaults_ranges_and_unknown_keys() {
    let table: toml::Table = toml::from_str("kind = \"stripe\"").unwrap();
    let config = ProviderConfig::deserialize(table).unwrap();
    config.validate().unwrap();
    assert_eq!(config.kind(), "stripe");
    assert!(config.needs_token());
    let ProviderConfig::Stripe(stripe) = config else {
        panic!("expected a stripe config, got {config:?}");
    };
    assert_eq!(stripe, StripeConfig::default());
    assert_eq!(stripe.base_url.as_str(), "https://api.stripe.com/");
    assert_eq!(stripe.limit, 100);
    assert_eq!(stripe.api_version, DEFAULT_API_VERSION);
    let parse = |text: &str| {
        let table: toml::Table = toml::from_str(text).unwrap();
        ProviderConfig::deserialize_kind("stripe", table)
    };
    for text in ["limit = 0", "limit = 101"] {
        let error = parse(text).unwrap().validate().unwrap_err();
        assert!(error.contains("limit must be between 1 and 100"), "{error}");
    }
    let error = parse("limt = 10").unwrap_err().to_string();
    assert!(error.contains("unknown field `limt`"), "{error}");
    for version in ["2024-06-20", "2025-03-31.basil", DEFAULT_API_VERSION] {
        let config = parse(&format!("api_version = {version:?}")).unwrap();
        config.validate().unwrap();
        let ProviderConfig::Stripe(stripe) = config else {
            panic!("expected a stripe config, got {config:?}");
        };
        assert_eq!(stripe.api_version, version);
    }
    for version in [
        "",
        "latest",
        "2024-6-20",
        "2024-06-20.",
        "2024-06-20.Basil",
        "2024-06-20\n",
    ] {
        let error = parse(&format!("api_version = {version:?}"))
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(
            error.contains("api_version must be a Stripe API version")
                && error.contains(&format!("{version:?}")),
            "{error}"
        );
    }
}

/// A key is checked with one object of the stream's own list: a restricted key is tried
/// on the permission the sync needs. 401 is `Unauthorized`, never retried, and the key
/// is in no error.
#[tokio::test]
async fn a_key_is_verified_with_one_object_of_the_streams_list() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/customers"))
        .and(query_param("limit", "1"))
        .and(header("authorization", format!("Bearer {KEY}").as_str()))
        .and(header("stripe-version", DEFAULT_API_VERSION))
        .respond_with(ResponseTemplate::new(200).set_body_json(
            json!({"object": "list", "data": [], "has_more": false, "url": "/v1/customers"}),
        ))
        .expect(1)
        .mount(&server)
        .await;
    let refused = "sk_test_refused0123456789";
    Mock::given(method("GET"))
        .and(header(
            "authorization",
            format!("Bearer {refused}").as_str(),
        ))
        .respond_with(ResponseTemplate::new(401).set_body_json(stripe_error(
            "invalid_request_error",
            None,
            &format!("Invalid API Key provided: {refused}"),
        )))
        .expect(1)
        .mount(&server)
        .await;
    let provider = provider(&server);
    provider
        .verify_credentials(&token_credentials(KEY), "customers")
        .await
        .expect("a good key");
    let error = provider
        .verify_credentials(&token_credentials(refused), "customers")
        .await
        .expect_err("a refused key");
    assert!(
        matches!(error, FetchError::Unauthorized { status: 401, .. }),
        "{error}"
    );
    assert!(!error.to_string().contains(refused), "{error}");
}
