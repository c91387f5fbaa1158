//! Pages of any size and shape commit or fail cleanly: pages at `max_records_per_page`
//! store on every backend, thousands of bad records are written in chunks like every
//! other multi-row write, and a large body is parsed off the runtime's workers.

use std::collections::BTreeMap;
use std::ops::Range;

use serde_json::{json, Value};
use tributary::entities::run_error::{Scope, Stage};
use tributary::entities::sync_run::RunStatus;
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

/// `max_records_per_page`'s default: a page may hold this many records.
const MAX_PAGE: usize = 10_000;

/// Records `big_NNNNN` for `ids`, at content version `version`.
fn versioned(ids: Range<usize>, version: u32) -> Vec<Value> {
    ids.map(|i| json!({"id": format!("big_{i:05}"), "v": version}))
        .collect()
}

/// Mounts `pages` as a listing of that many pages, replacing the listing mounted before.
async fn mount_listing(app: &TestApp, pages: Vec<Vec<Value>>) {
    app.api.reset().await;
    let count = pages.len();
    for (index, data) in pages.into_iter().enumerate() {
        let cursor = (index > 0).then(|| format!("p{index}"));
        let next = (index + 1 < count).then(|| format!("p{}", index + 1));
        mount_page(app, cursor.as_deref(), data, next.as_deref()).await;
    }
}

#[tokio::test]
async fn pages_at_max_records_per_page_store_new_changed_and_mixed_records() {
    let app = spawn_app().await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    let third = MAX_PAGE / 3;
    // Each page of the mixed listing: a third of a page of the second run unchanged, the
    // next third changed, and a third new; every page still MAX_PAGE records.
    let mixed = |page: usize| {
        let start = page * MAX_PAGE;
        let mut records = versioned(start..start + MAX_PAGE - 2 * third, 2);
        records.extend(versioned(
            start + MAX_PAGE - 2 * third..start + MAX_PAGE - third,
            3,
        ));
        let new = 3 * MAX_PAGE + page * third;
        records.extend(versioned(new..new + third, 3));
        records
    };
    let all = |version| -> Vec<Vec<Value>> {
        (0..3)
            .map(|page| versioned(page * MAX_PAGE..(page + 1) * MAX_PAGE, version))
            .collect()
    };
    let runs = [
        ("all new", all(1), (3 * MAX_PAGE as u64, 0, 0)),
        ("all changed", all(2), (0, 3 * MAX_PAGE as u64, 0)),
        (
            "mixed",
            (0..3).map(mixed).collect(),
            (
                3 * third as u64,
                3 * third as u64,
                3 * (MAX_PAGE - 2 * third) as u64,
            ),
        ),
    ];
    for (name, pages, (inserted, updated, unchanged)) in runs {
        mount_listing(&app, pages).await;
        let run = app.sync_one(&settings).await;
        assert_eq!(run.status, RunStatus::Succeeded, "{name}: {:?}", run.error);
        let counts = &run.counts;
        assert_eq!(
            (counts.pages_fetched, counts.fetched, counts.failed),
            (3, 3 * MAX_PAGE as u64, 0),
            "{name}"
        );
        assert_eq!(
            (counts.inserted, counts.updated, counts.unchanged),
            (inserted, updated, unchanged),
            "{name}"
        );
        let row = app.run_row(run.run_id).await;
        assert_eq!(row.status, RunStatus::Succeeded, "{name}");
    }

    // Every key once, with the content of the last run that carried it.
    let mut versions: BTreeMap<u64, usize> = BTreeMap::new();
    let records = app.records().await;
    for record in &records {
        let payload: Value = serde_json::from_str(&record.payload).unwrap();
        *versions.entry(payload["v"].as_u64().unwrap()).or_default() += 1;
    }
    let untouched = 3 * third;
    assert_eq!(
        versions,
        BTreeMap::from([
            (2, 3 * (MAX_PAGE - 2 * third) + untouched),
            (3, 3 * third + 3 * third),
        ])
    );
    assert_eq!(records.len(), 3 * MAX_PAGE + 3 * third);
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

/// A body of `bytes` bytes of JSON: one array of strings.
fn body_of(bytes: usize) -> String {
    let item = format!("\"{}\"", "x".repeat(98));
    let items = vec![item; bytes / 100 + 1];
    format!("[{}]", items.join(","))
}

#[test]
fn a_large_body_is_parsed_on_the_blocking_pool_and_a_small_one_inline() {
    use std::time::Duration;
    // One blocking thread, held below: a body parsed on the pool waits for it.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = wiremock::MockServer::start().await;
        for (route, bytes) in [("/small", 1024), ("/large", 64 * 1024)] {
            Mock::given(method("GET"))
                .and(path(route))
                .respond_with(ResponseTemplate::new(200).set_body_string(body_of(bytes)))
                .mount(&server)
                .await;
        }
        let client = tributary_providers::HttpClient::new(Default::default()).unwrap();
        let get = |route: &str| {
            let client = client.clone();
            let url = url::Url::parse(&format!("{}{route}", server.uri())).unwrap();
            async move { client.get_json(url, Default::default()).await }
        };
        let (held_tx, held_rx) = tokio::sync::oneshot::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let hold = tokio::task::spawn_blocking(move || {
            let _ = held_tx.send(());
            let _ = release_rx.recv();
        });
        held_rx.await.unwrap();

        let small = tokio::time::timeout(Duration::from_secs(10), get("/small"))
            .await
            .expect("a small body is parsed without the blocking pool");
        assert!(small.is_ok(), "{:?}", small.err());
        let large = tokio::spawn(get("/large"));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !large.is_finished(),
            "a large body waits for the blocking pool"
        );
        release_tx.send(()).unwrap();
        hold.await.unwrap();
        let large = tokio::time::timeout(Duration::from_secs(10), large)
            .await
            .expect("the large body is parsed once the pool is free")
            .unwrap();
        assert!(large.is_ok(), "{:?}", large.err());
    });
}
