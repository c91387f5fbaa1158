//! One poison record costs one record: bad records land in run_errors with their payload,
//! the good ones of the same page commit, and the run ends `partial`.

use serde_json::json;
use tributary::entities::run_error::Stage;
use tributary::entities::sync_run::RunStatus;
use wiremock::matchers::{method, path};
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{cursor_provider, spawn_app};

#[tokio::test]
async fn bad_records_go_to_run_errors_with_their_payload_and_the_page_commits() {
    let app = spawn_app().await;
    let data = json!([
        {"id": "good_1", "v": 1},
        {"v": "no id at all"},
        {"id": "", "v": "empty id"},
        {"id": true, "v": "boolean id"},
        {"id": 1.5, "v": "fractional id"},
        "not an object",
        {"id": "good_2", "v": 2},
    ]);
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"data": data, "next_cursor": null})),
        )
        .mount(&app.api)
        .await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;

    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Partial);
    assert_eq!(run.error, None, "a partial run has no run-level error");
    assert_eq!(
        (run.counts.fetched, run.counts.inserted, run.counts.failed),
        (7, 2, 5)
    );
    let ids: Vec<String> = app
        .records()
        .await
        .into_iter()
        .map(|r| r.external_id)
        .collect();
    assert_eq!(ids, ["good_1", "good_2"]);

    let errors = app.run_errors(run.run_id).await;
    let report: Vec<(Stage, &str, Option<&str>)> = errors
        .iter()
        .map(|e| (e.stage, e.payload.as_str(), e.external_id.as_deref()))
        .collect();
    assert_eq!(
        report,
        [
            (Stage::Validate, r#"{"v":"no id at all"}"#, None),
            (Stage::Validate, r#"{"id":"","v":"empty id"}"#, None),
            (Stage::Validate, r#"{"id":true,"v":"boolean id"}"#, None),
            (Stage::Validate, r#"{"id":1.5,"v":"fractional id"}"#, None),
            (Stage::Parse, r#""not an object""#, None),
        ]
    );
    assert!(
        errors[0].message.contains("no id field `id`"),
        "{}",
        errors[0].message
    );
    assert!(errors
        .iter()
        .all(|e| e.user_id == "alice" && e.provider == "acme"));
    let row = app.run_row(run.run_id).await;
    assert_eq!((row.status, row.records_failed), (RunStatus::Partial, 5));
}

/// Changed records are rewritten in one statement per page; when the database refuses one
/// of them, the page is written again record by record and only that one is set aside.
#[tokio::test]
async fn a_rewrite_the_database_refuses_costs_that_record_only() {
    let app = spawn_app().await;
    let page = |version: u32| {
        let data: Vec<_> = ["a", "poison", "b", "c"]
            .iter()
            .map(|id| json!({"id": id, "version": version}))
            .collect();
        ResponseTemplate::new(200).set_body_json(json!({"data": data, "next_cursor": null}))
    };
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .respond_with(page(1))
        .up_to_n_times(1)
        .mount(&app.api)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .respond_with(page(2))
        .mount(&app.api)
        .await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    let first = app.sync_one(&settings).await;
    assert_eq!(
        (first.status, first.counts.inserted),
        (RunStatus::Succeeded, 4)
    );
    app.refuse_updates_of("poison", "poison rewrite refused")
        .await;

    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Partial);
    assert_eq!((run.counts.updated, run.counts.failed), (3, 1));
    let stored: Vec<(String, String)> = app
        .records()
        .await
        .into_iter()
        .map(|r| (r.external_id, r.payload))
        .collect();
    assert_eq!(
        stored,
        [
            ("a".to_string(), r#"{"id":"a","version":2}"#.to_string()),
            ("b".to_string(), r#"{"id":"b","version":2}"#.to_string()),
            ("c".to_string(), r#"{"id":"c","version":2}"#.to_string()),
            (
                "poison".to_string(),
                r#"{"id":"poison","version":1}"#.to_string()
            ),
        ]
    );
    let errors = app.run_errors(run.run_id).await;
    assert_eq!(errors.len(), 1);
    assert_eq!(
        (errors[0].stage, errors[0].external_id.as_deref()),
        (Stage::Persist, Some("poison"))
    );
    assert_eq!(errors[0].payload, r#"{"id":"poison","version":2}"#);
    assert!(errors[0].message.contains("poison rewrite refused"));
}

#[tokio::test]
async fn a_record_the_database_refuses_is_reported_and_its_page_mates_commit() {
    let app = spawn_app().await;
    // A real database-side failure for one key: the multi-row insert fails, the pipeline
    // retries row by row, and only the refused record is set aside.
    app.refuse_inserts_of("poison", "poison refused by the database")
        .await;
    let data = json!([{"id": "a"}, {"id": "poison", "x": 1}, {"id": "b"}]);
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"data": data, "next_cursor": null})),
        )
        .mount(&app.api)
        .await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;

    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Partial);
    assert_eq!((run.counts.inserted, run.counts.failed), (2, 1));
    let ids: Vec<String> = app
        .records()
        .await
        .into_iter()
        .map(|r| r.external_id)
        .collect();
    assert_eq!(ids, ["a", "b"]);
    let errors = app.run_errors(run.run_id).await;
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].stage, Stage::Persist);
    assert_eq!(errors[0].external_id.as_deref(), Some("poison"));
    assert_eq!(errors[0].payload, r#"{"id":"poison","x":1}"#);
    assert!(errors[0].message.contains("poison refused by the database"));
}
