//! The three-part key: the index matches it, a re-run inserts nothing, tenants never merge.

use sea_orm::Iden;
use serde_json::json;
use tributary::entities::record;
use tributary::entities::sync_run::RunStatus;
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{connections, cursor_provider, items, spawn_app};

/// Serves `data` as one page for requests carrying `token`.
async fn serve_one_page(server: &wiremock::MockServer, token: &str, data: Vec<serde_json::Value>) {
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .and(header("authorization", format!("Bearer {token}").as_str()))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({ "data": data, "next_cursor": null })),
        )
        .mount(server)
        .await;
}

#[tokio::test]
async fn the_unique_index_covers_exactly_the_pipeline_key() {
    let app = spawn_app().await;
    let indexes = app.unique_indexes_on_records().await;
    let key: Vec<String> = record::KEY_COLUMNS.iter().map(|c| c.to_string()).collect();
    assert_eq!(
        indexes,
        vec![key.clone()],
        "exactly one unique index besides the primary key"
    );
    assert_eq!(key, ["user_id", "provider", "external_id"]);
}

#[tokio::test]
async fn running_the_same_sync_twice_leaves_the_records_table_identical() {
    let app = spawn_app().await;
    serve_one_page(&app.api, "token-alice", items("it_", "alice", 0..25)).await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;

    let first = app.sync_one(&settings).await;
    assert_eq!(first.status, RunStatus::Succeeded);
    assert_eq!(first.counts.inserted, 25);
    let after_first = app.dump_records().await;
    assert_eq!(after_first.len(), 25);

    let second = app.sync_one(&settings).await;
    assert_eq!(second.status, RunStatus::Succeeded);
    assert_eq!(second.counts.inserted, 0);
    assert_eq!(second.counts.updated, 0);
    assert_eq!(second.counts.unchanged, 25);
    assert_eq!(
        app.dump_records().await,
        after_first,
        "run 2 changed the records table"
    );

    let row = app.run_row(second.run_id).await;
    assert_eq!((row.records_inserted, row.records_unchanged), (0, 25));
    assert_eq!(row.status, RunStatus::Succeeded);
}

#[tokio::test]
async fn a_changed_record_is_updated_in_place_and_the_rest_are_untouched() {
    let app = spawn_app().await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    let mut data = items("it_", "alice", 0..5);
    serve_one_page(&app.api, "token-alice", data.clone()).await;
    let first = app.sync_one(&settings).await;
    let before = app.records().await;

    app.api.reset().await;
    data[2]["n"] = json!(999);
    serve_one_page(&app.api, "token-alice", data).await;
    let second = app.sync_one(&settings).await;
    assert_eq!(
        (
            second.counts.inserted,
            second.counts.updated,
            second.counts.unchanged
        ),
        (0, 1, 4)
    );

    let after = app.records().await;
    assert_eq!(after.len(), 5);
    for (old, new) in before.iter().zip(&after) {
        assert_eq!(old.id, new.id, "rows keep their ids");
        if new.external_id == "it_2" {
            assert!(new.payload.contains("999"));
            assert_ne!(new.content_hash, old.content_hash);
            assert_eq!(new.first_seen_run_id, first.run_id);
            assert_eq!(new.last_seen_run_id, second.run_id);
        } else {
            assert_eq!(old, new, "an unchanged record was rewritten");
        }
    }
}

#[tokio::test]
async fn overlapping_external_ids_never_merge_across_users_or_providers() {
    let app = spawn_app().await;
    let acme = wiremock::MockServer::start().await;
    let globex = wiremock::MockServer::start().await;
    // Every user on every provider gets the same ids 0..10, with content naming the owner.
    for (server, provider) in [(&acme, "acme"), (&globex, "globex")] {
        for user in ["alice", "bob"] {
            let data = items("shared_", &format!("{user}/{provider}"), 0..10);
            serve_one_page(server, &format!("token-{user}"), data).await;
        }
    }
    let providers = format!(
        "{}{}",
        cursor_provider("acme", &acme.uri(), &["alice", "bob"]),
        cursor_provider("globex", &globex.uri(), &["alice", "bob"])
    );
    let settings = app.settings(&providers).await;
    let outcomes = app.sync(&settings).await;
    assert_eq!(outcomes.len(), 4);
    assert!(
        outcomes.iter().all(|o| o.counts.inserted == 10),
        "{outcomes:?}"
    );

    let records = app.records().await;
    assert_eq!(records.len(), 40, "4 connections x 10 records, none merged");
    for record in &records {
        let payload: serde_json::Value = serde_json::from_str(&record.payload).unwrap();
        assert_eq!(
            payload["owner"],
            json!(format!("{}/{}", record.user_id, record.provider)),
            "record {} is attached to the wrong tenant",
            record.external_id
        );
    }

    // A second pass over all four changes nothing.
    let again = app.sync(&settings).await;
    assert!(again
        .iter()
        .all(|o| o.counts.inserted == 0 && o.counts.unchanged == 10));
    assert_eq!(app.records().await, records);
}

#[tokio::test]
async fn a_key_repeated_within_a_page_is_stored_once_with_its_last_content() {
    let app = spawn_app().await;
    let data = vec![
        json!({"id": "a", "v": 1}),
        json!({"id": "b", "v": 1}),
        json!({"id": "a", "v": 2}),
    ];
    serve_one_page(&app.api, "token-alice", data).await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    let run = app.sync_one(&settings).await;
    assert_eq!((run.counts.inserted, run.counts.duplicate), (2, 1));
    let records = app.records().await;
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].payload, r#"{"id":"a","v":2}"#);
}

#[tokio::test]
async fn key_fields_are_hashed_into_the_external_id_when_there_is_no_stable_id() {
    let app = spawn_app().await;
    let providers = format!(
        r#"
[providers.steps]
kind = "rest"
base_url = "{}"
path = "/daily"
schedule = "0 0 * * * *"
key_fields = ["date", "type"]
auth = "none"
{}"#,
        app.api.uri(),
        connections("steps", &["alice"])
    );
    Mock::given(method("GET"))
        .and(path("/daily"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!([
            {"date": "2026-11-01", "type": "walk", "steps": 4000},
            {"date": "2026-11-01", "type": "run", "steps": 9000},
            {"date": "2026-11-02", "type": "walk", "steps": 5000},
        ])))
        .mount(&app.api)
        .await;
    let settings = app.settings(&providers).await;
    let first = app.sync_one(&settings).await;
    assert_eq!(first.counts.inserted, 3);
    let second = app.sync_one(&settings).await;
    assert_eq!((second.counts.inserted, second.counts.unchanged), (0, 3));

    let expected =
        tributary_providers::record::sha256_hex(br#"{"date":"2026-11-01","type":"run"}"#);
    let records = app.records().await;
    assert_eq!(records.len(), 3);
    assert!(records.iter().any(|r| r.external_id == expected));
    assert!(records.iter().all(|r| r.external_id.len() == 64));
}
