//! Which records a page yields: `records_path` flattening nested arrays with `[]` under the
//! per-page cap, and `records_filter` dropping and counting records.

use serde_json::{json, Value};
use wiremock::matchers::{method, path, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

use super::{credentials, ids, invalid_rest, provider, rest_config, RestProvider};
use crate::http::{HttpClient, HttpSettings};
use crate::{FetchContext, FetchError, Page, PagePosition, Provider, Watermark};

/// One page of the primary stream at `position`.
async fn fetch(
    provider: &RestProvider,
    position: Option<&PagePosition>,
) -> Result<Page, FetchError> {
    provider
        .fetch_page(&FetchContext::full(&credentials(), "records"), position)
        .await
}

/// Serves `body` at `/v1/items` whatever the query, `times` times.
async fn serve(server: &MockServer, body: Value, times: u64) {
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .respond_with(ResponseTemplate::new(200).set_body_json(body))
        .expect(times)
        .mount(server)
        .await;
}

fn grouped() -> Value {
    json!({"data": {"groups": [
        {"name": "a", "items": [{"id": 1}, {"id": 2}]},
        {"name": "b", "items": []},
        {"name": "c", "items": [{"id": 3}]},
    ]}})
}

#[tokio::test]
async fn a_flattened_records_path_yields_every_item_of_every_group() {
    let server = MockServer::start().await;
    serve(&server, grouped(), 1).await;
    let provider = provider(&server, json!({"records_path": "data.groups[].items"}));
    let page = fetch(&provider, None).await.unwrap();
    assert_eq!(ids(&page.items), ["1", "2", "3"]);
    assert_eq!((page.next, page.filtered), (None, 0));
}

#[tokio::test]
async fn the_per_page_cap_counts_the_records_of_all_groups() {
    let server = MockServer::start().await;
    serve(&server, grouped(), 2).await;
    let capped = |max_records_per_page| {
        let settings = HttpSettings {
            max_records_per_page,
            max_retries: 0,
            ..HttpSettings::default()
        };
        RestProvider::new(
            rest_config(&server, json!({"records_path": "data.groups[].items"})),
            HttpClient::new(settings).unwrap(),
        )
    };
    let page = fetch(&capped(3), None).await.unwrap();
    assert_eq!(ids(&page.items), ["1", "2", "3"]);
    let error = fetch(&capped(2), None).await.unwrap_err();
    assert!(
        matches!(
            error,
            FetchError::TooManyRecords {
                count: 3,
                limit: 2,
                ..
            }
        ),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_group_without_the_array_is_a_shape_error_naming_it() {
    let server = MockServer::start().await;
    serve(
        &server,
        json!({"data": {"groups": [{"items": [{"id": 1}]}, {"name": "no items"}]}}),
        1,
    )
    .await;
    let provider = provider(&server, json!({"records_path": "data.groups[].items"}));
    let error = fetch(&provider, None).await.unwrap_err();
    assert!(
        error.to_string().contains(
            "records_path `data.groups[].items`: `data.groups[1].items` is not in the body"
        ),
        "{error}"
    );
}

#[test]
fn malformed_records_paths_are_refused_naming_the_key() {
    for (bad, expected) in [
        (
            "data..items",
            "records_path `data..items` has an empty segment",
        ),
        (
            "data[0].items",
            "records_path `data[0].items`: the segment `data[0]`",
        ),
    ] {
        let message = invalid_rest(json!({"records_path": bad}));
        assert!(message.starts_with(expected), "{bad}: {message}");
    }
}

#[tokio::test]
async fn records_filter_drops_and_counts_records_without_errors() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(query_param("offset", "0"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [
            {"id": 1, "status": "open", "updated_at": "2024-01-01T00:00:00Z"},
            {"id": 2, "status": "deleted", "updated_at": "2024-09-09T00:00:00Z"},
            {"status": "deleted"},
            {"id": 4, "updated_at": "2024-02-02T00:00:00Z"},
        ]})))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(query_param("offset", "4"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [
            {"id": 5, "status": "deleted"},
        ]})))
        .expect(1)
        .mount(&server)
        .await;
    let provider = provider(
        &server,
        json!({
            "records_filter": {"field": "status", "not_in": ["deleted", "archived"]},
            "incremental": {"cursor_field": "updated_at", "param": "since"},
            "pagination": {"type": "offset", "page_size_param": "limit", "page_size": 4},
        }),
    );
    let first = fetch(&provider, None).await.unwrap();
    // The record without an id is dropped, not set aside: it is not wanted at all.
    assert_eq!(ids(&first.items), ["1", "4"]);
    assert_eq!(first.filtered, 2);
    // Pagination goes by what the API listed; the watermark by what is kept.
    assert_eq!(first.next, Some(PagePosition::Offset { offset: 4 }));
    let newest_kept = chrono::DateTime::parse_from_rfc3339("2024-02-02T00:00:00Z").unwrap();
    assert_eq!(first.watermark, Some(Watermark::Time(newest_kept.to_utc())));
    let second = fetch(&provider, first.next.as_ref()).await.unwrap();
    assert_eq!((ids(&second.items).len(), second.filtered), (0, 1));
    assert_eq!(second.next, None);
}

#[tokio::test]
async fn a_resources_filter_is_its_own() {
    let server = MockServer::start().await;
    serve(
        &server,
        json!({"data": [{"id": 1, "kind": "a"}, {"id": 2, "kind": "b"}]}),
        2,
    )
    .await;
    let provider = provider(
        &server,
        json!({
            "records_filter": {"field": "kind", "equals": "a"},
            "resources": {"all": {"path": "/v1/items"}},
        }),
    );
    let primary = fetch(&provider, None).await.unwrap();
    assert_eq!(
        (ids(&primary.items), primary.filtered),
        (vec!["1".into()], 1)
    );
    let all = provider
        .fetch_page(&FetchContext::full(&credentials(), "all"), None)
        .await
        .unwrap();
    assert_eq!((ids(&all.items).len(), all.filtered), (2, 0));
}

#[test]
fn records_filter_settings_are_checked() {
    for (filter, expected) in [
        (json!({"field": "s"}), "records_filter needs one test"),
        (
            json!({"field": "s", "in": []}),
            "records_filter.in must list at least one value",
        ),
        (
            json!({"field": "s", "equals": "a", "not_equals": "b"}),
            "records_filter has more than one",
        ),
        (
            json!({"field": "a..b", "exists": true}),
            "records_filter.field",
        ),
    ] {
        let message = invalid_rest(json!({"records_filter": filter}));
        assert!(message.starts_with(expected), "{filter}: {message}");
    }
}
