//! Every pagination type walks a three-page listing through the real pipeline, page by
//! page, and the loop and max-pages guards stop listings that never end.

use serde_json::json;
use tributary::entities::sync_run::RunStatus;
use wiremock::matchers::{method, path, query_param, query_param_is_missing};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::helpers::{connections, items, spawn_app};

/// A `rest` provider on `base_url` with the given pagination table body.
fn provider(base_url: &str, records_path: Option<&str>, pagination: &str) -> String {
    let records_path = records_path
        .map(|p| format!("records_path = \"{p}\"\n"))
        .unwrap_or_default();
    format!(
        r#"
[providers.acme]
kind = "rest"
base_url = "{base_url}"
path = "/v1/items"
schedule = "0 */15 * * * *"
{records_path}auth = "bearer"
max_pages = 10

[providers.acme.http]
max_retries = 1
retry_initial_delay = "1ms"

[providers.acme.pagination]
{pagination}
{}"#,
        connections("acme", &["alice"])
    )
}

async fn respond(server: &MockServer, mock: wiremock::MockBuilder, body: serde_json::Value) {
    mock.respond_with(ResponseTemplate::new(200).set_body_json(body))
        .mount(server)
        .await;
}

fn get() -> wiremock::MockBuilder {
    Mock::given(method("GET")).and(path("/v1/items"))
}

#[tokio::test]
async fn cursor_pagination_follows_the_cursor_until_it_is_null() {
    let app = spawn_app().await;
    respond(
        &app.api,
        get().and(query_param_is_missing("cursor")),
        json!({"data": items("c", "alice", 0..3), "next_cursor": "p2"}),
    )
    .await;
    respond(
        &app.api,
        get().and(query_param("cursor", "p2")),
        json!({"data": items("c", "alice", 3..6), "next_cursor": "p3"}),
    )
    .await;
    respond(
        &app.api,
        get().and(query_param("cursor", "p3")),
        json!({"data": items("c", "alice", 6..8), "next_cursor": null}),
    )
    .await;
    let pagination = "type = \"cursor\"\ncursor_path = \"next_cursor\"\ncursor_param = \"cursor\"";
    let settings = app
        .settings(&provider(&app.api.uri(), Some("data"), pagination))
        .await;
    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Succeeded);
    assert_eq!((run.counts.pages_fetched, run.counts.inserted), (3, 8));
    assert_eq!(app.records().await.len(), 8);
}

#[tokio::test]
async fn offset_pagination_stops_on_a_short_page() {
    let app = spawn_app().await;
    respond(
        &app.api,
        get()
            .and(query_param("offset", "0"))
            .and(query_param("limit", "3")),
        json!({"items": items("o", "alice", 0..3)}),
    )
    .await;
    respond(
        &app.api,
        get().and(query_param("offset", "3")),
        json!({"items": items("o", "alice", 3..6)}),
    )
    .await;
    respond(
        &app.api,
        get().and(query_param("offset", "6")),
        json!({"items": items("o", "alice", 6..7)}),
    )
    .await;
    let pagination = "type = \"offset\"\npage_size_param = \"limit\"\npage_size = 3";
    let settings = app
        .settings(&provider(&app.api.uri(), Some("items"), pagination))
        .await;
    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Succeeded);
    assert_eq!((run.counts.pages_fetched, run.counts.inserted), (3, 7));
}

#[tokio::test]
async fn offset_pagination_without_a_page_size_stops_on_an_empty_page() {
    let app = spawn_app().await;
    for (offset, range) in [("0", 0..3), ("3", 3..4), ("4", 4..4)] {
        get()
            .and(query_param("offset", offset))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(json!({"items": items("o", "alice", range)})),
            )
            .expect(1)
            .mount(&app.api)
            .await;
    }
    let settings = app
        .settings(&provider(
            &app.api.uri(),
            Some("items"),
            "type = \"offset\"",
        ))
        .await;
    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Succeeded);
    // Without page_size_param a short page proves nothing: only the empty one ends it.
    assert_eq!((run.counts.pages_fetched, run.counts.inserted), (3, 4));
    app.api.verify().await;
}

#[tokio::test]
async fn page_pagination_stops_on_an_empty_page() {
    let app = spawn_app().await;
    for page in 1..=3 {
        let start = (page - 1) * 2;
        respond(
            &app.api,
            get().and(query_param("page", page.to_string().as_str())),
            json!(items("p", "alice", start..start + 2)),
        )
        .await;
    }
    respond(&app.api, get().and(query_param("page", "4")), json!([])).await;
    let settings = app
        .settings(&provider(&app.api.uri(), None, "type = \"page\""))
        .await;
    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Succeeded);
    assert_eq!((run.counts.pages_fetched, run.counts.inserted), (4, 6));
}

#[tokio::test]
async fn link_pagination_follows_rel_next() {
    let app = spawn_app().await;
    let base = app.api.uri();
    let page = |n: usize, next: Option<String>| {
        let mut template =
            ResponseTemplate::new(200).set_body_json(items("l", "alice", n * 2..n * 2 + 2));
        if let Some(next) = next {
            template = template.insert_header(
                "link",
                format!("<{next}>; rel=\"next\", <{base}/v1/items?page=1>; rel=\"first\"").as_str(),
            );
        }
        template
    };
    get()
        .and(query_param_is_missing("page"))
        .respond_with(page(0, Some(format!("{base}/v1/items?page=2"))))
        .mount(&app.api)
        .await;
    // A relative link is resolved against the request URL.
    get()
        .and(query_param("page", "2"))
        .respond_with(page(1, Some("/v1/items?page=3".to_string())))
        .mount(&app.api)
        .await;
    get()
        .and(query_param("page", "3"))
        .respond_with(page(2, None))
        .mount(&app.api)
        .await;
    let settings = app
        .settings(&provider(&base, None, "type = \"link\""))
        .await;
    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{:?}", run.error);
    assert_eq!((run.counts.pages_fetched, run.counts.inserted), (3, 6));
}

#[tokio::test]
async fn no_pagination_fetches_one_page() {
    let app = spawn_app().await;
    get()
        .respond_with(ResponseTemplate::new(200).set_body_json(json!(items("n", "alice", 0..4))))
        .expect(1)
        .mount(&app.api)
        .await;
    let settings = app
        .settings(&provider(&app.api.uri(), None, "type = \"none\""))
        .await;
    let run = app.sync_one(&settings).await;
    assert_eq!((run.counts.pages_fetched, run.counts.inserted), (1, 4));
}

#[tokio::test]
async fn a_link_that_loops_back_stops_the_run_with_a_clear_error() {
    let app = spawn_app().await;
    let base = app.api.uri();
    let next = |n: u32| format!("<{base}/v1/items?page={n}>; rel=\"next\"");
    get()
        .and(query_param_is_missing("page"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!(items("x", "alice", 0..1)))
                .insert_header("link", next(2).as_str()),
        )
        .mount(&app.api)
        .await;
    get()
        .and(query_param("page", "2"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!(items("x", "alice", 1..2)))
                .insert_header("link", next(3).as_str()),
        )
        .mount(&app.api)
        .await;
    get()
        .and(query_param("page", "3"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!(items("x", "alice", 2..3)))
                .insert_header("link", next(2).as_str()),
        )
        .expect(1)
        .mount(&app.api)
        .await;
    let settings = app
        .settings(&provider(&base, None, "type = \"link\""))
        .await;
    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.counts.inserted, 3, "the pages before the loop are kept");
    let error = run.error.unwrap();
    assert!(error.contains("already fetched"), "{error}");
}

#[tokio::test]
async fn a_cursor_that_never_ends_is_stopped_by_max_pages() {
    let app = spawn_app().await;
    // Every page points to a fresh cursor: an endless listing.
    get()
        .respond_with(|request: &wiremock::Request| {
            let n: u64 = request
                .url
                .query_pairs()
                .find(|(k, _)| k == "cursor")
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0);
            ResponseTemplate::new(200).set_body_json(
                json!({"data": [{"id": format!("e{n}")}], "next_cursor": (n + 1).to_string()}),
            )
        })
        .mount(&app.api)
        .await;
    let pagination = "type = \"cursor\"\ncursor_path = \"next_cursor\"\ncursor_param = \"cursor\"";
    let settings = app
        .settings(&provider(&app.api.uri(), Some("data"), pagination))
        .await;
    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!((run.counts.pages_fetched, run.counts.inserted), (10, 10));
    assert!(run.error.unwrap().contains("max_pages = 10"));
}

/// Runs `pagination` against an API that answers every request with `answer`, and returns
/// the run's error after checking that it failed at the second request, keeping the
/// records stored by then: a page whose position moved on is stored (`pages`), one that
/// only repeats the page before is not.
async fn run_against_a_stuck_api(
    records_path: Option<&str>,
    pagination: &str,
    answer: ResponseTemplate,
    pages: u64,
) -> String {
    let app = spawn_app().await;
    get().respond_with(answer).mount(&app.api).await;
    let settings = app
        .settings(&provider(&app.api.uri(), records_path, pagination))
        .await;
    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(
        (
            run.counts.pages_fetched,
            run.counts.inserted,
            run.counts.unchanged
        ),
        (pages, 2, (pages - 1) * 2),
        "the pages stored before the stop are kept"
    );
    assert_eq!(
        app.received_requests().await,
        2,
        "stopped at the second page"
    );
    run.error.unwrap()
}

#[tokio::test]
async fn a_next_url_that_points_back_stops_the_run() {
    let answer = ResponseTemplate::new(200)
        .set_body_json(json!({"data": items("n", "alice", 0..2), "next": "/v1/items?page=2"}));
    let error = run_against_a_stuck_api(
        Some("data"),
        "type = \"next_url\"\nnext_url_path = \"next\"",
        answer,
        2,
    )
    .await;
    assert!(error.contains("already fetched"), "{error}");
}

#[tokio::test]
async fn a_has_more_listing_that_ignores_the_last_id_stops_the_run() {
    let answer = ResponseTemplate::new(200)
        .set_body_json(json!({"data": items("h", "alice", 0..2), "has_more": true}));
    let error = run_against_a_stuck_api(
        Some("data"),
        "type = \"has_more\"\nafter_param = \"starting_after\"",
        answer,
        2,
    )
    .await;
    assert!(
        error.contains("already fetched") && error.contains("cursor \"h1\""),
        "{error}"
    );
}

#[tokio::test]
async fn a_header_token_that_repeats_stops_the_run() {
    let answer = ResponseTemplate::new(200)
        .set_body_json(json!({"data": items("t", "alice", 0..2)}))
        .insert_header("X-Next-Page-Token", "same");
    let error = run_against_a_stuck_api(
        Some("data"),
        "type = \"header\"\nnext_header = \"X-Next-Page-Token\"\ncursor_param = \"page_token\"",
        answer,
        2,
    )
    .await;
    assert!(error.contains("already fetched"), "{error}");
}

#[tokio::test]
async fn an_api_that_ignores_the_page_number_stops_the_run() {
    let answer = ResponseTemplate::new(200).set_body_json(json!(items("p", "alice", 0..2)));
    let error = run_against_a_stuck_api(None, "type = \"page\"", answer, 1).await;
    assert!(
        error.contains("page 2 (page 2) holds the same records as the page before it"),
        "{error}"
    );
}

#[tokio::test]
async fn an_api_that_ignores_the_offset_stops_the_run() {
    let answer = ResponseTemplate::new(200).set_body_json(json!(items("o", "alice", 0..2)));
    let error = run_against_a_stuck_api(None, "type = \"offset\"", answer, 1).await;
    assert!(
        error.contains("page 2 (offset 2) holds the same records as the page before it"),
        "{error}"
    );
}
