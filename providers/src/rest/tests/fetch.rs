//! Fetching pages from wiremock APIs: every pagination type, auth, shapes, secrets.

use serde_json::json;
use wiremock::matchers::{header, method, path, query_param, query_param_is_missing};
use wiremock::{Mock, MockServer, ResponseTemplate};

use super::{credentials, ids, provider, walk, TOKEN};
use crate::test_support::assert_stops_after;
use crate::{Credentials, FetchContext, FetchError, PageItem, PagePosition, Provider, RecordStage};

fn records(ids: &[u64]) -> serde_json::Value {
    ids.iter().map(|id| json!({"id": id})).collect()
}

async fn answer(server: &MockServer, param: (&str, &str), body: serde_json::Value) {
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(query_param(param.0, param.1))
        .respond_with(ResponseTemplate::new(200).set_body_json(body))
        .expect(1)
        .mount(server)
        .await;
}

#[tokio::test]
async fn cursor_pagination_walks_three_pages() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(query_param_is_missing("cursor"))
        .and(query_param("limit", "2"))
        .and(query_param("team", "core"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"data": records(&[1, 2]), "meta": {"next": "c2"}})),
        )
        .expect(1)
        .mount(&server)
        .await;
    answer(
        &server,
        ("cursor", "c2"),
        json!({"data": records(&[3, 4]), "meta": {"next": 77}}),
    )
    .await;
    answer(
        &server,
        ("cursor", "77"),
        json!({"data": records(&[5]), "meta": {"next": null}}),
    )
    .await;
    let provider = provider(
        &server,
        json!({
            "query": {"team": "core"},
            "pagination": {"type": "cursor", "cursor_path": "meta.next", "cursor_param": "cursor",
                           "page_size_param": "limit", "page_size": 2},
        }),
    );
    let (ids, positions) = walk(&provider, &credentials()).await.unwrap();
    assert_eq!(ids, ["1", "2", "3", "4", "5"]);
    assert_eq!(
        positions[1],
        Some(PagePosition::Cursor {
            cursor: "c2".into()
        })
    );
    assert_eq!(
        positions[2],
        Some(PagePosition::Cursor {
            cursor: "77".into()
        })
    );
}

#[tokio::test]
async fn offset_pagination_walks_three_pages_and_stops_on_a_short_page() {
    let server = MockServer::start().await;
    answer(&server, ("offset", "0"), json!({"data": records(&[1, 2])})).await;
    answer(&server, ("offset", "2"), json!({"data": records(&[3, 4])})).await;
    answer(&server, ("offset", "4"), json!({"data": records(&[5])})).await;
    let provider = provider(
        &server,
        json!({"pagination": {"type": "offset", "page_size_param": "limit", "page_size": 2}}),
    );
    let (ids, positions) = walk(&provider, &credentials()).await.unwrap();
    assert_eq!(ids, ["1", "2", "3", "4", "5"]);
    assert_eq!(positions[2], Some(PagePosition::Offset { offset: 4 }));
}

#[tokio::test]
async fn page_pagination_walks_three_pages_and_stops_on_an_empty_page() {
    let server = MockServer::start().await;
    answer(&server, ("p", "0"), json!({"data": records(&[1, 2])})).await;
    answer(&server, ("p", "1"), json!({"data": records(&[3])})).await;
    answer(&server, ("p", "2"), json!({"data": []})).await;
    let provider = provider(
        &server,
        json!({"pagination": {"type": "page", "page_param": "p", "first_page": 0}}),
    );
    let (ids, positions) = walk(&provider, &credentials()).await.unwrap();
    assert_eq!(ids, ["1", "2", "3"]);
    assert_eq!(positions[2], Some(PagePosition::Page { page: 2 }));
}

#[tokio::test]
async fn link_pagination_follows_relative_and_absolute_next_links_as_they_are() {
    let server = MockServer::start().await;
    let page = |ids: &[u64], link: String| {
        ResponseTemplate::new(200)
            .set_body_json(json!({"data": records(ids)}))
            .insert_header("Link", link)
    };
    Mock::given(query_param_is_missing("page"))
        .respond_with(page(
            &[1, 2],
            r#"</v1/items?page=2&team=core>; rel="next""#.into(),
        ))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(query_param("page", "2"))
        .respond_with(page(
            &[3],
            format!(
                r#"<{}/v1/items?page=3&team=core>; rel="next last", </v1/items>; rel=first"#,
                server.uri()
            ),
        ))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(query_param("page", "3"))
        .respond_with(page(&[4], r#"</v1/items?page=2>; rel="prev""#.into()))
        .expect(1)
        .mount(&server)
        .await;
    let provider = provider(
        &server,
        json!({"query": {"team": "core"}, "pagination": {"type": "link"}}),
    );
    let (ids, positions) = walk(&provider, &credentials()).await.unwrap();
    assert_eq!(ids, ["1", "2", "3", "4"]);
    let second = format!("{}/v1/items?page=2&team=core", server.uri());
    assert_eq!(positions[1], Some(PagePosition::Url { url: second }));
    let queries: Vec<_> = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|request| request.url.query().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        queries,
        ["team=core", "page=2&team=core", "page=3&team=core"]
    );
}

#[tokio::test]
async fn no_pagination_is_one_page_of_the_body_itself() {
    let server = MockServer::start().await;
    Mock::given(path("/v1/items"))
        .respond_with(ResponseTemplate::new(200).set_body_json(records(&[1, 2])))
        .expect(1)
        .mount(&server)
        .await;
    let provider = provider(&server, json!({"records_path": ""}));
    let (ids, positions) = walk(&provider, &credentials()).await.unwrap();
    assert_eq!(ids, ["1", "2"]);
    assert_eq!(positions, [None]);
}

#[tokio::test]
async fn a_malformed_link_header_keeps_the_page_and_stops_the_listing_after_it() {
    let server = MockServer::start().await;
    Mock::given(path("/v1/items"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"data": [{"id": "i1"}]}))
                .insert_header("Link", "https://no-brackets; rel=next"),
        )
        .expect(1)
        .mount(&server)
        .await;
    let provider = provider(&server, json!({"pagination": {"type": "link"}}));
    let page = provider
        .fetch_page(&FetchContext::full(&credentials(), "records"), None)
        .await
        .unwrap();
    assert_stops_after(&page, &["i1"], "malformed Link header");
}

#[tokio::test]
async fn next_urls_on_another_origin_and_mismatched_positions_are_refused() {
    let server = MockServer::start().await;
    let provider = provider(&server, json!({"pagination": {"type": "link"}}));
    let elsewhere = PagePosition::Url {
        url: "https://evil.example.com/v1/items?page=2".into(),
    };
    let error = provider
        .fetch_page(
            &FetchContext::full(&credentials(), "records"),
            Some(&elsewhere),
        )
        .await
        .unwrap_err();
    assert!(matches!(error, FetchError::InvalidUrl { .. }), "{error:?}");
    let cursor = PagePosition::Cursor { cursor: "c".into() };
    let error = provider
        .fetch_page(
            &FetchContext::full(&credentials(), "records"),
            Some(&cursor),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(error, FetchError::PositionMismatch { .. }),
        "{error:?}"
    );
    assert!(server.received_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn bearer_and_header_auth_send_the_token_and_none_sends_nothing() {
    let server = MockServer::start().await;
    Mock::given(path("/v1/items"))
        .and(header("Authorization", format!("Bearer {TOKEN}").as_str()))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": records(&[1])})))
        .expect(1)
        .mount(&server)
        .await;
    let page = provider(&server, json!({}))
        .fetch_page(&FetchContext::full(&credentials(), "records"), None)
        .await
        .unwrap();
    assert_eq!(ids(&page.items), ["1"]);
    server.reset().await;

    Mock::given(path("/v1/items"))
        .and(header("X-Api-Key", TOKEN))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": records(&[2])})))
        .expect(1)
        .mount(&server)
        .await;
    let provider_with_header = provider(&server, json!({"auth": {"header": "X-Api-Key"}}));
    let page = provider_with_header
        .fetch_page(&FetchContext::full(&credentials(), "records"), None)
        .await
        .unwrap();
    assert_eq!(ids(&page.items), ["2"]);
    let request = &server.received_requests().await.unwrap()[0];
    assert!(!request.headers.contains_key("authorization"));
    server.reset().await;

    Mock::given(path("/v1/items"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": records(&[3])})))
        .mount(&server)
        .await;
    let open = provider(&server, json!({"auth": "none"}));
    let page = open
        .fetch_page(
            &FetchContext::full(&Credentials::default(), "records"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(ids(&page.items), ["3"]);
    let request = &server.received_requests().await.unwrap()[0];
    assert!(!request.headers.contains_key("authorization"));
    assert_eq!(request.headers["accept"], "application/json");
}

#[tokio::test]
async fn query_auth_sends_the_key_once_and_never_keeps_it_in_a_next_position() {
    let server = MockServer::start().await;
    // The API echoes the key into its next link, as some do.
    Mock::given(query_param_is_missing("page"))
        .and(query_param("api_key", TOKEN))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"data": records(&[1])}))
                .insert_header(
                    "Link",
                    format!(r#"</v1/items?page=2&api_key={TOKEN}>; rel="next""#),
                ),
        )
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(query_param("page", "2"))
        .and(query_param("api_key", TOKEN))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": records(&[2])})))
        .expect(1)
        .mount(&server)
        .await;
    let provider = provider(
        &server,
        json!({"auth": {"query": "api_key"}, "pagination": {"type": "link"}}),
    );
    let (ids, positions) = walk(&provider, &credentials()).await.unwrap();
    assert_eq!(ids, ["1", "2"]);
    let second = format!("{}/v1/items?page=2", server.uri());
    assert_eq!(positions[1], Some(PagePosition::Url { url: second }));
    let requests = server.received_requests().await.unwrap();
    for request in &requests {
        let keys = request.url.query_pairs().filter(|(k, _)| k == "api_key");
        assert_eq!(keys.count(), 1, "{}", request.url);
        assert!(!request.headers.contains_key("authorization"));
    }
    let error = provider
        .fetch_page(
            &FetchContext::full(&Credentials::default(), "records"),
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        r#"connection has no token, but auth = { query = "api_key" } needs one"#
    );
}

#[tokio::test]
async fn a_missing_token_fails_before_any_request() {
    let server = MockServer::start().await;
    let error = provider(&server, json!({}))
        .fetch_page(
            &FetchContext::full(&Credentials::default(), "records"),
            None,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(error, FetchError::MissingCredentials { .. }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        r#"connection has no token, but auth = "bearer" needs one"#
    );
    assert!(server.received_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn records_path_that_is_not_an_array_is_a_shape_error_with_the_body() {
    let server = MockServer::start().await;
    Mock::given(path("/v1/items"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": {"id": 1}})))
        .mount(&server)
        .await;
    let error = provider(&server, json!({}))
        .fetch_page(&FetchContext::full(&credentials(), "records"), None)
        .await
        .unwrap_err();
    assert!(matches!(error, FetchError::Shape { .. }), "{error:?}");
    assert!(error
        .to_string()
        .contains("records_path `data` is an object, expected an array"));
    assert_eq!(error.body(), Some(r#"{"data":{"id":1}}"#));
    assert_eq!(error.stage(), RecordStage::Parse);

    let error = provider(&server, json!({"records_path": "items"}))
        .fetch_page(&FetchContext::full(&credentials(), "records"), None)
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("records_path `items` is not in the body"),
        "{error}"
    );
}

#[tokio::test]
async fn rejected_records_come_back_in_place_next_to_the_good_ones() {
    let server = MockServer::start().await;
    Mock::given(path("/v1/items"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"data": [{"id": 1}, {"name": "no id"}, {"id": "b"}, 7]})),
        )
        .mount(&server)
        .await;
    let page = provider(&server, json!({}))
        .fetch_page(&FetchContext::full(&credentials(), "records"), None)
        .await
        .unwrap();
    assert_eq!(page.items.len(), 4);
    assert!(matches!(&page.items[0], PageItem::Record(r) if r.external_id == "1"));
    match &page.items[1] {
        PageItem::Rejected(rejected) => {
            assert_eq!(rejected.stage, RecordStage::Validate);
            assert_eq!(rejected.payload, r#"{"name":"no id"}"#);
            assert!(rejected.message.contains("no id field `id`"));
        }
        other => panic!("expected a rejected record, got {other:?}"),
    }
    assert!(matches!(&page.items[2], PageItem::Record(r) if r.external_id == "b"));
    assert!(matches!(&page.items[3], PageItem::Rejected(r) if r.stage == RecordStage::Parse));
    assert_eq!(page.next, None);
}

#[tokio::test]
async fn the_token_never_appears_in_errors_or_debug_output() {
    let server = MockServer::start().await;
    let echo = format!("token {TOKEN} is not valid");
    for (route, response) in [
        (
            "/unauthorized",
            ResponseTemplate::new(401).set_body_string(echo.clone()),
        ),
        (
            "/broken",
            ResponseTemplate::new(500).set_body_string(echo.clone()),
        ),
        (
            "/gone",
            ResponseTemplate::new(404).set_body_string(echo.clone()),
        ),
        (
            "/html",
            ResponseTemplate::new(200).set_body_string(format!("<p>{echo}</p>")),
        ),
        (
            "/shape",
            ResponseTemplate::new(200).set_body_json(json!({"data": echo})),
        ),
    ] {
        Mock::given(path(route))
            .respond_with(response)
            .mount(&server)
            .await;
    }
    for route in ["/unauthorized", "/broken", "/gone", "/html", "/shape"] {
        for auth in [json!("bearer"), json!({"header": "X-Api-Key"})] {
            let provider = provider(&server, json!({"path": route, "auth": auth}));
            let error = provider
                .fetch_page(&FetchContext::full(&credentials(), "records"), None)
                .await
                .unwrap_err();
            let shown = format!("{error} {error:?} {:?}", error.body());
            assert!(!shown.contains(TOKEN), "{route}: {shown}");
            assert!(shown.contains("[redacted]"), "{route}: {shown}");
            let headers = provider
                .request_headers(provider.config(), Some(TOKEN))
                .unwrap();
            assert!(!format!("{headers:?} {provider:?}").contains(TOKEN));
        }
    }
    assert!(!format!("{:?}", credentials()).contains(TOKEN));
}
