//! Connection events in the webhook outbox: a receiver (wiremock standing in for the app)
//! gets `connection.created`, `connection.authorization_failed`, `connection.reconnected`
//! and `connection.recovered`, each once per transition, signed as run notifications are,
//! and with no token, refresh token or client secret in any body.

use std::time::Duration;

use reqwest::StatusCode;
use sea_orm::sea_query::Expr;
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, Set};
use serde_json::{json, Value};
use tributary::entities::connection;
use tributary::entities::notification_delivery::{DeliveryEvent, DeliveryStatus};
use tributary::entities::sync_job::{self, JobKind, JobStatus};
use tributary::entities::sync_run::RunStatus;
use wiremock::MockServer;

use crate::connect::{connections_of, RETURN_URL};
use crate::connect_health::{
    acme, mount_listing, mount_token_endpoint, AGAIN_ACCESS, AGAIN_REFRESH, FIRST_ACCESS,
    FIRST_REFRESH,
};
use crate::connect_oauth::connect_with;
use crate::daemon::{eventually, runs_of};
use crate::helpers::{
    cursor_provider, items, mount_cursor_pages, run, spawn_app, tributary, TestApp,
};
use crate::http::Served;
use crate::notifications::{
    all_settled, answer, deliver_until, deliveries, notifier, notify_table, received, verified,
    SECRET, SECRET_ENV,
};

const CLIENT_SECRET: &str = "acme-client-secret-89ab";

/// The connection events among the bodies the receiver got, in the order it got them,
/// each signature checked; also every raw body.
async fn events_received(receiver: &MockServer) -> (Vec<Value>, Vec<String>) {
    let requests = received(receiver).await;
    let raw = requests
        .iter()
        .map(|request| String::from_utf8_lossy(&request.body).into_owned())
        .collect();
    let events = requests
        .iter()
        .map(verified)
        .filter(|body| body.get("event").is_some())
        .collect();
    (events, raw)
}

/// Queues a manual job of `acme` for connection `id`, as `sync --queue` would: manual
/// jobs run even while the connection needs a reconnect.
async fn queue_manual_job(app: &TestApp, id: i64) {
    let now = chrono::Utc::now();
    sync_job::ActiveModel {
        connection_id: Set(id),
        provider: Set("acme".to_string()),
        stream: Set(String::new()),
        kind: Set(JobKind::Manual),
        status: Set(JobStatus::Queued),
        priority: Set(JobKind::Manual.priority()),
        not_before: Set(Some(now)),
        created_at: Set(now),
        ..Default::default()
    }
    .insert(&app.db)
    .await
    .expect("a manual job");
}

/// Marks connection `id` as needing a reconnect, as a refused refresh would.
async fn mark_needs_reconnect(app: &TestApp, id: i64) {
    connection::Entity::update_many()
        .col_expr(
            connection::Column::NeedsReconnectSince,
            Expr::value(Some(chrono::Utc::now())),
        )
        .filter(connection::Column::Id.eq(id))
        .exec(&app.db)
        .await
        .expect("marked");
}

/// Alice's `acme` listing two records, and the settings that announce to the returned
/// receiver (answering 200).
async fn alice_notified(app: &TestApp) -> (MockServer, tributary::config::Settings) {
    mount_cursor_pages(
        &app.api,
        vec![(Value::Array(items("k", "alice", 0..2)), None)],
    )
    .await;
    let receiver = MockServer::start().await;
    answer(&receiver, 200).await;
    let settings = app
        .settings(&format!(
            "{}{}",
            cursor_provider("acme", &app.api.uri(), &["alice"]),
            notify_table(&receiver, "")
        ))
        .await;
    (receiver, settings)
}

/// Delivers every outbox row to `receiver`, then what it got, as [`events_received`].
async fn delivered(
    app: &TestApp,
    settings: &tributary::config::Settings,
    receiver: &MockServer,
) -> (Vec<Value>, Vec<String>) {
    deliver_until(
        app,
        &notifier(app, settings),
        Duration::from_secs(20),
        all_settled,
    )
    .await;
    events_received(receiver).await
}

fn names(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|body| body["event"].as_str().unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn a_receiver_hears_each_connection_transition_once_signed_and_without_secrets() {
    let app = spawn_app().await;
    // Two runs meet the revoked token, each asking for a refresh once.
    mount_token_endpoint(&app, 2).await;
    mount_listing(&app, 2).await;
    let receiver = MockServer::start().await;
    answer(&receiver, 204).await;
    let providers = format!(
        "{}{}",
        acme(&app),
        notify_table(&receiver, "poll_interval = \"50ms\"")
    );
    let served = Served::start_with_env(
        &app,
        &providers,
        &[("TEST_ACME_SECRET", CLIENT_SECRET), (SECRET_ENV, SECRET)],
        crate::connect::with_connect(RETURN_URL),
    )
    .await;
    let admin = served.create_key("admin", &["admin"]);

    // Connected; its first sync meets a 401 and the refresh is refused with invalid_grant.
    let body = json!({"user_id": "u1", "providers": ["acme"], "return_url": RETURN_URL});
    let (status, location, page) = connect_with(&served, &admin, &body, "code-first").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{page}");
    assert_eq!(location, format!("{RETURN_URL}?outcome=connected"));
    let id = connections_of(&app, "u1").await[0].id;
    let failed_runs = |count: usize| {
        let app = &app;
        move || async move {
            let runs = runs_of(app, "u1").await;
            runs.iter()
                .filter(|run| run.status == RunStatus::Failed)
                .count()
                == count
        }
    };
    eventually(Duration::from_secs(30), "a failed run", failed_runs(1)).await;

    // A second run fails the same way: the connection was already marked, so no event.
    queue_manual_job(&app, id).await;
    eventually(
        Duration::from_secs(30),
        "a second failed run",
        failed_runs(2),
    )
    .await;

    // A reconnect, whose queued sync then succeeds.
    let body =
        json!({"user_id": "u1", "providers": ["acme"], "return_url": RETURN_URL, "reconnect": id});
    let (status, location, page) = connect_with(&served, &admin, &body, "code-again").await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{page}");
    assert_eq!(location, format!("{RETURN_URL}?outcome=connected"));
    eventually(Duration::from_secs(30), "a run that syncs", || async {
        runs_of(&app, "u1")
            .await
            .iter()
            .any(|run| run.status == RunStatus::Succeeded)
    })
    .await;

    // Four events and the successful run's notification, all delivered by the daemon.
    eventually(
        Duration::from_secs(30),
        "every delivery delivered",
        || async {
            let rows = deliveries(&app).await;
            rows.len() == 5 && rows.iter().all(|d| d.status == DeliveryStatus::Delivered)
        },
    )
    .await;
    let (events, raw) = events_received(&receiver).await;
    assert_eq!(
        names(&events),
        vec![
            "connection.created",
            "connection.authorization_failed",
            "connection.reconnected",
            "connection.recovered",
        ],
        "{events:#?}"
    );
    assert_eq!(raw.len(), 5, "{raw:#?}");
    let rows = deliveries(&app).await;
    for body in &events {
        assert_eq!(body["connection_id"], id, "{body}");
        assert_eq!(body["user_id"], "u1", "{body}");
        assert_eq!(body["provider"], "acme", "{body}");
        assert!(body["at"].is_string(), "{body}");
        let row = rows
            .iter()
            .find(|row| body["delivery_id"] == row.delivery_id.as_str())
            .expect("the event's row");
        assert_eq!(row.run_id, None);
        assert_eq!(body["event"], row.event.to_string());
    }
    for secret in [
        FIRST_ACCESS,
        FIRST_REFRESH,
        AGAIN_ACCESS,
        AGAIN_REFRESH,
        CLIENT_SECRET,
        SECRET,
    ] {
        assert!(
            raw.iter().all(|body| !body.contains(secret)),
            "{secret} in {raw:#?}"
        );
    }

    // `tributary notifications` lists them by event.
    let listed = run(tributary(&served.config).arg("notifications"));
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    for event in names(&events) {
        assert!(listed.stdout.contains(event), "{}", listed.stdout);
    }
    let listed = run(tributary(&served.config).args(["notifications", "--json"]));
    let shown: Vec<Value> = serde_json::from_str(&listed.stdout).expect("JSON");
    let shown_events: Vec<&str> = shown
        .iter()
        .rev()
        .map(|row| row["event"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        shown_events,
        vec![
            "connection.created",
            "connection.authorization_failed",
            "connection.reconnected",
            "connection.recovered",
            "run",
        ]
    );
}

#[tokio::test]
async fn a_run_that_succeeds_after_a_revoked_authorization_announces_the_recovery_once() {
    let app = spawn_app().await;
    let (receiver, settings) = alice_notified(&app).await;
    let alice = app.alice().await;
    mark_needs_reconnect(&app, alice.id).await;

    let first = app.sync_one(&settings).await;
    assert_eq!(first.status, RunStatus::Succeeded);
    // A second success changes nothing: neither a run notification nor a second recovery.
    let second = app.sync_one(&settings).await;
    assert_eq!(second.status, RunStatus::Succeeded);
    let rows = deliveries(&app).await;
    assert_eq!(
        rows.iter()
            .map(|row| (row.event, row.run_id))
            .collect::<Vec<_>>(),
        vec![
            (DeliveryEvent::ConnectionRecovered, None),
            (DeliveryEvent::Run, Some(first.run_id)),
        ]
    );
    let (events, raw) = delivered(&app, &settings, &receiver).await;
    assert_eq!(names(&events), vec!["connection.recovered"]);
    assert_eq!(events[0]["connection_id"], alice.id);
    assert_eq!(events[0]["user_id"], "alice");
    assert!(
        raw.iter().all(|body| !body.contains("token-alice")),
        "{raw:#?}"
    );
}

#[tokio::test]
async fn without_notify_no_connection_event_is_written() {
    let app = spawn_app().await;
    mount_cursor_pages(
        &app.api,
        vec![(Value::Array(items("k", "alice", 0..1)), None)],
    )
    .await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    let alice = app.alice().await;
    mark_needs_reconnect(&app, alice.id).await;
    assert_eq!(app.sync_one(&settings).await.status, RunStatus::Succeeded);
    assert_eq!(
        connections_of(&app, "alice").await[0].needs_reconnect_since,
        None
    );
    assert_eq!(deliveries(&app).await, vec![]);
}

#[tokio::test]
async fn a_key_the_provider_refuses_with_401_is_announced_once_and_its_recovery_too() {
    let app = spawn_app().await;
    // The key is refused once (revoked, say), then works again (restored).
    wiremock::Mock::given(wiremock::matchers::method("GET"))
        .and(wiremock::matchers::path("/v1/items"))
        .respond_with(
            wiremock::ResponseTemplate::new(401).set_body_json(json!({"message": "revoked"})),
        )
        .up_to_n_times(1)
        .mount(&app.api)
        .await;
    let (receiver, settings) = alice_notified(&app).await;
    let alice = app.alice().await;

    assert_eq!(app.sync_one(&settings).await.status, RunStatus::Failed);
    // The key works again: the run that succeeds announces the recovery.
    assert_eq!(app.sync_one(&settings).await.status, RunStatus::Succeeded);
    let connection_events: Vec<DeliveryEvent> = deliveries(&app)
        .await
        .iter()
        .map(|row| row.event)
        .filter(|event| *event != DeliveryEvent::Run)
        .collect();
    assert_eq!(
        connection_events,
        vec![
            DeliveryEvent::ConnectionAuthorizationFailed,
            DeliveryEvent::ConnectionRecovered
        ]
    );
    let (events, raw) = delivered(&app, &settings, &receiver).await;
    assert_eq!(
        names(&events),
        vec!["connection.authorization_failed", "connection.recovered"]
    );
    assert!(events
        .iter()
        .all(|event| event["connection_id"] == alice.id));
    assert!(
        raw.iter().all(|body| !body.contains("token-alice")),
        "{raw:#?}"
    );
}
