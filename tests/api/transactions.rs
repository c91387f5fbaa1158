//! What a run costs the database in transactions, on PostgreSQL: the job queue's
//! capacity at scale is bounded by them (docs/performance.md, "The job queue at scale").
//! Counted from `pg_stat_database`, whose counts a backend flushes when asked
//! (`pg_stat_force_next_flush()`, PostgreSQL 15) or as it exits. On the other backends the
//! test does nothing.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, Statement};
use tributary::config::DatabaseSettings;
use tributary::pipeline::{NoProgress, RunOptions, RunStatus};
use tributary::sync::{sync_matching, SyncFilter};
use wiremock::matchers::{method, path};
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{backend, cursor_provider, items, spawn_app, Backend};

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
    // An autovacuum worker visiting the database meanwhile adds transactions of its own:
    // a count over the bound is taken again, on a fresh database, before it fails.
    let mut counts = Vec::new();
    for _ in 0..3 {
        let count = transactions_of_one_run().await;
        if count <= MAX_TRANSACTIONS {
            return;
        }
        counts.push(count);
    }
    panic!("a one-page run made {counts:?} transactions, over {MAX_TRANSACTIONS}");
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
    let (server, name) = app
        .database_url
        .rsplit_once('/')
        .expect("a database URL with a name");
    let admin = sea_orm::Database::connect(format!("{server}/postgres"))
        .await
        .expect("the server's postgres database");
    // The setup's counts are flushed as its connections close.
    app.db
        .main()
        .close_by_ref()
        .await
        .expect("setup pool closed");
    // One connection: the counts it holds are flushed on request, and its prepared
    // statements are those of a daemon that ran before, as in a fleet.
    let db = tributary::db::connect(&DatabaseSettings {
        url: app.database_url.clone(),
        max_connections: 1,
    })
    .await
    .expect("pool")
    .with_keyring(app.keyring());
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
