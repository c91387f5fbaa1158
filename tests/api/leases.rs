//! Leases: a connection with a live run elsewhere is skipped, an expired lease is taken
//! over and the abandoned run marked `interrupted`.

use chrono::{Duration, Utc};
use sea_orm::{ActiveModelTrait, EntityTrait, Set};
use serde_json::json;
use tributary::entities::{connection, sync_run};
use tributary::pipeline::{Run, RunStatus, Trigger};
use wiremock::matchers::method;
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{cursor_provider, items, records_stream, spawn_app};

#[tokio::test]
async fn a_connection_leased_by_a_live_holder_is_skipped_and_an_expired_one_taken_over() {
    let app = spawn_app().await;
    Mock::given(method("GET"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"data": items("l", "alice", 0..2), "next_cursor": null})),
        )
        .mount(&app.api)
        .await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    let row = connection::Entity::find()
        .one(&app.db)
        .await
        .unwrap()
        .unwrap();

    // Another machine's process holds the lease and has a run going.
    let abandoned = Run::open(
        &app.db,
        &row,
        &records_stream(&row),
        Trigger::Schedule,
        None,
    )
    .await
    .unwrap()
    .id();
    let mut held: connection::ActiveModel = row.clone().into();
    held.lease_holder = Set(Some("other-host:4242:cafe".to_string()));
    held.lease_expires_at = Set(Some(Utc::now() + Duration::seconds(120)));
    held.update(&app.db).await.unwrap();

    let report = tributary::sync::sync_matching(
        &app.db,
        &settings,
        &Default::default(),
        &tributary::pipeline::RunOptions::manual(),
        &tributary::pipeline::NoProgress,
    )
    .await
    .unwrap();
    assert!(report.outcomes.is_empty());
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(report.skipped[0].holder, "other-host:4242:cafe");
    assert_eq!(app.run_row(abandoned).await.status, RunStatus::Running);
    assert!(app.records().await.is_empty());

    // The holder stops renewing: once the lease expires, the next sync takes over.
    let mut expired: connection::ActiveModel = connection::Entity::find()
        .one(&app.db)
        .await
        .unwrap()
        .unwrap()
        .into();
    expired.lease_expires_at = Set(Some(Utc::now() - Duration::seconds(1)));
    expired.update(&app.db).await.unwrap();
    let run = app.sync_one(&settings).await;
    assert_eq!(run.status, RunStatus::Succeeded);
    assert_eq!(app.records().await.len(), 2);
    let abandoned = app.run_row(abandoned).await;
    assert_eq!(abandoned.status, RunStatus::Interrupted);
    assert!(abandoned.finished_at.is_some());

    // The lease is released when the run ends.
    let row = connection::Entity::find()
        .one(&app.db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((row.lease_holder, row.lease_expires_at), (None, None));
    let running = sync_run::Entity::find()
        .all(&app.db)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.status == RunStatus::Running)
        .count();
    assert_eq!(running, 0);
}
