//! `rate_limit = { ... }`: a 429 without `Retry-After` waits for the reset the API's own
//! header gives, a spent window holds back the next request with the same token (and
//! only that token's), and a reset too far away ends the fetch as rate limited.

use std::time::{Duration, Instant};

use serde_json::json;
use wiremock::matchers::{header, method, path, query_param, query_param_is_missing};
use wiremock::{Mock, MockServer, ResponseTemplate};

use super::{credentials, invalid_rest, provider, walk};
use crate::{Credentials, FetchContext, FetchError, Provider};

fn seconds_limited(server: &MockServer) -> crate::rest::RestProvider {
    provider(
        server,
        json!({"rate_limit": {"remaining_header": "x-ratelimit-remaining",
                              "reset_header": "x-ratelimit-reset", "reset": "seconds"}}),
    )
}

fn data(ids: &[&str]) -> serde_json::Value {
    json!({"data": ids.iter().map(|id| json!({"id": id})).collect::<Vec<_>>()})
}

#[tokio::test]
async fn a_429_without_retry_after_waits_until_the_reset_header() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .respond_with(
            ResponseTemplate::new(429)
                .insert_header("x-ratelimit-remaining", "0")
                .insert_header("x-ratelimit-reset", "1"),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .respond_with(ResponseTemplate::new(200).set_body_json(data(&["a"])))
        .mount(&server)
        .await;
    let started = Instant::now();
    let (ids, _) = walk(&seconds_limited(&server), &credentials())
        .await
        .unwrap();
    assert_eq!(ids, ["a"]);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(950),
        "retried after {waited:?}, before the reset of 1s (the backoff is 1ms)"
    );
}

#[tokio::test]
async fn a_spent_window_holds_back_the_next_request_of_that_token_only() {
    let server = MockServer::start().await;
    let reset = (chrono::Utc::now().timestamp() + 2).to_string();
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(query_param_is_missing("cursor"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"data": [{"id": "a"}], "next": "p2"}))
                .insert_header("RateLimit-Remaining", "0")
                .insert_header("RateLimit-Reset", reset.as_str()),
        )
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(query_param("cursor", "p2"))
        .respond_with(ResponseTemplate::new(200).set_body_json(data(&["b"])))
        .mount(&server)
        .await;
    let provider = provider(
        &server,
        json!({"pagination": {"type": "cursor", "cursor_path": "next", "cursor_param": "cursor"},
               "rate_limit": {"remaining_header": "RateLimit-Remaining",
                              "reset_header": "RateLimit-Reset", "reset": "epoch"}}),
    );
    let own = credentials();
    let context = FetchContext::full(&own, "records");
    let first = provider.fetch_page(&context, None).await.unwrap();
    let spent_at = Instant::now();

    // Another token's window is its own.
    let other = Credentials {
        token: Some("another-token".to_string().into()),
        ..Credentials::default()
    };
    provider
        .fetch_page(&FetchContext::full(&other, "records"), None)
        .await
        .unwrap();
    assert!(
        spent_at.elapsed() < Duration::from_millis(500),
        "another token waited {:?}",
        spent_at.elapsed()
    );

    let second = provider
        .fetch_page(&context, first.next.as_ref())
        .await
        .unwrap();
    assert_eq!(super::ids(&second.items), ["b"]);
    let waited = spent_at.elapsed();
    assert!(
        waited >= Duration::from_millis(900),
        "the next request came {waited:?} after the window was spent"
    );
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 3);
}

#[tokio::test]
async fn a_reset_beyond_max_rate_limit_wait_ends_the_fetch_as_rate_limited() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(header("authorization", "Bearer sekret-token-123"))
        .respond_with(ResponseTemplate::new(429).insert_header("x-ratelimit-reset", "86400"))
        .expect(1)
        .mount(&server)
        .await;
    let error = walk(&seconds_limited(&server), &credentials())
        .await
        .unwrap_err();
    assert!(
        matches!(error, FetchError::RateLimited { retry_after, .. } if retry_after == Duration::from_secs(86400)),
        "{error:?}"
    );
}

#[test]
fn rate_limit_settings_are_validated_naming_the_key() {
    let cases = [
        (
            json!({"rate_limit": {"reset_header": "X Reset", "reset": "seconds"}}),
            "rate_limit.reset_header \"X Reset\" is not a valid HTTP header name",
        ),
        (
            json!({"rate_limit": {"reset_header": "x-reset", "reset": "seconds",
                                  "remaining_header": ""}}),
            "rate_limit.remaining_header \"\" is not a valid HTTP header name",
        ),
    ];
    for (extra, expected) in cases {
        let message = invalid_rest(extra.clone());
        assert!(message.contains(expected), "{extra}: {message}");
    }
    for (extra, expected) in [
        (
            json!({"rate_limit": {"reset_header": "x-reset", "reset": "minutes"}}),
            "unknown variant `minutes`",
        ),
        (
            json!({"rate_limit": {"reset": "epoch"}}),
            "missing field `reset_header`",
        ),
        (
            json!({"rate_limit": {"reset_header": "x-reset", "reset": "epoch", "limit": "x"}}),
            "unknown field `limit`",
        ),
    ] {
        let mut value = json!({"kind": "rest", "base_url": "https://api.example.com"});
        if let (Some(base), serde_json::Value::Object(extra)) = (value.as_object_mut(), extra) {
            base.extend(extra);
        }
        let error = super::provider_config(value).unwrap_err().to_string();
        assert!(error.contains(expected), "{error}");
    }
}
