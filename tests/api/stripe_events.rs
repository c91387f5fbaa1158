//! Stripe's streams through the pipeline: a full pass, then incremental runs from the
//! Events API, where updates to old objects arrive and deletions mark records deleted.

use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, Set};
use serde_json::json;
use tributary::entities::connection_stream;
use tributary::entities::sync_run::RunStatus;
use tributary::pipeline::changes::{Cursor, FeedChange};
use wiremock::matchers::{header, method, path, query_param, query_param_is_missing};
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{connections, read_feed, spawn_app, TestApp};

/// A `stripe` provider named `pay` syncing customers for alice.
fn stripe(app: &TestApp) -> String {
    format!(
        "[providers.pay]\nkind = \"stripe\"\nbase_url = \"{}\"\nschedule = \"0 * * * * *\"\n\
         streams = [\"customers\"]\n{}",
        app.api.uri(),
        connections("pay", &["alice"])
    )
}

fn customer(id: &str, name: &str) -> serde_json::Value {
    json!({"id": id, "object": "customer", "created": 1_600_000_000, "name": name})
}

fn event(id: &str, kind: &str, created: i64, object: serde_json::Value) -> serde_json::Value {
    json!({"id": id, "object": "event", "api_version": "2026-09-30.endive",
           "created": created, "data": {"object": object}, "livemode": false,
           "pending_webhooks": 0, "type": kind})
}

fn list(data: serde_json::Value, has_more: bool) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "object": "list", "url": "/v1/x", "has_more": has_more, "data": data
    }))
}

fn stripe_get(endpoint: &str) -> wiremock::MockBuilder {
    Mock::given(method("GET"))
        .and(path(endpoint))
        .and(header("authorization", "Bearer token-alice"))
        .and(header(
            "stripe-version",
            tributary_providers::stripe::DEFAULT_API_VERSION,
        ))
}

async fn customers_cursor(app: &TestApp) -> Option<i64> {
    let state = connection_stream::Entity::find()
        .filter(connection_stream::Column::Stream.eq("customers"))
        .one(&app.db)
        .await
        .expect("connection_streams")?;
    let cursor: serde_json::Value =
        serde_json::from_str(state.cursor.as_deref()?).expect("JSON cursor");
    cursor["epoch"].as_i64()
}

/// The stored customers as (id, name, deleted).
async fn customers(app: &TestApp) -> Vec<(String, String, bool)> {
    app.records()
        .await
        .into_iter()
        .map(|record| {
            assert_eq!(record.provider, "pay.customers");
            let payload: serde_json::Value =
                serde_json::from_str(&record.payload).expect("JSON payload");
            let name = payload["name"].as_str().unwrap_or_default().to_string();
            (record.external_id, name, record.deleted_at.is_some())
        })
        .collect()
}

#[tokio::test]
async fn incremental_runs_apply_events_so_updates_to_old_objects_and_deletions_arrive() {
    let app = spawn_app().await;
    stripe_get("/v1/customers")
        .and(query_param("limit", "100"))
        .and(query_param_is_missing("starting_after"))
        .respond_with(list(
            json!([customer("cus_2", "Grace"), customer("cus_1", "Ada")]),
            false,
        ))
        .expect(1)
        .mount(&app.api)
        .await;
    let settings = app.settings(&stripe(&app)).await;
    let before = chrono::Utc::now().timestamp();
    let full = app.sync_one(&settings).await;
    assert_eq!(
        (full.status, full.counts.inserted),
        (RunStatus::Succeeded, 2)
    );
    let cursor = customers_cursor(&app).await.expect("a cursor");
    assert!(
        cursor >= before && cursor <= chrono::Utc::now().timestamp(),
        "the full pass's cursor is when it began: {cursor}"
    );

    // Since then, Ada was renamed and Grace deleted; Stripe lists the newest first.
    let since = cursor.to_string();
    stripe_get("/v1/events")
        .and(query_param("type", "customer.*"))
        .and(query_param("created[gte]", since.as_str()))
        .and(query_param_is_missing("starting_after"))
        .and(query_param_is_missing("ending_before"))
        .respond_with(list(
            json!([
                event(
                    "evt_3",
                    "customer.deleted",
                    cursor + 20,
                    customer("cus_2", "Grace")
                ),
                event(
                    "evt_2",
                    "customer.updated",
                    cursor + 10,
                    customer("cus_1", "Ada Lovelace")
                ),
                event(
                    "evt_1",
                    "customer.updated",
                    cursor,
                    customer("cus_1", "Ada L.")
                ),
            ]),
            false,
        ))
        .expect(1)
        .mount(&app.api)
        .await;
    let since_feed = read_feed(&app.db, Cursor::START, 100).await.1;
    let incremental = app.sync_one(&settings).await;
    assert_eq!(incremental.status, RunStatus::Succeeded, "{incremental:?}");
    assert_eq!(
        (
            incremental.counts.updated,
            incremental.counts.deleted,
            incremental.counts.duplicate
        ),
        (1, 1, 1),
        "the older version of Ada in the same page gives way to the newer"
    );
    app.api.verify().await;
    assert_eq!(
        customers(&app).await,
        [
            ("cus_1".to_string(), "Ada Lovelace".to_string(), false),
            ("cus_2".to_string(), "Grace".to_string(), true),
        ]
    );
    let (changes, _) = read_feed(&app.db, since_feed, 100).await;
    let mut seen: Vec<(String, String, String)> = changes
        .iter()
        .map(|change: &FeedChange| {
            (
                change.provider.clone(),
                change.external_id.clone(),
                change.kind.to_string(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            (
                "pay.customers".to_string(),
                "cus_1".to_string(),
                "updated".to_string()
            ),
            (
                "pay.customers".to_string(),
                "cus_2".to_string(),
                "deleted".to_string()
            ),
        ]
    );
}

#[tokio::test]
async fn a_cursor_older_than_stripes_event_retention_makes_the_run_a_full_pass() {
    let app = spawn_app().await;
    stripe_get("/v1/customers")
        .respond_with(list(json!([customer("cus_1", "Ada")]), false))
        .expect(2)
        .mount(&app.api)
        .await;
    stripe_get("/v1/events")
        .respond_with(list(json!([]), false))
        .expect(0)
        .mount(&app.api)
        .await;
    let settings = app.settings(&stripe(&app)).await;
    app.sync_one(&settings).await;
    let state = connection_stream::Entity::find()
        .filter(connection_stream::Column::Stream.eq("customers"))
        .one(&app.db)
        .await
        .expect("query")
        .expect("the stream's state");
    let forty_days_ago = chrono::Utc::now().timestamp() - 40 * 86_400;
    let mut old: connection_stream::ActiveModel = state.into();
    old.cursor = Set(Some(format!(r#"{{"epoch":{forty_days_ago}}}"#)));
    old.update(&app.db).await.expect("aged cursor");

    let run = app.sync_one(&settings).await;
    assert_eq!(
        (run.status, run.counts.unchanged),
        (RunStatus::Succeeded, 1)
    );
    app.api.verify().await;
    assert!(
        customers_cursor(&app).await.expect("a cursor") > forty_days_ago,
        "the full pass gave the stream a fresh cursor"
    );
}
