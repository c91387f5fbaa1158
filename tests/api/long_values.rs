//! Values longer than any sane API sends (an id, a cursor, a next-page URL) are refused
//! with a clear error, and URLs and cursors are quoted truncated wherever they are quoted.

use serde_json::json;
use tributary::config::Settings;
use tributary::entities::run_error::Stage;
use tributary::entities::sync_run::RunStatus;
use wiremock::matchers::{method, path, query_param, query_param_is_missing};
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{connections, cursor_provider, spawn_app, TestApp};

/// The most characters a quoted URL or cursor takes (and its "…").
const QUOTED: usize = 256 + 1;

async fn mount_first_page(app: &TestApp, body: serde_json::Value) {
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(query_param_is_missing("cursor"))
        .respond_with(ResponseTemplate::new(200).set_body_json(body))
        .mount(&app.api)
        .await;
}

/// The settings of a cursor-paged `acme` with one connection, for `alice`.
async fn cursor_settings(app: &TestApp) -> Settings {
    app.settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await
}

/// How many requests asked for a page by cursor.
async fn cursor_requests(app: &TestApp) -> usize {
    let requests = app.api.received_requests().await.unwrap_or_default();
    requests
        .iter()
        .filter(|request| request.url.query_pairs().any(|(name, _)| name == "cursor"))
        .count()
}

#[tokio::test]
async fn a_record_with_an_over_long_id_is_a_validate_error_with_its_payload() {
    let app = spawn_app().await;
    let long = json!({"id": "x".repeat(300), "v": 1});
    mount_first_page(
        &app,
        json!({"data": [long, {"id": "ok"}], "next_cursor": null}),
    )
    .await;
    let settings = cursor_settings(&app).await;

    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Partial);
    assert_eq!(app.record_ids().await, ["ok"]);
    let errors = app.run_errors(run.run_id).await;
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].stage, Stage::Validate);
    assert_eq!(errors[0].payload, long.to_string());
    let message = &errors[0].message;
    assert!(
        message.starts_with("id is 300 bytes long, more than the 255 allowed (starts with \"xxx")
            && message.len() < 120,
        "{message}"
    );
}

#[tokio::test]
async fn an_over_long_cursor_fails_the_run_after_its_page_is_stored() {
    let app = spawn_app().await;
    let cursor = "c".repeat(5_000);
    mount_first_page(
        &app,
        json!({"data": [{"id": "a"}, {"id": "b"}], "next_cursor": cursor}),
    )
    .await;
    let settings = cursor_settings(&app).await;

    for attempt in 1..=2 {
        let run = app.sync_one(&settings).await;
        assert_eq!(run.status, RunStatus::Failed, "run {attempt}");
        let error = run.error.clone().unwrap_or_default();
        let quoted = format!("\"{}…\"", "c".repeat(256));
        assert_eq!(
            error,
            format!(
                "page 1: the next cursor is 5000 bytes long, more than the 4096 allowed (it \
                 starts {quoted}); its records were stored, and the next run starts again at \
                 this page"
            )
        );
        assert_eq!(app.run_row(run.run_id).await.error, Some(error));
        assert_eq!(run.counts.inserted, if attempt == 1 { 2 } else { 0 });
    }
    assert_eq!(app.record_ids().await, ["a", "b"]);
    assert_eq!(cursor_requests(&app).await, 0, "the cursor is never sent");
}

#[tokio::test]
async fn an_over_long_next_link_fails_the_run_after_its_page_is_stored() {
    let app = spawn_app().await;
    let next = format!("{}/v1/items?after={}", app.api.uri(), "u".repeat(9_000));
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(query_param_is_missing("after"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!([{"id": "a"}]))
                .insert_header("link", format!("<{next}>; rel=\"next\"").as_str()),
        )
        .mount(&app.api)
        .await;
    let provider = format!(
        "[providers.acme]\nkind = \"rest\"\nbase_url = \"{}\"\npath = \"/v1/items\"\n\
         schedule = \"0 */15 * * * *\"\nauth = \"bearer\"\n\
         [providers.acme.pagination]\ntype = \"link\"\n{}",
        app.api.uri(),
        connections("acme", &["alice"])
    );
    let settings = app.settings(&provider).await;

    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.error.unwrap_or_default();
    let prefix = format!(
        "page 1: the next-page URL is {} bytes long, more than the 8192 allowed ({}/v1/items?after=uuu",
        next.len(),
        app.api.uri()
    );
    assert!(error.starts_with(&prefix), "{error}");
    assert!(error.contains("…); its records were stored"), "{error}");
    assert!(error.len() < QUOTED + 200, "{error}");
    assert_eq!(app.record_ids().await, ["a"]);
}

#[tokio::test]
async fn urls_and_cursors_are_quoted_truncated_in_the_runs_error() {
    let app = spawn_app().await;
    // A URL: the configured query makes every request URL long, and the API refuses it.
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .respond_with(ResponseTemplate::new(404).set_body_string("no such list"))
        .mount(&app.api)
        .await;
    let long_query = format!(
        "[providers.acme.query]\nfilter = \"{}\"\n",
        "f".repeat(2_000)
    );
    let provider = cursor_provider("acme", &app.api.uri(), &["alice"]).replacen(
        "[providers.acme.http]",
        &format!("{long_query}[providers.acme.http]"),
        1,
    );
    let settings = app.settings(&provider).await;
    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Failed);
    let error = app.run_row(run.run_id).await.error.unwrap_or_default();
    assert!(
        error.contains("/v1/items?filter=fff") && error.contains("…"),
        "{error}"
    );
    assert!(error.len() < QUOTED + 200, "{error}");

    // A cursor: one that comes back again stops the run, quoting it.
    app.api.reset().await;
    let cursor = "L".repeat(1_000);
    mount_first_page(&app, json!({"data": [{"id": "a"}], "next_cursor": cursor})).await;
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(query_param("cursor", cursor.as_str()))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"data": [{"id": "b"}], "next_cursor": cursor})),
        )
        .mount(&app.api)
        .await;
    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Failed);
    let error = app.run_row(run.run_id).await.error.unwrap_or_default();
    assert_eq!(
        error,
        format!(
            "pagination returned to a page already fetched in this run (cursor \"{}…\"); \
             stopped to avoid a loop",
            "L".repeat(256)
        )
    );
}
