//! The repos, pull_requests and issue_comments streams against wiremock emulations of
//! `GET /user/repos`, `GET /repos/{owner}/{repo}/pulls` and
//! `GET /repos/{owner}/{repo}/issues/comments` as GitHub documents them.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use wiremock::matchers::{header, method, path, query_param, query_param_is_missing};
use wiremock::{Mock, MockServer, ResponseTemplate};

use super::{epoch_in, provider, provider_with, time, TOKEN};
use crate::http::{HttpClient, HttpSettings};
use crate::test_support::{fast_settings, ids, token_credentials};
use crate::{
    Credentials, FetchContext, FetchError, NoCredentialStore, Page, PagePosition, ParentRecord,
    Provider, ProviderConfig, Watermark,
};

fn context<'a>(
    stream: &'a str,
    parent: Option<ParentRecord<'a>>,
    since: Option<&'a Watermark>,
    credentials: &'a Credentials,
) -> FetchContext<'a> {
    FetchContext {
        stream,
        parent,
        credentials,
        since,
        credential_store: &NoCredentialStore,
        base_url: None,
    }
}

/// A repository as `GET /user/repos` lists it.
fn repository(id: u64, full_name: &str, updated_at: &str) -> Value {
    let (owner, name) = full_name.split_once('/').unwrap();
    json!({"id": id, "name": name, "full_name": full_name, "owner": {"login": owner, "id": 1},
        "private": false, "updated_at": updated_at})
}

fn pull_request(id: u64, updated_at: &str) -> Value {
    json!({"id": id, "number": id % 100, "state": "open", "title": format!("pull {id}"),
        "updated_at": updated_at})
}

fn comment(id: u64, updated_at: &str) -> Value {
    json!({"id": id, "body": format!("comment {id}"), "created_at": updated_at,
        "updated_at": updated_at})
}

/// A `GET` of `path` with the headers GitHub documents for every request.
fn get(path_text: &str) -> wiremock::MockBuilder {
    Mock::given(method("GET"))
        .and(path(path_text))
        .and(header("authorization", format!("Bearer {TOKEN}").as_str()))
        .and(header("accept", "application/vnd.github+json"))
        .and(header("x-github-api-version", "2022-11-28"))
        .and(header(
            "user-agent",
            HttpSettings::default().user_agent.as_str(),
        ))
}

/// The Link header of page 1 of 2 (`rel="next"` and `rel="last"`) or of the last page
/// (`rel="prev"` and `rel="first"`), as GitHub sends them.
fn link(server: &MockServer, path_and_query: &str, page: u32) -> String {
    let at = |page: u32| format!("<{}{path_and_query}&page={page}>", server.uri());
    match page {
        1 => format!(r#"{}; rel="next", {}; rel="last""#, at(2), at(2)),
        _ => format!(r#"{}; rel="prev", {}; rel="first""#, at(1), at(1)),
    }
}

/// Fetches the first page and each next one until the last.
async fn walk(provider: &super::GithubProvider, context: &FetchContext<'_>) -> Vec<Page> {
    let mut pages: Vec<Page> = Vec::new();
    loop {
        let position = pages.last().and_then(|page| page.next.as_ref());
        if !pages.is_empty() && position.is_none() {
            return pages;
        }
        let page = provider.fetch_page(context, position).await.unwrap();
        pages.push(page);
    }
}

const WIDGETS: &str = r#"{"id": 501, "name": "widgets", "full_name": "octo-org/widgets",
    "owner": {"login": "octo-org"}}"#;

fn widgets() -> ParentRecord<'static> {
    ParentRecord {
        external_id: "501",
        payload: WIDGETS,
    }
}

#[test]
fn streams_are_issues_first_then_repos_and_its_children() {
    let table: toml::Table = toml::from_str("kind = \"github\"").unwrap();
    let config = ProviderConfig::deserialize(table).unwrap();
    let streams: Vec<(String, Option<String>)> = config
        .streams()
        .into_iter()
        .map(|stream| (stream.name, stream.parent))
        .collect();
    let repos = Some("repos".to_string());
    assert_eq!(
        streams,
        [
            ("issues".to_string(), None),
            ("repos".to_string(), None),
            ("pull_requests".to_string(), repos.clone()),
            ("issue_comments".to_string(), repos),
        ]
    );
}

#[tokio::test]
async fn lists_repositories_page_by_page_newest_change_first() {
    let server = MockServer::start().await;
    let query = "/user/repos?affiliation=owner%2Ccollaborator%2Corganization_member&sort=updated&direction=desc&per_page=100";
    let repos = || {
        get("/user/repos")
            .and(query_param(
                "affiliation",
                "owner,collaborator,organization_member",
            ))
            .and(query_param("sort", "updated"))
            .and(query_param("direction", "desc"))
            .and(query_param("per_page", "100"))
            .and(query_param_is_missing("since"))
    };
    repos()
        .and(query_param_is_missing("page"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("link", link(&server, query, 1))
                .set_body_json(json!([
                    repository(31, "octocat/hello", "2024-03-02T00:00:00Z"),
                    repository(32, "octo-org/widgets", "2024-03-01T00:00:00Z"),
                ])),
        )
        .expect(1)
        .mount(&server)
        .await;
    repos()
        .and(query_param("page", "2"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("link", link(&server, query, 2))
                .set_body_json(json!([repository(
                    33,
                    "octocat/old",
                    "2023-01-01T00:00:00Z"
                )])),
        )
        .expect(1)
        .mount(&server)
        .await;
    let credentials = token_credentials(TOKEN);
    let pages = walk(
        &provider(&server),
        &context("repos", None, None, &credentials),
    )
    .await;
    let listed: Vec<Vec<String>> = pages.iter().map(|page| ids(&page.items)).collect();
    assert_eq!(listed, [vec!["31", "32"], vec!["33"]]);
    let watermarks: Vec<Option<Watermark>> =
        pages.iter().map(|page| page.watermark.clone()).collect();
    assert_eq!(
        watermarks,
        [
            Some(Watermark::Time(time("2024-03-02T00:00:00Z"))),
            Some(Watermark::Time(time("2023-01-01T00:00:00Z")))
        ]
    );
}

#[tokio::test]
async fn repositories_are_asked_for_since_a_second_before_the_cursor() {
    let server = MockServer::start().await;
    get("/user/repos")
        .and(query_param("since", "2024-03-01T11:59:59Z"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .expect(1)
        .mount(&server)
        .await;
    let credentials = token_credentials(TOKEN);
    let since = Watermark::Time(time("2024-03-01T12:00:00.250Z"));
    let page = provider(&server)
        .fetch_page(&context("repos", None, Some(&since), &credentials), None)
        .await
        .unwrap();
    assert!(page.items.is_empty());
    assert_eq!((page.next, page.watermark), (None, None));
}

#[tokio::test]
async fn lists_a_repositorys_pull_requests_page_by_page() {
    let server = MockServer::start().await;
    let query = "/repos/octo-org/widgets/pulls?state=all&sort=updated&direction=desc&per_page=100";
    let pulls = || {
        get("/repos/octo-org/widgets/pulls")
            .and(query_param("state", "all"))
            .and(query_param("sort", "updated"))
            .and(query_param("direction", "desc"))
            .and(query_param("per_page", "100"))
    };
    pulls()
        .and(query_param_is_missing("page"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("link", link(&server, query, 1))
                .set_body_json(json!([
                    pull_request(41, "2024-03-05T00:00:00Z"),
                    pull_request(42, "2024-03-04T00:00:00Z"),
                ])),
        )
        .expect(1)
        .mount(&server)
        .await;
    pulls()
        .and(query_param("page", "2"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("link", link(&server, query, 2))
                .set_body_json(json!([pull_request(43, "2020-01-01T00:00:00Z")])),
        )
        .expect(1)
        .mount(&server)
        .await;
    let credentials = token_credentials(TOKEN);
    let pages = walk(
        &provider(&server),
        &context("pull_requests", Some(widgets()), None, &credentials),
    )
    .await;
    let listed: Vec<Vec<String>> = pages.iter().map(|page| ids(&page.items)).collect();
    assert_eq!(listed, [vec!["41", "42"], vec!["43"]]);
    assert_eq!(
        pages[0].watermark,
        Some(Watermark::Time(time("2024-03-05T00:00:00Z")))
    );
    assert!(pages.iter().all(|page| page.parent_gone.is_none()));
}

#[tokio::test]
async fn pull_requests_stop_at_the_first_one_older_than_the_cursor() {
    let server = MockServer::start().await;
    let query = "/repos/octo-org/widgets/pulls?state=all&sort=updated&direction=desc&per_page=100";
    get("/repos/octo-org/widgets/pulls")
        .and(query_param("sort", "updated"))
        .and(query_param("direction", "desc"))
        .and(query_param_is_missing("page"))
        .and(query_param_is_missing("since"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("link", link(&server, query, 1))
                .set_body_json(json!([
                    pull_request(51, "2024-03-05T00:00:00Z"),
                    // In the cursor's own second: changed at or after it, kept.
                    pull_request(52, "2024-03-04T08:30:00Z"),
                    pull_request(53, "2024-03-04T08:29:59Z"),
                    pull_request(54, "2024-03-06T00:00:00Z"),
                ])),
        )
        .expect(1)
        .mount(&server)
        .await;
    get("/repos/octo-org/widgets/pulls")
        .and(query_param("page", "2"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([])))
        .expect(0)
        .mount(&server)
        .await;
    let credentials = token_credentials(TOKEN);
    let since = Watermark::Time(time("2024-03-04T08:30:00.600Z"));
    let context = context("pull_requests", Some(widgets()), Some(&since), &credentials);
    let page = provider(&server).fetch_page(&context, None).await.unwrap();
    assert_eq!(ids(&page.items), ["51", "52"]);
    assert_eq!(page.next, None);
    assert_eq!(page.stop_after, None);
    assert_eq!(
        page.watermark,
        Some(Watermark::Time(time("2024-03-05T00:00:00Z")))
    );
}

#[tokio::test]
async fn lists_a_repositorys_issue_comments_since_the_cursor_page_by_page() {
    let server = MockServer::start().await;
    let query = "/repos/octocat/hello/issues/comments?sort=updated&direction=desc&since=2024-03-01T11%3A59%3A59Z&per_page=100";
    let comments = || {
        get("/repos/octocat/hello/issues/comments")
            .and(query_param("sort", "updated"))
            .and(query_param("direction", "desc"))
            .and(query_param("since", "2024-03-01T11:59:59Z"))
            .and(query_param("per_page", "100"))
    };
    comments()
        .and(query_param_is_missing("page"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("link", link(&server, query, 1))
                .set_body_json(json!([
                    comment(63, "2024-03-03T00:00:00Z"),
                    comment(62, "2024-03-02T00:00:00Z"),
                ])),
        )
        .expect(1)
        .mount(&server)
        .await;
    comments()
        .and(query_param("page", "2"))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("link", link(&server, query, 2))
                .set_body_json(json!([comment(61, "2024-03-01T12:00:00Z")])),
        )
        .expect(1)
        .mount(&server)
        .await;
    // A parent without full_name: its owner.login and name name it.
    let parent = ParentRecord {
        external_id: "77",
        payload: r#"{"id": 77, "name": "hello", "owner": {"login": "octocat"}}"#,
    };
    let credentials = token_credentials(TOKEN);
    let since = Watermark::Time(time("2024-03-01T12:00:00Z"));
    let pages = walk(
        &provider(&server),
        &context("issue_comments", Some(parent), Some(&since), &credentials),
    )
    .await;
    let listed: Vec<Vec<String>> = pages.iter().map(|page| ids(&page.items)).collect();
    assert_eq!(listed, [vec!["63", "62"], vec!["61"]]);
    assert_eq!(
        pages[0].watermark,
        Some(Watermark::Time(time("2024-03-03T00:00:00Z")))
    );
}

#[tokio::test]
async fn a_repository_the_token_no_longer_sees_is_a_parent_gone_not_an_error() {
    let cases = [
        (
            "pull_requests",
            "/repos/octo-org/widgets/pulls",
            404u16,
            "Not Found",
        ),
        (
            "issue_comments",
            "/repos/octo-org/widgets/issues/comments",
            403,
            "Resource protected by organization SAML enforcement.",
        ),
    ];
    for (stream, endpoint, status, message) in cases {
        let server = MockServer::start().await;
        get(endpoint)
            .respond_with(ResponseTemplate::new(status).set_body_json(json!({
                "message": message,
                "documentation_url": "https://docs.github.com/rest",
                "status": status.to_string(),
            })))
            .expect(1)
            .mount(&server)
            .await;
        let credentials = token_credentials(TOKEN);
        let page = provider(&server)
            .fetch_page(&context(stream, Some(widgets()), None, &credentials), None)
            .await
            .unwrap();
        assert!(page.items.is_empty(), "{stream}");
        assert_eq!((page.next, page.watermark), (None, None), "{stream}");
        assert_eq!(
            page.parent_gone.as_deref(),
            Some(
                format!(
                    "GitHub answered HTTP {status} for the repository \"octo-org/widgets\", \
                     which the token can no longer see: {message} (see https://docs.github.com/rest)"
                )
                .as_str()
            ),
            "{stream}"
        );
    }
}

#[tokio::test]
async fn a_403_with_githubs_rate_limit_signals_is_still_a_rate_limit() {
    let exhausted = ResponseTemplate::new(403)
        .insert_header("x-ratelimit-remaining", "0")
        .insert_header("x-ratelimit-reset", epoch_in(3600).as_str())
        .set_body_json(json!({"message": "API rate limit exceeded for user ID 1."}));
    let secondary = ResponseTemplate::new(403).set_body_json(json!({
        "message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again."}));
    for (answer, least) in [(exhausted, 3500), (secondary, 60)] {
        let server = MockServer::start().await;
        get("/repos/octo-org/widgets/pulls")
            .respond_with(answer)
            .expect(1)
            .mount(&server)
            .await;
        let settings = HttpSettings {
            max_rate_limit_wait: Duration::from_secs(30),
            ..fast_settings()
        };
        let provider = provider_with(&server, HttpClient::new(settings).unwrap());
        let credentials = token_credentials(TOKEN);
        let error = provider
            .fetch_page(
                &context("pull_requests", Some(widgets()), None, &credentials),
                None,
            )
            .await
            .unwrap_err();
        assert!(
            matches!(error, FetchError::RateLimited { retry_after, .. }
                if retry_after >= Duration::from_secs(least)),
            "{error:?}"
        );
    }
}

#[tokio::test]
async fn a_parent_that_names_no_repository_is_skipped_naming_it() {
    let server = MockServer::start().await;
    let provider = provider(&server);
    let credentials = token_credentials(TOKEN);
    for payload in [
        r#"{"id": 9}"#,
        r#"{"id": 9, "full_name": "no-slash"}"#,
        r#"{"id": 9, "full_name": "/widgets", "name": "widgets"}"#,
        r#"{"id": 9, "full_name": "octo-org/a/b"}"#,
        r#"{"id": 9, "owner": {"login": "octo-org"}, "name": ".."}"#,
        r#"{"id": 9, "owner": "octo-org", "name": "widgets"}"#,
        "not json",
    ] {
        let parent = ParentRecord {
            external_id: "9",
            payload,
        };
        let page = provider
            .fetch_page(
                &context("pull_requests", Some(parent), None, &credentials),
                None,
            )
            .await
            .unwrap();
        assert!(page.items.is_empty() && page.next.is_none(), "{payload}");
        let message = page.parent_gone.expect("the parent is skipped");
        assert!(
            message.starts_with(
                "the github stream pull_requests cannot list the repository \"9\": its stored record "
            ),
            "{payload}: {message}"
        );
    }
    assert!(server.received_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_repository_name_is_percent_encoded_in_the_path() {
    let server = MockServer::start().await;
    get("/api/v3/repos/octo-org/50%25%20off%3F%20%231%20%C3%BC/pulls")
        .and(query_param("state", "all"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!([pull_request(71, "2024-03-01T00:00:00Z")])),
        )
        .expect(1)
        .mount(&server)
        .await;
    // GitHub Enterprise Server's base URL has a path of its own.
    let config = super::GithubConfig {
        base_url: format!("{}/api/v3/", server.uri()).parse().unwrap(),
        ..super::GithubConfig::default()
    };
    let provider = super::GithubProvider::new(config, crate::test_support::fast_client());
    let parent = ParentRecord {
        external_id: "70",
        payload: r#"{"id": 70, "full_name": "octo-org/50% off? #1 ü"}"#,
    };
    let credentials = token_credentials(TOKEN);
    let page = provider
        .fetch_page(
            &context("pull_requests", Some(parent), None, &credentials),
            None,
        )
        .await
        .unwrap();
    assert_eq!(ids(&page.items), ["71"]);
}

#[tokio::test]
async fn a_child_stream_without_a_parent_and_an_unknown_stream_are_refused() {
    let server = MockServer::start().await;
    let provider = provider(&server);
    let credentials = token_credentials(TOKEN);
    for (stream, expected) in [
        (
            "issue_comments",
            "the github stream issue_comments is listed per repository, but no parent repository was given",
        ),
        ("commits", "github has no stream \"commits\""),
    ] {
        let error = provider
            .fetch_page(&context(stream, None, None, &credentials), None)
            .await
            .unwrap_err();
        assert!(
            matches!(&error, FetchError::Client { message } if message == expected),
            "{error:?}"
        );
    }
    assert!(server.received_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn the_next_url_of_a_child_stream_is_followed_only_on_the_base_urls_origin() {
    let server = MockServer::start().await;
    let credentials = token_credentials(TOKEN);
    let elsewhere = PagePosition::Url {
        url: "https://evil.example.com/repos/octo-org/widgets/pulls?page=2".into(),
    };
    let error = provider(&server)
        .fetch_page(
            &context("pull_requests", Some(widgets()), None, &credentials),
            Some(&elsewhere),
        )
        .await
        .unwrap_err();
    assert!(matches!(error, FetchError::InvalidUrl { .. }), "{error:?}");
    assert!(server.received_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn the_token_never_appears_in_a_parent_gone_reason() {
    let server = MockServer::start().await;
    get("/repos/octo-org/widgets/pulls")
        .respond_with(
            ResponseTemplate::new(404)
                .set_body_json(json!({"message": format!("Not Found for token {TOKEN}")})),
        )
        .expect(1)
        .mount(&server)
        .await;
    let credentials = token_credentials(TOKEN);
    let page = provider(&server)
        .fetch_page(
            &context("pull_requests", Some(widgets()), None, &credentials),
            None,
        )
        .await
        .unwrap();
    let reason = page.parent_gone.unwrap_or_default();
    assert!(
        reason.ends_with("Not Found for token [redacted]"),
        "{reason}"
    );
}
