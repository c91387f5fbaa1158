//! What a run costs the database in transactions, on PostgreSQL: the job queue's
//! capacity at scale is bounded by them (docs/performance.md, "The job queue at scale"),
//! as `sync_matching` makes it and as a daemon's job makes it.
//! Counted from `pg_stat_database`, whose counts a backend flushes when asked
//! (`pg_stat_force_next_flush()`, PostgreSQL 15) or as it exits. On the other backends the
//! test does nothing.

use std::time::Duration;

use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, EntityTrait, QueryFilter, Statement,
};
use tributary::config::DatabaseSettings;
use tributary::db::DatabasePools;
use tributary::entities::sync_job::{self, JobStatus};
use tributary::entities::sync_run::RunStatus;
use tributary::pipeline::{NoProgress, RunOptions};
use tributary::sync::{sync_matching, SyncFilter};
use wiremock::matchers::{method, path};
use wiremock::{Mock, ResponseTemplate};

use crate::daemon::{daemon_table, Daemon};
use crate::helpers::{backend, cursor_provider, items, spawn_app, Backend, TestApp};
use crate::queue::queue_slot_job;

/// The transactions of a one-page run of one connection whose stream ran before, as
/// `sync_matching` makes it on a connection that prepared its statements already: its
/// reads before the run (the key index, the connections not configured, those to sync),
/// the lease's claim (its generation returned by the claim itself) with the check for
/// runs its holder abandoned, the stream's state and the run's row in its transaction,
/// the page's unchanged records, the page, the close and the lease's release (a run that
/// notes no sightings reads no unfinished run's).
const MAX_TRANSACTIONS: i64 = 8;

#[tokio::test]
async fn a_one_page_run_of_one_connection_makes_at_most_its_transactions() {
    if backend() != Backend::Postgres {
        return;
    }
    at_most(MAX_TRANSACTIONS, "a one-page run", transactions_of_one_run).await;
}

/// Takes `measure` up to three times, each on a fresh database, until it is within
/// `bound`, and fails naming `what` if it never is: an autovacuum worker visiting the
/// database meanwhile adds transactions of its own.
async fn at_most<T, F, Fut>(bound: T, what: &str, mut measure: F)
where
    T: PartialOrd + std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let mut counts = Vec::new();
    for _ in 0..3 {
        let count = measure().await;
        if count <= bound {
            return;
        }
        counts.push(count);
    }
    panic!("{what} made {counts:?} transactions, over {bound:?}");
}

/// What counts a test's transactions: a connection to the server's `postgres` database,
/// the name of the app's, and a pool of one connection to it, opened once the setup's
/// pool is closed (its counts are flushed as its connections close). One connection: the
/// counts it holds are flushed on request.
async fn counting(app: &TestApp) -> (DatabaseConnection, String, DatabasePools) {
    let (server, name) = app
        .database_url
        .rsplit_once('/')
        .expect("a database URL with a name");
    let admin = sea_orm::Database::connect(format!("{server}/postgres"))
        .await
        .expect("the server's postgres database");
    app.db
        .main()
        .close_by_ref()
        .await
        .expect("setup pool closed");
    let db = tributary::db::connect(&DatabaseSettings {
        url: app.database_url.clone(),
        max_connections: 1,
    })
    .await
    .expect("pool")
    .with_keyring(app.keyring());
    (admin, name.to_string(), db)
}

async fn transactions_of_one_run() -> i64 {
    let app = spawn_app().await;
    // The first run stores two records, the second finds them changed.
    for version in [1, 2] {
        let mut data = items("alice_", "alice", 0..2);
        for item in &mut data {
            item["version"] = version.into();
        }
        Mock::given(method("GET"))
            .and(path("/v1/items"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(serde_json::json!({"data": data, "next_cursor": null})),
            )
            .up_to_n_times(1)
            .mount(&app.api)
            .await;
    }
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    // Its prepared statements are those of a daemon that ran before, as in a fleet.
    let (admin, name, db) = counting(&app).await;
    let name = name.as_str();
    let sync = || async {
        let outcomes = sync_matching(
            &db,
            &settings,
            &SyncFilter::default(),
            &RunOptions::manual(),
            &NoProgress,
        )
        .await
        .expect("runs recorded")
        .outcomes;
        assert_eq!(outcomes.len(), 1, "{outcomes:?}");
        assert_eq!(outcomes[0].status, RunStatus::Succeeded, "{outcomes:?}");
        outcomes[0].counts
    };
    assert_eq!(sync().await.inserted, 2);
    let before = settled_count(&db, &admin, name).await;
    assert_eq!(sync().await.updated, 2);
    let after = settled_count(&db, &admin, name).await;
    db.close().await.expect("pool closed");
    // Less the flush asked for after the run.
    after - before - 1
}

/// The database's committed and rolled back transactions, `db`'s counts flushed (a
/// transaction of its own, counted) and the other backends gone (a backend leaves
/// `pg_stat_activity` just before it flushes its counts, so the count must hold still).
async fn settled_count(db: &DatabaseConnection, admin: &DatabaseConnection, name: &str) -> i64 {
    db.execute_unprepared("SELECT pg_stat_force_next_flush()")
        .await
        .expect("counts flushed");
    let query = |sql: &str| {
        Statement::from_sql_and_values(admin.get_database_backend(), sql, [name.into()])
    };
    let mut last = None;
    for _ in 0..100 {
        let connected: i64 = admin
            .query_one_raw(query(
                "SELECT count(*)::bigint AS n FROM pg_stat_activity WHERE datname = $1",
            ))
            .await
            .expect("pg_stat_activity")
            .and_then(|row| row.try_get("", "n").ok())
            .unwrap_or(-1);
        let count: i64 = admin
            .query_one_raw(query(
                "SELECT (xact_commit + xact_rollback)::bigint AS n FROM pg_stat_database \
                 WHERE datname = $1",
            ))
            .await
            .expect("pg_stat_database")
            .and_then(|row| row.try_get("", "n").ok())
            .unwrap_or(-1);
        if connected == 1 && last == Some(count) {
            return count;
        }
        last = (connected == 1).then_some(count);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the database's connections did not close");
}

/// The transactions of a daemon's scheduled job of one connection whose one-page stream
/// ran before and finds its records unchanged, claimed one at a time as at scale (a run
/// ends, the next job is claimed): the claim, the lease's claim with the run's row, the
/// page's lookup, and the run's close with the job's end and the lease's release. The
/// daemon's own polls and ticks add a few a second, which the count of an idle daemon
/// over the same time takes away; the bound leaves one for that estimate's error.
const MAX_JOB_TRANSACTIONS: f64 = 5.0;

/// Jobs the daemon runs in the measured window.
const JOBS: usize = 20;

#[tokio::test]
async fn a_scheduled_one_page_job_of_a_daemon_makes_at_most_its_transactions() {
    if backend() != Backend::Postgres {
        return;
    }
    at_most(
        MAX_JOB_TRANSACTIONS,
        "a daemon's one-page job",
        transactions_of_a_job,
    )
    .await;
}

/// The daemon's transactions per job: those of a daemon that runs `JOBS` jobs, less those
/// of one that runs none for as long (after them), over `JOBS`.
async fn transactions_of_a_job() -> f64 {
    let app = spawn_app().await;
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .respond_with(ResponseTemplate::new(200).set_body_json(
            serde_json::json!({"data": items("same_", "anyone", 0..1), "next_cursor": null}),
        ))
        .mount(&app.api)
        .await;
    let users: Vec<String> = (0..JOBS).map(|i| format!("user{i:02}")).collect();
    let users: Vec<&str> = users.iter().map(String::as_str).collect();
    // Synced once a year, one connection at a time: only the jobs queued here run, each
    // claimed as the one before ends.
    let providers = cursor_provider("acme", &app.api.uri(), &users)
        .replace(
            "schedule = \"0 */15 * * * *\"",
            "schedule = \"0 0 0 1 1 *\"",
        )
        .replacen(
            "kind = \"rest\"\n",
            "kind = \"rest\"\nmax_concurrent_connections = 1\n",
            1,
        );
    let config = app.write_config(&format!("{}{providers}", daemon_table(None)));
    let settings = app.settings(&providers).await;
    // Every stream runs once before: the measured runs are steady ones.
    let first = sync_matching(
        &app.db,
        &settings,
        &SyncFilter::default(),
        &RunOptions::manual(),
        &NoProgress,
    )
    .await
    .expect("runs recorded");
    assert_eq!(first.outcomes.len(), JOBS, "{:?}", first.outcomes);
    let slot = chrono::Utc::now() - chrono::Duration::minutes(1);
    for connection in tributary::entities::connection::Entity::find()
        .all(&app.db)
        .await
        .expect("connections")
    {
        queue_slot_job(&app, connection.id, slot).await;
    }
    let (admin, name, db) = counting(&app).await;
    let busy = daemon_transactions(&app, &config, &db, &admin, &name).await;
    let done = sync_job::Entity::find()
        .filter(sync_job::Column::Status.eq(JobStatus::Done))
        .all(&db)
        .await
        .expect("jobs");
    assert_eq!(
        done.len(),
        JOBS,
        "every job done within the window: {done:?}"
    );
    let idle = daemon_transactions(&app, &config, &db, &admin, &name).await;
    db.close().await.expect("pool closed");
    let jobs = i32::try_from(JOBS).expect("a few jobs");
    (busy - idle) as f64 / f64::from(jobs)
}

/// The transactions of a daemon started on `config` and stopped after a fixed time.
async fn daemon_transactions(
    app: &TestApp,
    config: &std::path::Path,
    db: &DatabaseConnection,
    admin: &DatabaseConnection,
    name: &str,
) -> i64 {
    let before = settled_count(db, admin, name).await;
    let mut daemon = Daemon::start(config, app.dir.path().join("daemon.log"));
    tokio::time::sleep(Duration::from_secs(10)).await;
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0, "{}", daemon.log());
    settled_count(db, admin, name).await - before
}
