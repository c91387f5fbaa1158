//! Pages of any size and shape commit or fail cleanly: thousands of bad records are
//! written in chunks like every other multi-row write.

use serde_json::{json, Value};
use tributary::entities::run_error::{Scope, Stage};
use tributary::pipeline::RunStatus;
use wiremock::matchers::{method, path, query_param, query_param_is_missing};
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{cursor_provider, items, spawn_app, TestApp};

/// Mounts the page at `cursor` (`None`: the first page) holding `data`, pointing to `next`.
async fn mount_page(app: &TestApp, cursor: Option<&str>, data: Vec<Value>, next: Option<&str>) {
    let mock = Mock::given(method("GET")).and(path("/v1/items"));
    let mock = match cursor {
        None => mock.and(query_param_is_missing("cursor")),
        Some(cursor) => mock.and(query_param("cursor", cursor)),
    };
    mock.respond_with(
        ResponseTemplate::new(200).set_body_json(json!({"data": data, "next_cursor": next})),
    )
    .mount(&app.api)
    .await;
}

/// Records of every shape that cannot be keyed: not objects, and ids of the wrong type.
fn mixed_bad_records(count: usize) -> Vec<Value> {
    (0..count)
        .map(|i| match i % 7 {
            0 => json!(i),
            1 => json!(format!("s{i}")),
            2 => json!([i]),
            3 => json!({"id": true, "n": i}),
            4 => json!({"id": null, "n": i}),
            5 => json!({"id": 1.5, "n": i}),
            _ => Value::Null,
        })
        .collect()
}

#[tokio::test]
async fn pages_of_thousands_of_bad_records_commit_and_the_listing_goes_on() {
    let app = spawn_app().await;
    let without_ids: Vec<Value> = (0..5_000).map(|i| json!({"n": i})).collect();
    let mixed = mixed_bad_records(3_500);
    let good = items("ok_", "alice", 0..2);
    mount_page(&app, None, without_ids.clone(), Some("p2")).await;
    mount_page(&app, Some("p2"), mixed.clone(), Some("p3")).await;
    mount_page(&app, Some("p3"), good, None).await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;

    let bad: Vec<String> = without_ids
        .iter()
        .chain(&mixed)
        .map(Value::to_string)
        .collect();
    for (attempt, inserted, unchanged) in [(1, 2, 0), (2, 0, 2)] {
        let run = app.sync_one(&settings).await;
        assert_eq!(
            run.status,
            RunStatus::Partial,
            "run {attempt}: {:?}",
            run.error
        );
        assert_eq!(run.error, None);
        let counts = &run.counts;
        assert_eq!(
            (counts.pages_fetched, counts.fetched, counts.failed),
            (3, 8_502, 8_500),
            "run {attempt}"
        );
        assert_eq!((counts.inserted, counts.unchanged), (inserted, unchanged));
        let errors = app.run_errors(run.run_id).await;
        let payloads: Vec<&str> = errors.iter().map(|e| e.payload.as_str()).collect();
        assert_eq!(
            payloads, bad,
            "run {attempt}: every bad record, in page order"
        );
        assert!(errors[..5_000]
            .iter()
            .all(|e| e.stage == Stage::Validate && e.message.contains("no id field `id`")));
        assert_eq!(
            errors[5_000].stage,
            Stage::Parse,
            "{}",
            errors[5_000].message
        );
        let row = app.run_row(run.run_id).await;
        assert_eq!(
            (row.status, row.records_failed),
            (RunStatus::Partial, 8_500)
        );
    }
    assert_eq!(app.record_ids().await, ["ok_0", "ok_1"]);
}

#[tokio::test]
async fn a_page_past_max_records_per_page_is_one_page_error_and_the_run_fails_naming_the_cap() {
    let app = spawn_app().await;
    mount_page(&app, None, items("ok_", "alice", 0..2), Some("p2")).await;
    // The default cap is 10,000 records a page.
    let tiny: Vec<Value> = vec![json!(0); 40_000];
    mount_page(&app, Some("p2"), tiny, Some("p3")).await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;

    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.error.unwrap_or_default();
    assert!(
        error.starts_with("fetching page 2 failed: response from ")
            && error.ends_with("holds 40000 records, more than max_records_per_page = 10000"),
        "{error}"
    );
    assert_eq!((run.counts.fetched, run.counts.failed), (2, 0));
    let errors = app.run_errors(run.run_id).await;
    assert_eq!(errors.len(), 1, "one row for the page, none per record");
    let page = &errors[0];
    assert_eq!((page.stage, page.scope), (Stage::Parse, Scope::Page));
    assert!(page.message.contains("max_records_per_page = 10000"));
    assert!(page.payload.starts_with(r#"{"data":[0,0,0,"#));
    assert_eq!(page.payload.len(), 64 * 1024, "the start of the body only");
    // The page before it is stored, and the next run starts again at the page refused.
    assert_eq!(app.record_ids().await, ["ok_0", "ok_1"]);
    let checkpoint = app.stream_checkpoint().await;
    assert!(checkpoint.unwrap_or_default().contains("p2"));
}
