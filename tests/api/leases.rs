//! Leases: a connection with a live run elsewhere is skipped, an expired lease is taken
//! over and the abandoned run marked `interrupted`.

use chrono::{Duration, Utc};
use sea_orm::{ActiveModelTrait, EntityTrait, Set};
use serde_json::json;
use tributary::entities::sync_run::{RunStatus, Trigger};
use tributary::entities::{connection, sync_run};
use tributary::pipeline::Run;
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

/// Claiming one connection's lease marks that connection's abandoned runs only, by primary
/// key: filtered on user, provider and status, MariaDB walked the status index over every
/// connection's running runs and locked each, so a run of another connection ending at the
/// same moment deadlocked with it (error 1213) and failed its job. Here alice's running run
/// is held locked by an open transaction, as its closing update holds it; bob's sync, with
/// an abandoned run to mark and renewals every third of a second, must not wait for it.
#[tokio::test]
async fn a_sync_leaves_other_connections_runs_unlocked() {
    use sea_orm::{ConnectionTrait, Statement, TransactionTrait};

    if crate::helpers::backend() == crate::helpers::Backend::Sqlite {
        // One writer: an open write transaction blocks every other writer by design.
        return;
    }
    let app = spawn_app().await;
    crate::helpers::mount_cursor_listing(
        &app.api,
        "bob",
        "b",
        1,
        2,
        std::time::Duration::from_secs(1),
    )
    .await;
    let providers = format!(
        "[daemon]\nlease_ttl = \"1s\"\n{}",
        cursor_provider("acme", &app.api.uri(), &["alice", "bob"])
    );
    let settings = app.settings(&providers).await;
    let rows = connection::Entity::find().all(&app.db).await.unwrap();
    let by_user = |user: &str| rows.iter().find(|row| row.user_id == user).unwrap();
    let mut runs = Vec::new();
    for row in [by_user("alice"), by_user("bob")] {
        let run = Run::open(&app.db, row, &records_stream(row), Trigger::Schedule, None)
            .await
            .unwrap();
        runs.push(run.id());
    }

    // Many ended runs of bob's, so that the status is the selective condition and
    // MariaDB's planner walks the status index, as it did with a history behind it.
    let running = app.run_row(runs[1]).await;
    let ended: Vec<sync_run::ActiveModel> = (0..300)
        .map(|_| {
            let mut run = sync_run::ActiveModel::from(running.clone());
            run.id = sea_orm::NotSet;
            run.status = Set(RunStatus::Succeeded);
            run
        })
        .collect();
    sync_run::Entity::insert_many(ended)
        .exec(&app.db)
        .await
        .unwrap();
    let backend = app.db.get_database_backend();
    if backend == sea_orm::DatabaseBackend::MySql {
        app.db
            .execute_unprepared("ANALYZE TABLE sync_runs")
            .await
            .unwrap();
    }

    let holding = app.db.begin().await.unwrap();
    let sql = match backend {
        sea_orm::DatabaseBackend::Postgres => {
            "UPDATE sync_runs SET heartbeat_at = heartbeat_at WHERE id = $1"
        }
        _ => "UPDATE sync_runs SET heartbeat_at = heartbeat_at WHERE id = ?",
    };
    holding
        .execute_raw(Statement::from_sql_and_values(
            backend,
            sql,
            [runs[0].into()],
        ))
        .await
        .unwrap();

    let bob = tributary::sync::SyncFilter {
        user_id: Some("bob".to_string()),
        ..Default::default()
    };
    let report = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        tributary::sync::sync_matching(
            &app.db,
            &settings,
            &bob,
            &tributary::pipeline::RunOptions::manual(),
            &tributary::pipeline::NoProgress,
        ),
    )
    .await
    .expect("bob's sync waited for alice's run")
    .unwrap();
    holding.commit().await.unwrap();

    assert_eq!(report.outcomes.len(), 1);
    assert_eq!(report.outcomes[0].status, RunStatus::Succeeded);
    assert_eq!(app.run_row(runs[1]).await.status, RunStatus::Interrupted);
    assert_eq!(app.run_row(runs[0]).await.status, RunStatus::Running);
}
