//! `[retention]`: the sweep of old runs, errors, deliveries, sightings, API audit rows and
//! inbound webhooks, a batch at a time, beside a sync.

use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, NotSet, PaginatorTrait,
    QueryFilter, QueryOrder, Set, Statement,
};
use tributary::config::RetentionSettings;
use tributary::entities::connection;
use tributary::entities::notification_delivery::{self, DeliveryEvent, DeliveryStatus};
use tributary::entities::run_error::{self, Scope, Stage};
use tributary::entities::run_sighting;
use tributary::entities::sync_job::{self, JobKind, JobStatus};
use tributary::entities::sync_run::{self, RunStatus, Trigger};
use tributary::retention::{sweep, Swept};

use nix::sys::signal::Signal;

use crate::daemon::{eventually, Daemon};
use crate::helpers::{cursor_provider, items, mount_cursor_pages, spawn_app, Backend, TestApp};

const DAY: Duration = Duration::from_secs(24 * 60 * 60);

fn days_ago(days: i64) -> DateTime<Utc> {
    Utc::now() - TimeDelta::days(days)
}

/// Every retention 30 days, open errors kept, in batches of `batch_size`.
fn thirty_days(batch_size: usize) -> RetentionSettings {
    RetentionSettings {
        runs: 30 * DAY,
        resolved_errors: 30 * DAY,
        open_errors: None,
        deliveries: 30 * DAY,
        batch_size,
        ..RetentionSettings::default()
    }
}

/// Inserts a run of `user`'s `acme` connection's `stream` that started at `started_at`.
async fn run_at(
    app: &TestApp,
    user: &str,
    stream: Option<&str>,
    status: RunStatus,
    started_at: DateTime<Utc>,
) -> i64 {
    sync_run::ActiveModel {
        id: NotSet,
        user_id: Set(user.to_string()),
        provider: Set("acme".to_string()),
        stream: Set(stream.map(str::to_string)),
        trigger: Set(Trigger::Schedule),
        status: Set(status),
        started_at: Set(started_at),
        finished_at: Set((status != RunStatus::Running).then_some(started_at)),
        heartbeat_at: Set(started_at),
        ..Default::default()
    }
    .insert(&app.db)
    .await
    .expect("run inserted")
    .id
}

async fn error_of(
    app: &TestApp,
    run_id: i64,
    resolved_by: Option<i64>,
    created_at: DateTime<Utc>,
) -> i64 {
    run_error::ActiveModel {
        id: NotSet,
        run_id: Set(run_id),
        user_id: Set("alice".to_string()),
        provider: Set("acme".to_string()),
        external_id: Set(Some(format!("e{run_id}"))),
        stage: Set(Stage::Validate),
        message: Set("no id".to_string()),
        payload: Set("{}".to_string()),
        created_at: Set(created_at),
        resolved_by_run_id: Set(resolved_by),
        scope: Set(Scope::Record),
    }
    .insert(&app.db)
    .await
    .expect("error inserted")
    .id
}

async fn run_ids(app: &TestApp) -> Vec<i64> {
    sync_run::Entity::find()
        .order_by_asc(sync_run::Column::Id)
        .all(&app.db)
        .await
        .expect("runs")
        .into_iter()
        .map(|run| run.id)
        .collect()
}

async fn error_ids(app: &TestApp) -> Vec<i64> {
    run_error::Entity::find()
        .order_by_asc(run_error::Column::Id)
        .all(&app.db)
        .await
        .expect("errors")
        .into_iter()
        .map(|error| error.id)
        .collect()
}

async fn swept(app: &TestApp, settings: &RetentionSettings) -> Swept {
    sweep(&app.db, settings, Utc::now()).await.expect("swept")
}

#[tokio::test]
async fn old_runs_are_swept_but_the_last_of_every_connection_and_stream_and_running_ones_stay() {
    let app = spawn_app().await;
    let old = days_ago(40);
    let mut gone = Vec::new();
    for _ in 0..3 {
        gone.push(run_at(&app, "alice", Some("issues"), RunStatus::Succeeded, old).await);
    }
    let still_running = run_at(&app, "alice", Some("issues"), RunStatus::Running, old).await;
    gone.push(run_at(&app, "alice", Some("pulls"), RunStatus::Failed, old).await);
    gone.push(run_at(&app, "bob", None, RunStatus::Interrupted, old).await);
    // Each connection and stream's last run, however old, and a young run.
    let last_issues = run_at(&app, "alice", Some("issues"), RunStatus::Partial, old).await;
    let last_pulls = run_at(&app, "alice", Some("pulls"), RunStatus::Succeeded, old).await;
    let last_of_bob = run_at(&app, "bob", None, RunStatus::Succeeded, old).await;
    let last_of_carol = run_at(&app, "carol", Some("issues"), RunStatus::Failed, old).await;
    // A young run, and an old one its stream's young run keeps no more.
    gone.push(run_at(&app, "alice", Some("releases"), RunStatus::Succeeded, old).await);
    let young = run_at(
        &app,
        "alice",
        Some("releases"),
        RunStatus::Succeeded,
        days_ago(2),
    )
    .await;
    let swept = swept(&app, &thirty_days(1_000)).await;

    assert_eq!(swept.runs, gone.len() as u64, "{swept:?}");
    assert_eq!(
        run_ids(&app).await,
        vec![
            still_running,
            last_issues,
            last_pulls,
            last_of_bob,
            last_of_carol,
            young
        ]
    );
    assert_eq!(swept.rows(), swept.runs);
    // A second sweep finds nothing.
    assert_eq!(swept_again(&app).await.rows(), 0);
}

async fn swept_again(app: &TestApp) -> Swept {
    swept(app, &thirty_days(1_000)).await
}

#[tokio::test]
async fn resolved_errors_are_swept_open_ones_kept_with_their_runs_and_none_left_without_its_run() {
    let app = spawn_app().await;
    let old = days_ago(40);
    let failed = run_at(&app, "alice", Some("issues"), RunStatus::Partial, old).await;
    let replay = run_at(&app, "alice", Some("issues"), RunStatus::Succeeded, old).await;
    let other_failed = run_at(&app, "alice", Some("issues"), RunStatus::Partial, old).await;
    let last = run_at(
        &app,
        "alice",
        Some("issues"),
        RunStatus::Succeeded,
        days_ago(1),
    )
    .await;
    let resolved_old = error_of(&app, failed, Some(replay), old).await;
    let open_old = error_of(&app, failed, None, old).await;
    let resolved_young = error_of(&app, other_failed, Some(replay), days_ago(3)).await;

    let swept = swept(&app, &thirty_days(1_000)).await;
    assert_eq!(
        (swept.resolved_errors, swept.open_errors, swept.runs),
        (1, 0, 0)
    );
    assert_eq!(error_ids(&app).await, vec![open_old, resolved_young]);
    // The failed run keeps its open error; the replay resolved a kept error.
    assert_eq!(
        run_ids(&app).await,
        vec![failed, replay, other_failed, last]
    );
    let _ = resolved_old;

    // With a retention of their own, open errors go too, and then the runs they held.
    let mut settings = thirty_days(1_000);
    settings.open_errors = Some(20 * DAY);
    settings.resolved_errors = DAY;
    let swept = sweep(&app.db, &settings, Utc::now()).await.expect("swept");
    assert_eq!(
        (swept.resolved_errors, swept.open_errors, swept.runs),
        (1, 1, 3)
    );
    assert!(error_ids(&app).await.is_empty());
    assert_eq!(run_ids(&app).await, vec![last]);
    let dangling = run_error::Entity::find()
        .filter(run_error::Column::RunId.is_not_in(run_ids(&app).await))
        .count(&app.db)
        .await
        .expect("count");
    assert_eq!(dangling, 0);
}

async fn delivery(
    app: &TestApp,
    run_id: i64,
    status: DeliveryStatus,
    created_at: DateTime<Utc>,
    settled_at: DateTime<Utc>,
) -> i64 {
    notification_delivery::ActiveModel {
        id: NotSet,
        delivery_id: Set(format!("00000000-0000-0000-0000-{run_id:012}")),
        run_id: Set(Some(run_id)),
        user_id: Set("alice".to_string()),
        provider: Set("acme".to_string()),
        body: Set("{}".to_string()),
        status: Set(status),
        attempts: Set(1),
        last_error: Set(None),
        next_attempt_at: Set(settled_at),
        created_at: Set(created_at),
        delivered_at: Set((status == DeliveryStatus::Delivered).then_some(settled_at)),
        event: Set(DeliveryEvent::Run),
        event_key: Set(None),
    }
    .insert(&app.db)
    .await
    .expect("delivery inserted")
    .id
}

#[tokio::test]
async fn delivered_and_given_up_deliveries_are_swept_pending_ones_kept() {
    let app = spawn_app().await;
    let old = days_ago(40);
    delivery(&app, 1, DeliveryStatus::Delivered, old, old).await;
    delivery(&app, 2, DeliveryStatus::Failed, old, days_ago(39)).await;
    let pending = delivery(&app, 3, DeliveryStatus::Pending, old, old).await;
    // Given up only lately: kept for as long from then.
    let failed_lately = delivery(&app, 4, DeliveryStatus::Failed, old, days_ago(5)).await;
    let young = delivery(&app, 5, DeliveryStatus::Delivered, days_ago(1), days_ago(1)).await;

    let swept = swept(&app, &thirty_days(1_000)).await;

    assert_eq!(swept.deliveries, 2, "{swept:?}");
    let left: Vec<i64> = notification_delivery::Entity::find()
        .order_by_asc(notification_delivery::Column::Id)
        .all(&app.db)
        .await
        .expect("deliveries")
        .into_iter()
        .map(|row| row.id)
        .collect();
    assert_eq!(left, vec![pending, failed_lately, young]);
}

/// Inserts an `api_audit` row answered at `at`; returns its id.
async fn audit_at(app: &TestApp, at: DateTime<Utc>) -> i64 {
    use sea_orm::sea_query::{Alias, Query};
    let insert = Query::insert()
        .into_table(Alias::new("api_audit"))
        .columns(["key_id", "method", "path", "status", "at"].map(Alias::new))
        .values_panic([
            None::<i64>.into(),
            "POST".into(),
            "/v1/connections".into(),
            201.into(),
            at.into(),
        ])
        .to_owned();
    app.db.execute(&insert).await.expect("audit row inserted");
    audit_ids(app).await.last().copied().expect("an audit row")
}

async fn audit_ids(app: &TestApp) -> Vec<i64> {
    ids_of(app, "api_audit").await
}

/// The ids of `table`'s rows, in order.
async fn ids_of(app: &TestApp, table: &str) -> Vec<i64> {
    let backend = app.db.get_database_backend();
    app.db
        .query_all_raw(Statement::from_string(
            backend,
            format!("SELECT id FROM {table} ORDER BY id"),
        ))
        .await
        .expect(table)
        .iter()
        .map(|row| row.try_get_by_index::<i64>(0).expect("id"))
        .collect()
}

#[tokio::test]
async fn audit_rows_older_than_audit_are_swept_in_batches_and_younger_ones_kept() {
    let app = spawn_app().await;
    let first = audit_at(&app, days_ago(200)).await;
    let second = audit_at(&app, days_ago(150)).await;
    // Stamped by a clock running late: young, among old rows by id.
    let late = audit_at(&app, days_ago(1)).await;
    let third = audit_at(&app, days_ago(91)).await;
    let nearly = audit_at(&app, days_ago(89)).await;
    let new = audit_at(&app, Utc::now()).await;
    let settings = RetentionSettings {
        batch_size: 2,
        ..RetentionSettings::default()
    };
    assert_eq!(settings.audit, 90 * DAY, "the default");

    let swept = swept(&app, &settings).await;

    assert_eq!(
        (swept.audit, swept.batches, swept.largest_batch),
        (3, 2, 2),
        "{swept:?}"
    );
    assert_eq!(audit_ids(&app).await, vec![late, nearly, new]);
    assert!(first < second && third < nearly, "{first} {second} {third}");
    assert_eq!(swept.rows(), 3, "{swept:?}");
}

#[tokio::test]
async fn a_sweep_deletes_at_most_batch_size_rows_per_statement_until_all_are_gone() {
    let app = spawn_app().await;
    let old = days_ago(40);
    for _ in 0..10 {
        run_at(&app, "alice", Some("issues"), RunStatus::Succeeded, old).await;
    }
    let last = run_at(&app, "alice", Some("issues"), RunStatus::Succeeded, old).await;
    let failed = run_at(&app, "bob", Some("issues"), RunStatus::Partial, old).await;
    for _ in 0..10 {
        error_of(&app, failed, Some(last), old).await;
    }
    run_at(&app, "bob", Some("issues"), RunStatus::Succeeded, old).await;

    let swept = swept(&app, &thirty_days(3)).await;

    // 10 errors in 4 deletes, then bob's first run and alice's 10 (11 runs) in 4.
    assert_eq!((swept.resolved_errors, swept.runs), (10, 11), "{swept:?}");
    assert_eq!(swept.largest_batch, 3, "{swept:?}");
    assert_eq!(swept.batches, 8, "{swept:?}");
    assert_eq!(run_ids(&app).await.len(), 2);
}

/// Inserts a job of `connection` for the slot `slot` minutes ago, `status` since `at`
/// (finished then unless queued or running).
async fn job_at(
    app: &TestApp,
    connection: i64,
    slot: i64,
    status: JobStatus,
    at: DateTime<Utc>,
) -> i64 {
    let finished = !matches!(status, JobStatus::Queued | JobStatus::Running);
    sync_job::ActiveModel {
        connection_id: Set(connection),
        provider: Set("acme".to_string()),
        stream: Set(String::new()),
        kind: Set(JobKind::Scheduled),
        slot_at: Set(Some(Utc::now() - TimeDelta::minutes(slot))),
        status: Set(status),
        created_at: Set(at),
        started_at: Set((status != JobStatus::Queued).then_some(at)),
        finished_at: Set(finished.then_some(at)),
        ..Default::default()
    }
    .insert(&app.db)
    .await
    .expect("job")
    .id
}

#[tokio::test]
async fn finished_jobs_are_swept_at_most_batch_size_per_statement_and_unfinished_ones_stay() {
    let app = spawn_app().await;
    app.settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    let alice = connection::Entity::find()
        .one(&app.db)
        .await
        .expect("connections")
        .expect("alice's connection")
        .id;
    let old = days_ago(8);
    let waiting = job_at(&app, alice, 1, JobStatus::Queued, days_ago(9)).await;
    let mut slot = 1;
    for status in [JobStatus::Done, JobStatus::Skipped, JobStatus::Failed] {
        for _ in 0..2 {
            slot += 1;
            job_at(&app, alice, slot, status, old).await;
        }
    }
    let running = job_at(&app, alice, 100, JobStatus::Running, days_ago(9)).await;
    job_at(&app, alice, 101, JobStatus::Cancelled, old).await;
    let recent = job_at(&app, alice, 102, JobStatus::Done, days_ago(6)).await;
    let queued = job_at(&app, alice, 103, JobStatus::Queued, Utc::now()).await;
    let settings = RetentionSettings {
        batch_size: 3,
        ..RetentionSettings::default()
    };
    assert_eq!(settings.jobs, 7 * DAY, "the default");

    let swept = swept(&app, &settings).await;

    // Seven old jobs in three deletes of at most three.
    assert_eq!(
        (swept.jobs, swept.batches, swept.largest_batch, swept.rows()),
        (7, 3, 3, 7),
        "{swept:?}"
    );
    let left: Vec<i64> = sync_job::Entity::find()
        .order_by_asc(sync_job::Column::Id)
        .all(&app.db)
        .await
        .expect("jobs")
        .into_iter()
        .map(|job| job.id)
        .collect();
    assert_eq!(left, vec![waiting, running, recent, queued]);
}

#[tokio::test]
async fn the_sightings_of_a_run_that_ended_without_closing_go_and_a_running_runs_stay() {
    let app = spawn_app().await;
    let killed = run_at(
        &app,
        "alice",
        Some("issues"),
        RunStatus::Interrupted,
        days_ago(1),
    )
    .await;
    let running = run_at(
        &app,
        "alice",
        Some("issues"),
        RunStatus::Running,
        Utc::now(),
    )
    .await;
    for (run_id, count) in [(killed, 7), (running, 4)] {
        for key in 0..count {
            run_sighting::ActiveModel {
                run_id: Set(run_id),
                external_id: Set(format!("k{key}")),
            }
            .insert(&app.db)
            .await
            .expect("sighting");
        }
    }

    let swept = swept(&app, &thirty_days(3)).await;

    assert_eq!((swept.sightings, swept.largest_batch), (7, 3), "{swept:?}");
    let left: Vec<i64> = run_sighting::Entity::find()
        .all(&app.db)
        .await
        .expect("sightings")
        .into_iter()
        .map(|row| row.run_id)
        .collect();
    assert_eq!(left, vec![running; 4]);
}

/// `count` old runs of `user`'s `issues` stream, inserted by one statement (a cross join of
/// digits, which every backend reads alike), copying `template`'s instants.
async fn seed_runs(app: &TestApp, user: &str, digits: u32, template: i64) {
    let backend = app.db.get_database_backend();
    let trigger = match crate::helpers::backend() {
        Backend::Mysql => "`trigger`",
        _ => "\"trigger\"",
    };
    let ten = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
        UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
        UNION ALL SELECT 8 UNION ALL SELECT 9)";
    let from: Vec<String> = (0..digits).map(|i| format!("{ten} d{i}")).collect();
    let template = sync_run::Entity::find_by_id(template)
        .one(&app.db)
        .await
        .expect("template")
        .expect("template row");
    let sql = format!(
        "INSERT INTO sync_runs (user_id, provider, stream, {trigger}, status, started_at, \
         finished_at, heartbeat_at) SELECT '{user}', 'acme', 'issues', 'schedule', \
         'succeeded', t.started_at, t.finished_at, t.heartbeat_at FROM sync_runs t, {} \
         WHERE t.id = {}",
        from.join(", "),
        template.id
    );
    app.db
        .execute_raw(Statement::from_string(backend, sql))
        .await
        .expect("seeded");
}

#[tokio::test]
async fn a_sync_commits_its_page_while_a_sweep_of_a_large_history_goes_on() {
    let app = spawn_app().await;
    let template = run_at(
        &app,
        "zed",
        Some("issues"),
        RunStatus::Succeeded,
        days_ago(40),
    )
    .await;
    seed_runs(&app, "zed", 5, template).await;
    if crate::helpers::backend() == Backend::Postgres {
        // As autovacuum does after a load, so the planner knows the table's size.
        app.execute("ANALYZE sync_runs").await;
    }
    let before = sync_run::Entity::find()
        .count(&app.db)
        .await
        .expect("count");
    assert_eq!(before, 100_001);
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    mount_cursor_pages(
        &app.api,
        vec![(serde_json::Value::Array(items("k", "alice", 0..5)), None)],
    )
    .await;

    let db = app.db.clone();
    let sweeping = tokio::spawn(async move {
        sweep(&db, &thirty_days(1_000), Utc::now())
            .await
            .expect("swept")
    });
    // Wait until the sweep is deleting.
    let deadline = Instant::now() + Duration::from_secs(60);
    while sync_run::Entity::find()
        .count(&app.db)
        .await
        .expect("count")
        == before
    {
        assert!(Instant::now() < deadline, "the sweep deleted nothing");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let started = Instant::now();
    let outcome = app.sync_one(&settings).await;
    let took = started.elapsed();
    let sweep_went_on = !sweeping.is_finished();

    assert_eq!(outcome.counts.inserted, 5, "{outcome:?}");
    assert!(took < Duration::from_secs(5), "the sync took {took:?}");
    assert!(
        sweep_went_on,
        "the sweep ended before the sync did, so this proved nothing"
    );
    let swept = sweeping.await.expect("sweep task");
    assert_eq!(swept.runs, 100_000, "{swept:?}");
    assert!(swept.largest_batch <= 1_000);
    assert_eq!(app.records().await.len(), 5);
}

#[tokio::test]
async fn the_daemon_sweeps_on_its_schedule_and_logs_what_it_deleted() {
    let app = spawn_app().await;
    for _ in 0..3 {
        run_at(
            &app,
            "zed",
            Some("issues"),
            RunStatus::Succeeded,
            days_ago(100),
        )
        .await;
    }
    let old_audit = audit_at(&app, days_ago(100)).await;
    let new_audit = audit_at(&app, Utc::now()).await;
    let config = app.write_config(&format!(
        "[retention]\nsweep_schedule = \"* * * * * *\"\n{}",
        cursor_provider("acme", &app.api.uri(), &["alice"])
    ));
    let mut daemon = Daemon::start_with(
        &config,
        app.dir.path().join("daemon.log"),
        &["--log", "info"],
        &[],
    );

    eventually(Duration::from_secs(30), "the sweep", || async {
        run_ids(&app).await.len() == 1
    })
    .await;
    eventually(Duration::from_secs(10), "the sweep's log line", || async {
        daemon
            .log()
            .contains("Retention sweep deleted old history.")
    })
    .await;
    assert!(daemon.log().contains("runs=2"), "{}", daemon.log());
    assert!(daemon.log().contains("audit=1"), "{}", daemon.log());
    assert_eq!(audit_ids(&app).await, vec![new_audit]);
    assert!(old_audit < new_audit);
    daemon.signal(Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0, "{}", daemon.log());
}

/// Inserts an inbound webhook delivery in `status` received at `received_at`; returns
/// its id.
pub(crate) async fn webhook_at(app: &TestApp, status: &str, received_at: DateTime<Utc>) -> i64 {
    use sea_orm::sea_query::{Alias, Query};
    let columns = [
        "provider",
        "delivery_id",
        "received_at",
        "body",
        "status",
        "attempts",
        "next_attempt_at",
    ];
    let insert = Query::insert()
        .into_table(Alias::new("webhook_deliveries"))
        .columns(columns.map(Alias::new))
        .values_panic([
            "gh".into(),
            format!("{status}-{}", received_at.timestamp_micros()).into(),
            received_at.into(),
            "{}".into(),
            status.into(),
            0.into(),
            received_at.into(),
        ])
        .to_owned();
    app.db.execute(&insert).await.expect("delivery inserted");
    webhook_ids(app).await.last().copied().expect("a delivery")
}

async fn webhook_ids(app: &TestApp) -> Vec<i64> {
    ids_of(app, "webhook_deliveries").await
}

#[tokio::test]
async fn applied_and_unmatched_webhooks_older_than_the_retention_are_swept_received_and_failed_kept(
) {
    let app = spawn_app().await;
    let applied_old = webhook_at(&app, "applied", days_ago(10)).await;
    let received_old = webhook_at(&app, "received", days_ago(30)).await;
    let failed_old = webhook_at(&app, "failed", days_ago(30)).await;
    let unmatched_old = webhook_at(&app, "unmatched", days_ago(8)).await;
    let applied_young = webhook_at(&app, "applied", days_ago(6)).await;
    let unmatched_new = webhook_at(&app, "unmatched", Utc::now()).await;
    let settings = RetentionSettings {
        batch_size: 1,
        ..RetentionSettings::default()
    };
    assert_eq!(settings.webhooks, 7 * DAY, "the default");

    let swept = swept(&app, &settings).await;

    assert_eq!(
        (swept.webhooks, swept.largest_batch, swept.rows()),
        (2, 1, 2),
        "{swept:?}"
    );
    let left = webhook_ids(&app).await;
    assert_eq!(
        left,
        vec![received_old, failed_old, applied_young, unmatched_new]
    );
    assert!(applied_old < unmatched_old);
}
