//! API faults: rate limits, server errors, broken bodies and rejected credentials. Pages
//! stored before a fault stay stored, and the next run resumes at the failed page.

use std::time::Instant;

use serde_json::json;
use tributary::entities::run_error::Stage;
use tributary::entities::sync_run::RunStatus;
use wiremock::matchers::{method, path, query_param, query_param_is_missing};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::helpers::{cursor_provider, items, spawn_app};

fn get() -> wiremock::MockBuilder {
    Mock::given(method("GET")).and(path("/v1/items"))
}

fn page(data: Vec<serde_json::Value>, next: Option<&str>) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({"data": data, "next_cursor": next}))
}

/// Page 1 (no cursor) and page 2 (`cursor=p2`, the last) of alice's listing.
async fn mount_two_pages(server: &MockServer) {
    get()
        .and(query_param_is_missing("cursor"))
        .respond_with(page(items("f", "alice", 0..3), Some("p2")))
        .mount(server)
        .await;
    get()
        .and(query_param("cursor", "p2"))
        .respond_with(page(items("f", "alice", 3..6), None))
        .mount(server)
        .await;
}

#[tokio::test]
async fn a_429_with_retry_after_is_waited_out_and_the_run_succeeds() {
    let app = spawn_app().await;
    get()
        .and(query_param("cursor", "p2"))
        .respond_with(ResponseTemplate::new(429).insert_header("retry-after", "1"))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&app.api)
        .await;
    mount_two_pages(&app.api).await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    let started = Instant::now();
    let run = app.sync_one(&settings).await;
    assert!(
        started.elapsed().as_millis() >= 950,
        "Retry-After was not honoured"
    );
    assert_eq!(run.status, RunStatus::Succeeded, "{:?}", run.error);
    assert_eq!(run.counts.inserted, 6);
}

#[tokio::test]
async fn server_errors_are_retried_then_succeed() {
    let app = spawn_app().await;
    get()
        .and(query_param_is_missing("cursor"))
        .respond_with(ResponseTemplate::new(503))
        .up_to_n_times(2)
        .with_priority(1)
        .mount(&app.api)
        .await;
    mount_two_pages(&app.api).await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Succeeded, "{:?}", run.error);
    assert_eq!(run.counts.inserted, 6);
}

#[tokio::test]
async fn server_errors_that_persist_fail_the_run_and_keep_committed_pages() {
    let app = spawn_app().await;
    get()
        .and(query_param_is_missing("cursor"))
        .respond_with(page(items("f", "alice", 0..3), Some("p2")))
        .mount(&app.api)
        .await;
    // max_retries = 2 in the test provider: three attempts in all, then the run fails.
    get()
        .and(query_param("cursor", "p2"))
        .respond_with(ResponseTemplate::new(500).set_body_string("internal error"))
        .expect(3)
        .mount(&app.api)
        .await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.error.clone().unwrap();
    assert!(error.contains("page 2") && error.contains("500"), "{error}");
    assert_eq!(app.records().await.len(), 3, "page 1 stays committed");
    let row = app.run_row(run.run_id).await;
    assert_eq!(row.status, RunStatus::Failed);
    assert_eq!(row.error.as_deref(), Some(error.as_str()));
    app.api.verify().await;

    // The connection's checkpoint points at page 2, so the next run resumes there.
    let checkpoint: serde_json::Value =
        serde_json::from_str(&app.stream_checkpoint().await.unwrap()).unwrap();
    assert_eq!(
        checkpoint["position"],
        serde_json::json!({"type": "cursor", "cursor": "p2"})
    );
    assert_eq!(
        (&checkpoint["since"], &checkpoint["watermark"]),
        (&serde_json::Value::Null, &serde_json::Value::Null)
    );
    assert!(
        checkpoint["walk_started"].is_string(),
        "the resumed run's cursor stays bounded by the walk's start: {checkpoint}"
    );
    // A resumed run counts its pages from the one it resumed at: failing there again,
    // it fails on its own page 1.
    let failed_again = app.sync_one(&settings).await;
    assert_eq!(failed_again.status, RunStatus::Failed);
    let error = failed_again.error.clone().unwrap();
    assert!(
        error.contains("fetching page 1 failed") && error.contains("500"),
        "{error}"
    );
    assert_eq!(failed_again.counts.pages_fetched, 0);
    app.api.reset().await;
    get()
        .and(query_param_is_missing("cursor"))
        .respond_with(ResponseTemplate::new(500))
        .expect(0)
        .mount(&app.api)
        .await;
    get()
        .and(query_param("cursor", "p2"))
        .respond_with(page(items("f", "alice", 3..6), None))
        .expect(1)
        .mount(&app.api)
        .await;
    let resumed = app.sync_one(&settings).await;
    assert_eq!(resumed.status, RunStatus::Succeeded, "{:?}", resumed.error);
    assert_eq!(
        (resumed.counts.pages_fetched, resumed.counts.inserted),
        (1, 3)
    );
    assert_eq!(app.records().await.len(), 6);
    let state = app.only_stream().await.expect("the stream's state");
    assert_eq!(state.checkpoint, None);
    assert_eq!(state.last_success_run_id, Some(resumed.run_id));
}

#[tokio::test]
async fn a_malformed_json_body_fails_the_run_and_keeps_the_body_in_the_report() {
    let app = spawn_app().await;
    let body = r#"{"data": [{"id": "a"}, {"id": "#;
    get()
        .respond_with(ResponseTemplate::new(200).set_body_raw(body, "application/json"))
        .mount(&app.api)
        .await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Failed);
    assert!(
        run.error.as_deref().unwrap_or("").contains("JSON"),
        "{:?}",
        run.error
    );
    assert!(app.records().await.is_empty());
    let errors = app.run_errors(run.run_id).await;
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].stage, Stage::Parse);
    assert_eq!(errors[0].payload, body);
    assert_eq!(errors[0].external_id, None);
}

#[tokio::test]
async fn rejected_credentials_fail_the_run_without_retrying_or_leaking_the_token() {
    let app = spawn_app().await;
    get()
        .respond_with(
            ResponseTemplate::new(401).set_body_json(json!({"message": "Bad credentials"})),
        )
        .expect(1)
        .mount(&app.api)
        .await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.error.clone().unwrap();
    assert!(
        error.contains("credentials") && error.contains("401"),
        "{error}"
    );
    assert!(!error.contains("token-alice"));
    let outcome_json = serde_json::to_string(&run).unwrap();
    assert!(!outcome_json.contains("token-alice"));
    app.api.verify().await;
}

#[tokio::test]
async fn a_missing_token_variable_fails_the_run_with_its_name() {
    let app = spawn_app().await;
    let providers = cursor_provider("acme", &app.api.uri(), &["alice"]).replace(
        "token = \"token-alice\"",
        "token_env = \"TRIBUTARY_TEST_UNSET_TOKEN_VARIABLE\"",
    );
    let settings = app.settings(&providers).await;
    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Failed);
    assert!(run
        .error
        .unwrap()
        .contains("TRIBUTARY_TEST_UNSET_TOKEN_VARIABLE"));
}
