//! The github adapter against a wiremock emulation of `GET /issues` as GitHub documents it;
//! the other streams in `streams`.

mod streams;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};
use wiremock::matchers::{header, method, path, query_param, query_param_is_missing};
use wiremock::{Mock, MockServer, ResponseTemplate};

use super::{GithubConfig, GithubProvider};
use crate::http::{HttpClient, HttpSettings};
use crate::test_support::{assert_stops_after, fast_client, fast_settings, ids, token_credentials};
use crate::{
    CredentialStore, FetchContext, FetchError, NoCredentialStore, PagePosition, Provider,
    ProviderConfig, Watermark,
};

const TOKEN: &str = "ghp_sekret0123456789";

fn provider_with(server: &MockServer, client: HttpClient) -> GithubProvider {
    let config = GithubConfig {
        base_url: server.uri().parse().unwrap(),
        ..GithubConfig::default()
    };
    config.validate().unwrap();
    GithubProvider::new(config, client)
}

fn provider(server: &MockServer) -> GithubProvider {
    provider_with(server, fast_client())
}

fn issue(id: u64, updated_at: &str) -> Value {
    json!({"id": id, "number": id % 100, "title": format!("issue {id}"), "updated_at": updated_at})
}

fn time(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text).unwrap().into()
}

fn context<'a>(
    credentials: &'a crate::Credentials,
    since: Option<&'a Watermark>,
) -> FetchContext<'a> {
    let store: &'a dyn CredentialStore = &NoCredentialStore;
    FetchContext {
        stream: "issues",
        parent: None,
        credentials,
        since,
        credential_store: store,
        base_url: None,
    }
}

/// A `GET /issues` mock with every documented parameter and header asserted.
fn issues() -> wiremock::MockBuilder {
    Mock::given(method("GET"))
        .and(path("/issues"))
        .and(query_param("filter", "all"))
        .and(query_param("state", "all"))
        .and(query_param("sort", "updated"))
        .and(query_param("direction", "desc"))
        .and(query_param("per_page", "100"))
        .and(header("authorization", format!("Bearer {TOKEN}").as_str()))
        .and(header("accept", "application/vnd.github+json"))
        .and(header("x-github-api-version", "2022-11-28"))
        .and(header(
            "user-agent",
            HttpSettings::default().user_agent.as_str(),
        ))
}

fn epoch_in(seconds: u64) -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    (now.as_secs() + seconds).to_string()
}

#[tokio::test]
async fn a_page_with_a_malformed_link_header_is_kept_and_the_listing_stops_after_it() {
    let server = MockServer::start().await;
    issues()
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header(
                    "link",
                    format!("<{}/issues?page=2; rel=\"next\"", server.uri()),
                )
                .set_body_json(json!([issue(21, "2024-02-01T00:00:00Z")])),
        )
        .expect(1)
        .mount(&server)
        .await;
    let credentials = token_credentials(TOKEN);
    let page = provider(&server)
        .fetch_page(&context(&credentials, None), None)
        .await
        .unwrap();
    assert_stops_after(&page, &["21"], "malformed Link header");
}

#[tokio::test]
async fn lists_issues_page_by_page_following_the_link_header() {
    let server = MockServer::start().await;
    let next = |page: u32| {
        format!(
            r#"<{}/issues?filter=all&state=all&sort=updated&direction=desc&per_page=100&page={page}>; rel="next", <{}/issues?page=3>; rel="last""#,
            server.uri(),
            server.uri()
        )
    };
    issues()
        .and(query_param_is_missing("page"))
        .and(query_param_is_missing("since"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("link", next(2))
                .set_body_json(json!([
                    issue(11, "2024-01-01T00:00:00Z"),
                    issue(12, "2024-01-02T00:00:00Z")
                ])),
        )
        .expect(1)
        .mount(&server)
        .await;
    issues()
        .and(query_param("page", "2"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("link", next(3))
                .set_body_json(json!([issue(13, "2024-01-03T00:00:00Z")])),
        )
        .expect(1)
        .mount(&server)
        .await;
    issues()
        .and(query_param("page", "3"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([
            issue(14, "2024-01-05T12:00:00Z"),
            issue(15, "2024-01-04T00:00:00Z")
        ])))
        .expect(1)
        .mount(&server)
        .await;
    let provider = provider(&server);
    let credentials = token_credentials(TOKEN);
    let context = context(&credentials, None);

    let first = provider.fetch_page(&context, None).await.unwrap();
    assert_eq!(ids(&first.items), ["11", "12"]);
    assert_eq!(
        first.watermark,
        Some(Watermark::Time(time("2024-01-02T00:00:00Z")))
    );
    let Some(PagePosition::Url { url }) = &first.next else {
        panic!("expected a next URL, got {:?}", first.next);
    };
    assert!(url.ends_with("&page=2"), "{url}");

    let second = provider
        .fetch_page(&context, first.next.as_ref())
        .await
        .unwrap();
    assert_eq!(ids(&second.items), ["13"]);
    let third = provider
        .fetch_page(&context, second.next.as_ref())
        .await
        .unwrap();
    assert_eq!(ids(&third.items), ["14", "15"]);
    assert_eq!(third.next, None);
    assert_eq!(
        third.watermark,
        Some(Watermark::Time(time("2024-01-05T12:00:00Z")))
    );
}

#[tokio::test]
async fn since_is_sent_from_the_watermark_and_an_empty_page_has_none() {
    let server = MockServer::start().await;
    issues()
        .and(query_param("since", "2024-01-02T03:04:05Z"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .expect(1)
        .mount(&server)
        .await;
    let credentials = token_credentials(TOKEN);
    let since = Watermark::Time(time("2024-01-02T03:04:05.678Z"));
    let page = provider(&server)
        .fetch_page(&context(&credentials, Some(&since)), None)
        .await
        .unwrap();
    assert!(page.items.is_empty());
    assert_eq!((page.next, page.watermark), (None, None));
}

#[tokio::test]
async fn an_exhausted_rate_limit_waits_until_the_reset() {
    let server = MockServer::start().await;
    issues()
        .respond_with(
            ResponseTemplate::new(403)
                .insert_header("x-ratelimit-remaining", "0")
                .insert_header("x-ratelimit-reset", epoch_in(2).as_str())
                .set_body_json(json!({"message": "API rate limit exceeded for user ID 1.",
                    "documentation_url": "https://docs.github.com/rest/rate-limit"})),
        )
        .up_to_n_times(1)
        .with_priority(1)
        .expect(1)
        .mount(&server)
        .await;
    issues()
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!([issue(1, "2024-01-01T00:00:00Z")])),
        )
        .expect(1)
        .mount(&server)
        .await;
    let started = Instant::now();
    let page = provider(&server)
        .fetch_page(
            &FetchContext::full(&token_credentials(TOKEN), "issues"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(ids(&page.items), ["1"]);
    // The reset is 1 to 2 seconds ahead (whole epoch seconds).
    assert!(
        started.elapsed() >= Duration::from_millis(950),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn retry_after_on_403_and_429_is_waited() {
    for status in [403u16, 429] {
        let server = MockServer::start().await;
        issues()
            .respond_with(
                ResponseTemplate::new(status)
                    .insert_header("retry-after", "1")
                    .set_body_json(json!({"message": "You have exceeded a secondary rate limit."})),
            )
            .up_to_n_times(1)
            .with_priority(1)
            .expect(1)
            .mount(&server)
            .await;
        issues()
            .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
            .expect(1)
            .mount(&server)
            .await;
        let started = Instant::now();
        provider(&server)
            .fetch_page(
                &FetchContext::full(&token_credentials(TOKEN), "issues"),
                None,
            )
            .await
            .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(950), "{status}");
    }
}

#[tokio::test]
async fn rate_limit_waits_beyond_max_rate_limit_wait_end_the_fetch_at_once() {
    let server = MockServer::start().await;
    issues()
        .and(query_param_is_missing("page"))
        .respond_with(
            ResponseTemplate::new(429)
                .insert_header("x-ratelimit-remaining", "0")
                .insert_header("x-ratelimit-reset", epoch_in(3600).as_str()),
        )
        .expect(1)
        .mount(&server)
        .await;
    // A secondary rate limit naming no wait: GitHub says to wait at least a minute.
    issues()
        .and(query_param("page", "2"))
        .respond_with(ResponseTemplate::new(403).set_body_json(json!({
            "message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.",
            "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"})))
        .expect(1)
        .mount(&server)
        .await;
    let settings = HttpSettings {
        max_rate_limit_wait: Duration::from_secs(30),
        ..fast_settings()
    };
    let provider = provider_with(&server, HttpClient::new(settings).unwrap());
    let credentials = token_credentials(TOKEN);
    let started = Instant::now();
    let error = provider
        .fetch_page(&FetchContext::full(&credentials, "issues"), None)
        .await
        .unwrap_err();
    assert!(
        matches!(error, FetchError::RateLimited { retry_after, .. }
            if retry_after > Duration::from_secs(3500)),
        "{error:?}"
    );
    let second = PagePosition::Url {
        url: format!(
            "{}/issues?filter=all&state=all&sort=updated&direction=desc&per_page=100&page=2",
            server.uri()
        ),
    };
    let error = provider
        .fetch_page(&FetchContext::full(&credentials, "issues"), Some(&second))
        .await
        .unwrap_err();
    assert!(
        matches!(error, FetchError::RateLimited { retry_after, .. }
            if retry_after == Duration::from_secs(60)),
        "{error:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn unauthorized_and_forbidden_are_credential_faults_with_githubs_message() {
    let cases = [
        (401u16, "Bad credentials"),
        (403, "Resource not accessible by personal access token"),
    ];
    for (status, message) in cases {
        let server = MockServer::start().await;
        issues()
            .respond_with(ResponseTemplate::new(status).set_body_json(json!({
                "message": message,
                "documentation_url": "https://docs.github.com/rest",
                "status": status.to_string(),
            })))
            .expect(1)
            .mount(&server)
            .await;
        let error = provider(&server)
            .fetch_page(
                &FetchContext::full(&token_credentials(TOKEN), "issues"),
                None,
            )
            .await
            .unwrap_err();
        assert!(
            matches!(&error, FetchError::Unauthorized { status: got, .. } if *got == status),
            "{error:?}"
        );
        assert_eq!(
            error.to_string(),
            format!(
                "credentials were rejected (HTTP {status}): {message} (see https://docs.github.com/rest)"
            )
        );
    }
}

#[tokio::test]
async fn other_errors_surface_githubs_message_and_5xx_is_retried() {
    let server = MockServer::start().await;
    issues()
        .respond_with(ResponseTemplate::new(502).set_body_json(json!({"message": "Server Error"})))
        .expect(3)
        .mount(&server)
        .await;
    let error = provider(&server)
        .fetch_page(
            &FetchContext::full(&token_credentials(TOKEN), "issues"),
            None,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&error, FetchError::Status { status: 502, attempts: 3, message, .. }
            if message == "Server Error"),
        "{error:?}"
    );
}

#[tokio::test]
async fn foreign_next_links_mismatched_positions_and_missing_tokens_send_nothing() {
    let server = MockServer::start().await;
    let provider = provider(&server);
    let credentials = token_credentials(TOKEN);
    let elsewhere = PagePosition::Url {
        url: "https://evil.example.com/issues?page=2".into(),
    };
    let error = provider
        .fetch_page(
            &FetchContext::full(&credentials, "issues"),
            Some(&elsewhere),
        )
        .await
        .unwrap_err();
    assert!(matches!(error, FetchError::InvalidUrl { .. }), "{error:?}");
    let cursor = PagePosition::Cursor { cursor: "c".into() };
    let error = provider
        .fetch_page(&FetchContext::full(&credentials, "issues"), Some(&cursor))
        .await
        .unwrap_err();
    assert!(
        matches!(error, FetchError::PositionMismatch { .. }),
        "{error:?}"
    );
    let error = provider
        .fetch_page(
            &FetchContext::full(&token_credentials(" \n"), "issues"),
            None,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(error, FetchError::MissingCredentials { .. }),
        "{error:?}"
    );
    assert!(server.received_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn the_token_never_appears_in_errors_or_debug_output() {
    let server = MockServer::start().await;
    issues()
        .respond_with(ResponseTemplate::new(422).set_body_json(json!({
            "message": format!("Validation Failed for token {TOKEN}")
        })))
        .mount(&server)
        .await;
    let provider = provider(&server);
    let credentials = token_credentials(TOKEN);
    let error = provider
        .fetch_page(&FetchContext::full(&credentials, "issues"), None)
        .await
        .unwrap_err();
    let shown = format!("{error} {error:?} {provider:?} {credentials:?}");
    assert!(!shown.contains(TOKEN), "{shown}");
    assert!(
        shown.contains("Validation Failed for token [redacted]"),
        "{shown}"
    );
}

#[test]
fn config_defaults_ranges_and_unknown_keys() {
    let table: toml::Table = toml::from_str("kind = \"github\"").unwrap();
    let config = ProviderConfig::deserialize(table).unwrap();
    config.validate().unwrap();
    assert_eq!(config.kind(), "github");
    assert!(config.needs_token());
    assert!(config.required_env_vars().is_empty());
    let ProviderConfig::Github(github) = config else {
        panic!("expected a github config, got {config:?}");
    };
    assert_eq!(github, GithubConfig::default());
    assert_eq!(github.base_url.as_str(), "https://api.github.com/");
    assert_eq!(github.per_page, 100);

    let parse = |text: &str| {
        let table: toml::Table = toml::from_str(text).unwrap();
        ProviderConfig::deserialize_kind("github", table)
    };
    for (text, expected) in [
        ("per_page = 0", "per_page must be between 1 and 100"),
        ("per_page = 101", "per_page must be between 1 and 100"),
        (
            "base_url = \"ftp://example.com\"",
            "base_url must be an http or https URL",
        ),
    ] {
        let error = parse(text).unwrap().validate().unwrap_err();
        assert!(error.contains(expected), "{text}: {error}");
    }
    let error = parse("per_pag = 10").unwrap_err().to_string();
    assert!(error.contains("unknown field `per_pag`"), "{error}");
}

/// A 403 with these rate-limit headers, as the policy sees it.
fn rate_limit_answer(headers: &reqwest::header::HeaderMap) -> crate::http::Answer<'_> {
    crate::http::Answer {
        url: "https://api.github.com/issues",
        status: reqwest::StatusCode::FORBIDDEN,
        headers,
        body: b"{\"message\": \"API rate limit exceeded\"}",
        attempt: 1,
    }
}

#[test]
fn a_reset_past_any_clock_waits_a_day_and_one_in_the_past_a_second() {
    use crate::test_support::header_map;
    let wait = |reset: &str| {
        let headers = header_map(&[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", reset)]);
        super::rate_limit_wait(&rate_limit_answer(&headers), SystemTime::now())
    };
    assert_eq!(
        wait("18446744073709551615"),
        Some(crate::http::MAX_ASKED_WAIT)
    );
    assert_eq!(wait("0"), Some(Duration::from_secs(1)));
    assert_eq!(wait("-1"), None, "unreadable: not a primary rate limit");
}

proptest::proptest! {
    #![proptest_config(crate::test_support::proptest_config(1024, 0x6768_7274))]

    #[test]
    fn rate_limit_headers_of_any_value_give_a_wait_of_at_most_a_day(
        remaining in proptest::prop_oneof![proptest::strategy::Just("0".to_string()), crate::test_support::header_text()],
        reset in crate::test_support::header_text(),
        retry in crate::test_support::header_text(),
        now in 0u64..253_402_300_800,
    ) {
        let headers = crate::test_support::header_map(&[
            ("x-ratelimit-remaining", &remaining),
            ("x-ratelimit-reset", &reset),
            ("retry-after", &retry),
        ]);
        let now = UNIX_EPOCH + Duration::from_secs(now);
        let wait = super::rate_limit_wait(&rate_limit_answer(&headers), now);
        proptest::prop_assert!(
            wait.is_none_or(|wait| wait <= crate::http::MAX_ASKED_WAIT),
            "{headers:?}: {wait:?}"
        );
    }
}
