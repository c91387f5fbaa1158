//! The `next_url`, `header` and `has_more` pagination types: walks that stop exactly at the
//! end, next URLs on other origins, malformed values, repeated positions, and validation.

use serde_json::json;
use wiremock::matchers::{method, path, query_param, query_param_is_missing};
use wiremock::{Mock, MockServer, ResponseTemplate};

use super::{credentials, ids, invalid_rest, provider, queries, walk};
use crate::test_support::assert_stops_after;
use crate::{FetchContext, PagePosition, Provider};

fn records(ids: &[&str]) -> serde_json::Value {
    ids.iter().map(|id| json!({"id": id})).collect()
}

/// Answers the requests whose parameter `name` is `value` (`None`: absent) once.
async fn answer(server: &MockServer, name: &str, value: Option<&str>, response: ResponseTemplate) {
    let mock = Mock::given(method("GET")).and(path("/v1/items"));
    let mock = match value {
        Some(value) => mock.and(query_param(name, value)),
        None => mock.and(query_param_is_missing(name)),
    };
    mock.respond_with(response).expect(1).mount(server).await;
}

fn json_page(body: serde_json::Value) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(body)
}

#[tokio::test]
async fn next_url_follows_absolute_and_base_relative_urls_until_null() {
    let server = MockServer::start().await;
    let absolute = format!("{}/v1/items?page=2", server.uri());
    answer(
        &server,
        "page",
        None,
        json_page(json!({"data": records(&["a", "b"]), "links": {"next": absolute}})),
    )
    .await;
    answer(
        &server,
        "page",
        Some("2"),
        json_page(json!({"data": records(&["c"]), "links": {"next": "/v1/items?page=3"}})),
    )
    .await;
    answer(
        &server,
        "page",
        Some("3"),
        json_page(json!({"data": records(&["d"]), "links": {"next": null}})),
    )
    .await;
    let provider = provider(
        &server,
        json!({"query": {"team": "core"},
               "pagination": {"type": "next_url", "next_url_path": "links.next"}}),
    );
    let (ids, positions) = walk(&provider, &credentials()).await.unwrap();
    assert_eq!(ids, ["a", "b", "c", "d"]);
    assert_eq!(positions[1], Some(PagePosition::Url { url: absolute }));
    assert_eq!(
        positions[2],
        Some(PagePosition::Url {
            url: format!("{}/v1/items?page=3", server.uri())
        })
    );
    assert_eq!(queries(&server).await, ["team=core", "page=2", "page=3"]);
}

#[tokio::test]
async fn next_url_reads_odata_keys_and_ends_when_the_key_is_missing_or_empty() {
    let server = MockServer::start().await;
    let next = format!("{}/v1/items?$skiptoken=x1", server.uri());
    answer(
        &server,
        "$skiptoken",
        None,
        json_page(json!({"value": records(&["a"]), "@odata.nextLink": next})),
    )
    .await;
    answer(
        &server,
        "$skiptoken",
        Some("x1"),
        json_page(json!({"value": records(&["b"])})),
    )
    .await;
    let provider = provider(
        &server,
        json!({"records_path": "value",
               "pagination": {"type": "next_url", "next_url_path": "\"@odata.nextLink\""}}),
    );
    let (ids, _) = walk(&provider, &credentials()).await.unwrap();
    assert_eq!(ids, ["a", "b"]);
    assert_eq!(queries(&server).await.len(), 2);

    server.reset().await;
    answer(
        &server,
        "$skiptoken",
        None,
        json_page(json!({"value": records(&["c"]), "@odata.nextLink": ""})),
    )
    .await;
    let (ids, positions) = walk(&provider, &credentials()).await.unwrap();
    assert_eq!((ids, positions), (vec!["c".to_string()], vec![None]));
}

#[tokio::test]
async fn next_url_on_another_origin_or_of_another_type_stops_after_the_page() {
    let server = MockServer::start().await;
    let cases = [
        (
            json!("https://evil.example.com/v1/items?page=2"),
            "the next-page URL https://evil.example.com/v1/items?page=2 is not on the origin of \
             base_url",
        ),
        (
            json!(42),
            "pagination.next_url_path `links.next` is a number, expected a URL string",
        ),
        (
            json!({"href": "/v1/items?page=2"}),
            "pagination.next_url_path `links.next` is an object, expected a URL string",
        ),
    ];
    for (next, reason) in cases {
        server.reset().await;
        answer(
            &server,
            "page",
            None,
            json_page(json!({"data": records(&["a"]), "links": {"next": next}})),
        )
        .await;
        let provider = provider(
            &server,
            json!({"pagination": {"type": "next_url", "next_url_path": "links.next"}}),
        );
        let page = provider
            .fetch_page(&FetchContext::full(&credentials(), "records"), None)
            .await
            .unwrap();
        assert_stops_after(&page, &["a"], reason);
        assert_eq!(queries(&server).await.len(), 1);
    }
}

#[tokio::test]
async fn link_headers_to_another_origin_stop_after_the_page_too() {
    let server = MockServer::start().await;
    answer(
        &server,
        "page",
        None,
        json_page(json!({"data": records(&["a"])})).insert_header(
            "Link",
            r#"<https://evil.example.com/v1/items?page=2>; rel="next""#,
        ),
    )
    .await;
    let provider = provider(&server, json!({"pagination": {"type": "link"}}));
    let page = provider
        .fetch_page(&FetchContext::full(&credentials(), "records"), None)
        .await
        .unwrap();
    assert_stops_after(&page, &["a"], "is not on the origin of base_url");
}

#[tokio::test]
async fn header_tokens_are_sent_back_with_the_incremental_param_until_absent() {
    let server = MockServer::start().await;
    let with_token = |ids: &[&str], token: &str| {
        json_page(json!({"data": records(ids)})).insert_header("X-Next-Page-Token", token)
    };
    answer(&server, "page_token", None, with_token(&["a", "b"], "t2")).await;
    answer(&server, "page_token", Some("t2"), with_token(&["c"], "t3")).await;
    answer(
        &server,
        "page_token",
        Some("t3"),
        json_page(json!({"data": records(&["d"])})),
    )
    .await;
    let provider = provider(
        &server,
        json!({"pagination": {"type": "header", "next_header": "X-Next-Page-Token",
                              "cursor_param": "page_token"},
               "incremental": {"cursor_field": "updated_at", "param": "since",
                               "start": "2024-01-01T00:00:00Z"}}),
    );
    let (ids, positions) = walk(&provider, &credentials()).await.unwrap();
    assert_eq!(ids, ["a", "b", "c", "d"]);
    assert_eq!(
        positions[1],
        Some(PagePosition::Cursor {
            cursor: "t2".into()
        })
    );
    let since = "since=2024-01-01T00%3A00%3A00Z";
    assert_eq!(
        queries(&server).await,
        [
            since.to_string(),
            format!("{since}&page_token=t2"),
            format!("{since}&page_token=t3")
        ]
    );

    server.reset().await;
    answer(&server, "page_token", None, with_token(&["e"], "")).await;
    let (ids, positions) = walk(&provider, &credentials()).await.unwrap();
    assert_eq!((ids, positions), (vec!["e".to_string()], vec![None]));
}

#[tokio::test]
async fn a_repeated_token_is_handed_back_as_the_same_position_for_the_loop_guard() {
    let server = MockServer::start().await;
    Mock::given(path("/v1/items"))
        .respond_with(json_page(json!({"data": records(&["a"])})).insert_header("X-Next", "same"))
        .mount(&server)
        .await;
    let provider = provider(
        &server,
        json!({"pagination": {"type": "header", "next_header": "X-Next", "cursor_param": "t"}}),
    );
    let credentials = credentials();
    let context = FetchContext::full(&credentials, "records");
    let first = provider.fetch_page(&context, None).await.unwrap();
    let second = provider
        .fetch_page(&context, first.next.as_ref())
        .await
        .unwrap();
    assert_eq!(first.next, second.next);
    assert_eq!(
        second.next,
        Some(PagePosition::Cursor {
            cursor: "same".into()
        })
    );
}

#[tokio::test]
async fn has_more_sends_the_last_id_until_has_more_is_false() {
    let server = MockServer::start().await;
    answer(
        &server,
        "starting_after",
        None,
        json_page(json!({"data": records(&["cus_1", "cus_2"]), "has_more": true})),
    )
    .await;
    answer(
        &server,
        "starting_after",
        Some("cus_2"),
        json_page(json!({"data": records(&["cus_3"]), "has_more": true})),
    )
    .await;
    answer(
        &server,
        "starting_after",
        Some("cus_3"),
        json_page(json!({"data": records(&["cus_4"]), "has_more": false})),
    )
    .await;
    let provider = provider(
        &server,
        json!({"pagination": {"type": "has_more", "after_param": "starting_after",
                              "page_size_param": "limit", "page_size": 2}}),
    );
    let (ids, positions) = walk(&provider, &credentials()).await.unwrap();
    assert_eq!(ids, ["cus_1", "cus_2", "cus_3", "cus_4"]);
    assert_eq!(
        positions[2],
        Some(PagePosition::Cursor {
            cursor: "cus_3".into()
        })
    );
    assert_eq!(
        queries(&server).await,
        [
            "limit=2",
            "limit=2&starting_after=cus_2",
            "limit=2&starting_after=cus_3"
        ]
    );
}

#[tokio::test]
async fn has_more_missing_ends_and_malformed_or_unfollowable_pages_stop_the_run() {
    let server = MockServer::start().await;
    let provider = provider(
        &server,
        json!({"id_field": "meta.id",
               "pagination": {"type": "has_more", "after_param": "after",
                              "has_more_path": "paging.more"}}),
    );
    let cases = [
        (json!({"data": [{"meta": {"id": 7}}]}), vec!["7"], None),
        (
            json!({"data": [{"meta": {"id": 7}}], "paging": {"more": "yes"}}),
            vec!["7"],
            Some("pagination.has_more_path `paging.more` is a string, expected true or false"),
        ),
        (
            json!({"data": [{"meta": {"id": 7}}], "paging": {"more": null}}),
            vec!["7"],
            Some("pagination.has_more_path `paging.more` is null, expected true or false"),
        ),
        (
            json!({"data": [], "paging": {"more": true}}),
            vec![],
            Some(
                "pagination.has_more_path `paging.more` is true, but the page holds no \
                 records, so there is no last id to send as pagination.after_param",
            ),
        ),
        (
            json!({"data": [{"meta": {"id": 7}}, {"id": 8}], "paging": {"more": true}}),
            vec!["7", "!record has no id field `meta.id`"],
            Some("the page's last record has no id to send as pagination.after_param"),
        ),
    ];
    for (body, expected, reason) in cases {
        server.reset().await;
        answer(&server, "after", None, json_page(body.clone())).await;
        let page = provider
            .fetch_page(&FetchContext::full(&credentials(), "records"), None)
            .await
            .unwrap();
        match reason {
            Some(reason) => assert_stops_after(&page, &expected, reason),
            None => {
                assert_eq!(ids(&page.items), expected, "{body}");
                assert_eq!((page.next, page.stop_after), (None, None), "{body}");
            }
        }
        assert_eq!(queries(&server).await.len(), 1, "{body}");
    }
}

#[test]
fn new_pagination_settings_are_validated_naming_the_key() {
    let cases = [
        (
            json!({"pagination": {"type": "next_url"}}),
            r#"pagination.next_url_path is required when pagination.type = "next_url""#,
        ),
        (
            json!({"pagination": {"type": "next_url", "next_url_path": "links..next"}}),
            "pagination.next_url_path `links..next` has an empty segment",
        ),
        (
            json!({"pagination": {"type": "header", "cursor_param": "t"}}),
            r#"pagination.next_header is required when pagination.type = "header""#,
        ),
        (
            json!({"pagination": {"type": "header", "next_header": "X-Next"}}),
            r#"pagination.cursor_param is required when pagination.type = "header""#,
        ),
        (
            json!({"pagination": {"type": "header", "next_header": "X Next", "cursor_param": "t"}}),
            "pagination.next_header \"X Next\" is not a valid HTTP header name",
        ),
        (
            json!({"pagination": {"type": "has_more"}}),
            r#"pagination.after_param is required when pagination.type = "has_more""#,
        ),
        (
            json!({"key_fields": ["a"], "pagination": {"type": "has_more", "after_param": "after"}}),
            "it needs id_field, not key_fields",
        ),
        (
            json!({"query": {"after": "x"},
                   "pagination": {"type": "has_more", "after_param": "after"}}),
            "pagination.after_param \"after\" is also query.after; a request cannot carry both",
        ),
        (
            json!({"pagination": {"type": "cursor", "cursor_path": "n", "cursor_param": "c",
                                  "has_more_path": "more"}}),
            r#"pagination.has_more_path is set, but pagination.type = "cursor" does not use it (it belongs to pagination.type = "has_more")"#,
        ),
        (
            json!({"pagination": {"type": "offset", "cursor_param": "c"}}),
            r#"(it belongs to pagination.type = "cursor" or "header")"#,
        ),
    ];
    for (extra, expected) in cases {
        let message = invalid_rest(extra.clone());
        assert!(message.contains(expected), "{extra}: {message}");
    }
    let error = super::provider_config(json!({
        "kind": "rest", "base_url": "https://api.example.com",
        "pagination": {"type": "nexturl"},
    }))
    .unwrap_err();
    assert!(
        error.to_string().contains("unknown variant `nexturl`"),
        "{error}"
    );
}
