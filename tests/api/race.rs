//! Run twice, insert once, under races: eight writers of one connection at the same time
//! end with each record stored once, and a key that another writer inserted between our
//! lookup and our insert counts as a duplicate skip, never an error or a second row.
//!
//! Three tests, because leases make the races hard to reach on purpose:
//!
//! - In one process, eight `pipeline::sync_connection` calls (the lower-level step, which
//!   takes no lease) on one connection.
//! - Eight `tributary sync` processes on one connection. Leases let exactly one run; the
//!   seven others report the connection skipped and exit 0. This proves the lease, not the
//!   backstop: through the CLI, two processes can never write one key at the same time,
//!   because a key belongs to one connection and a connection to one lease holder.
//! - So the backstop across processes is raced the only way the real world can: a lease-free
//!   writer in another process (here the test process, standing in for a holder that stalled
//!   past its lease and woke up mid-page) writes the same keys while a `tributary sync`
//!   process holds the lease.
//!
//! On PostgreSQL and MySQL an insert gate makes the races certain rather than likely: every
//! insert into `records` waits while reads go on. A page's transaction first locks its
//! connection's row (its lookup does), so the first writer waits at the gate holding it and
//! the others wait for it; the gate opens once all of them are waiting. On PostgreSQL each
//! waiting lookup reads what was committed when it began, before the first writer's page,
//! so all but one writer of page 1 must be turned away by the unique index. SQLite has one
//! writer at a time, and on MySQL a transaction reads what was committed when its first
//! read ran, after its wait for the row: on both, every writer after the first finds the
//! rows by lookup (unchanged), and the backstop is never reached (see the tests' comments
//! for what is asserted instead).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::future::join_all;
use sea_orm::ActiveValue::{NotSet, Set};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseTransaction, EntityTrait, PaginatorTrait, QueryFilter,
    TransactionTrait,
};
use serde_json::json;
use tributary::config::DatabaseSettings;
use tributary::entities::sync_run::RunStatus;
use tributary::entities::{connection, connection_stream, sync_run};
use tributary::pipeline::{sync_connection, NoProgress, RunCounts, RunOptions};
use wiremock::matchers::{method, path};
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{
    backend, cursor_provider, items, mount_cursor_listing, spawn_app, Backend, TestApp,
    LOCK_WAITS_POLL,
};
use crate::scripted::{Reply, ScriptedApi};

const PAGES: usize = 5;
const PER_PAGE: usize = 20;
const LISTING: usize = PAGES * PER_PAGE;
const WRITERS: usize = 8;

/// A pool of the writers' own, with room for all their page transactions at once (SQLite
/// still gets its one connection).
async fn writer_pool(app: &TestApp) -> tributary::db::DatabasePools {
    tributary::db::connect(&DatabaseSettings {
        url: app.database_url.clone(),
        max_connections: WRITERS as u32 + 2,
    })
    .await
    .expect("writer pool")
    .with_keyring(app.keyring())
}

/// Holds back every insert into `records` while reads go on: a SHARE lock on the table on
/// PostgreSQL, and on MySQL a locking read of the (empty) table, which locks the gap every
/// new row goes into. `None` on SQLite. The writers stopped by it, and those waiting for
/// the connection's row the first of them holds, are counted by [`TestApp::lock_waits`].
struct InsertGate(Option<DatabaseTransaction>);

impl InsertGate {
    async fn close(app: &TestApp) -> InsertGate {
        let sql = match backend() {
            Backend::Sqlite => return InsertGate(None),
            Backend::Postgres => "LOCK TABLE records IN SHARE MODE",
            Backend::Mysql => "SELECT id FROM records FOR UPDATE",
        };
        let txn = app.db.begin().await.expect("gate transaction");
        txn.execute_unprepared(sql).await.expect("gate closed");
        InsertGate(Some(txn))
    }

    /// Opens the gate once `writers` inserts are waiting at it (at once on SQLite).
    async fn open_when_waiting(self, app: &TestApp, writers: usize) {
        let Some(txn) = self.0 else { return };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let waiting = app.lock_waits().await;
            if waiting >= writers as i64 {
                break;
            }
            if Instant::now() >= deadline {
                panic!(
                    "only {waiting} of {writers} writers reached the insert gate; sessions:\n{}",
                    app.sessions().await
                );
            }
            tokio::time::sleep(LOCK_WAITS_POLL).await;
        }
        txn.commit().await.expect("gate opened");
    }
}

/// The listing is stored exactly once, with the content served.
async fn assert_listing_stored_once(app: &TestApp) {
    let records = app.records().await;
    let expected = {
        let mut all = items("k", "alice", 0..LISTING);
        all.sort_by_key(|item| item["id"].as_str().unwrap().to_string());
        all
    };
    assert_eq!(records.len(), LISTING, "one row per key, no more, no fewer");
    for (record, item) in records.iter().zip(&expected) {
        assert_eq!(
            (
                record.user_id.as_str(),
                record.provider.as_str(),
                record.external_id.as_str()
            ),
            ("alice", "acme", item["id"].as_str().unwrap())
        );
        assert_eq!(record.payload, item.to_string());
    }
}

/// The totals of racing runs that fetched `fetched` records in all: each key inserted by
/// exactly one of them, every other sighting a duplicate skip or an unchanged lookup,
/// nothing failed or rewritten. Returns the duplicate skips.
fn assert_raced_totals(counts: &[RunCounts], fetched: u64) -> u64 {
    let sum = |field: fn(&RunCounts) -> u64| counts.iter().map(field).sum::<u64>();
    assert_eq!(sum(|c| c.inserted), LISTING as u64, "{counts:?}");
    assert_eq!(
        sum(|c| c.inserted) + sum(|c| c.duplicate) + sum(|c| c.unchanged),
        fetched,
        "every record of every run is inserted, skipped as a duplicate or unchanged: {counts:?}"
    );
    assert_eq!(sum(|c| c.fetched), fetched, "{counts:?}");
    assert_eq!(
        sum(|c| c.failed),
        0,
        "a conflict is never an error: {counts:?}"
    );
    assert_eq!(sum(|c| c.updated), 0, "{counts:?}");
    sum(|c| c.duplicate)
}

/// Every run row matches its outcome's counters and ended succeeded.
async fn assert_run_rows(app: &TestApp, expected: &[(i64, RunCounts)]) {
    for (run_id, counts) in expected {
        let row = app.run_row(*run_id).await;
        assert_eq!(row.status, RunStatus::Succeeded, "{row:?}");
        assert_eq!(
            (
                row.records_inserted,
                row.records_duplicate,
                row.records_unchanged,
                row.records_failed
            ),
            (
                counts.inserted as i64,
                counts.duplicate as i64,
                counts.unchanged as i64,
                0
            ),
            "{row:?}"
        );
    }
}

async fn alice(app: &TestApp) -> connection::Model {
    connection::Entity::find()
        .one(&app.db)
        .await
        .unwrap()
        .expect("alice's connection")
}

/// Runs `n` lease-free `sync_connection` calls of alice's `connection` at once. Each
/// resumes from the checkpoint `connection` holds, as read before any of the racing
/// writers committed: from the first page.
async fn race_in_process(
    app: &TestApp,
    settings: &tributary::config::Settings,
    connection: &connection::Model,
    n: usize,
) -> Vec<tributary::pipeline::RunOutcome> {
    let provider_settings = &settings.providers["acme"];
    let provider = tributary::sync::build(provider_settings).expect("provider");
    let pool = writer_pool(app).await;
    // The stream's row first: creating it checks the connection's row, which on MySQL
    // waits for a page that locked it. A run holding the lease never has such a page
    // beside it; these lease-free runs would.
    let now = chrono::Utc::now();
    let opened = connection_stream::Entity::find()
        .filter(connection_stream::Column::ConnectionId.eq(connection.id))
        .one(&app.db)
        .await
        .expect("the stream's row read");
    if opened.is_none() {
        connection_stream::Entity::insert(connection_stream::ActiveModel {
            id: NotSet,
            connection_id: Set(connection.id),
            stream: Set("records".to_string()),
            cursor: Set(None),
            checkpoint: Set(None),
            last_success_run_id: Set(None),
            last_success_at: Set(None),
            full_passes_owed: Set(0),
            paused_at: Set(None),
            created_at: Set(now),
            updated_at: Set(now),
        })
        .exec(&app.db)
        .await
        .expect("the stream's row");
    }
    let runs = (0..n).map(|_| {
        sync_connection(
            &pool,
            provider.as_ref(),
            provider_settings,
            connection,
            RunOptions::manual(),
            &NoProgress,
        )
    });
    join_all(runs)
        .await
        .into_iter()
        .map(|outcome| outcome.expect("run recorded"))
        .collect()
}

#[tokio::test]
async fn eight_concurrent_runs_of_one_connection_store_each_record_once() {
    let app = spawn_app().await;
    mount_cursor_listing(
        &app.api,
        "alice",
        "k",
        PAGES,
        PER_PAGE,
        Duration::from_millis(40),
    )
    .await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;

    let connection = alice(&app).await;
    let gate = InsertGate::close(&app).await;
    let (outcomes, ()) = tokio::join!(
        race_in_process(&app, &settings, &connection, WRITERS),
        gate.open_when_waiting(&app, WRITERS)
    );

    for outcome in &outcomes {
        assert_eq!(outcome.status, RunStatus::Succeeded, "{outcome:?}");
        assert_eq!(outcome.counts.pages_fetched, PAGES as u64);
    }
    let counts: Vec<RunCounts> = outcomes.iter().map(|o| o.counts).collect();
    let duplicates = assert_raced_totals(&counts, (counts.len() * LISTING) as u64);
    match backend() {
        // The gate held every insert until all eight lookups of page 1 had begun, and each
        // read what was committed then: one writer inserted page 1, and the unique index
        // turned the seven others away.
        Backend::Postgres => assert!(
            duplicates >= ((WRITERS - 1) * PER_PAGE) as u64,
            "page 1 alone makes {} duplicate skips: {counts:?}",
            (WRITERS - 1) * PER_PAGE
        ),
        // SQLite: one pooled connection per process, so the page transactions (lookup and
        // insert together) run one after the other. MySQL: the page transactions take
        // turns at the connection's row, and each reads what committed before it got the
        // row. Either way every writer after the first finds the rows by lookup, and the
        // unique index is never reached.
        Backend::Sqlite | Backend::Mysql => assert_eq!(duplicates, 0, "{counts:?}"),
    }
    let runs: Vec<(i64, RunCounts)> = outcomes.iter().map(|o| (o.run_id, o.counts)).collect();
    assert_run_rows(&app, &runs).await;
    assert_listing_stored_once(&app).await;
    assert_one_change_per_record(&app).await;
}

/// The feed holds one `inserted` change per record, from the run that inserted it: the
/// keys the unique index turned away left none.
async fn assert_one_change_per_record(app: &TestApp) {
    use tributary::entities::change::ChangeKind;
    use tributary::pipeline::changes::Cursor;
    let (feed, _) = crate::helpers::read_feed(&app.db, Cursor::START, 10_000).await;
    let mut changes: Vec<(String, i64)> = feed
        .iter()
        .inspect(|change| assert_eq!(change.kind, ChangeKind::Inserted))
        .map(|change| (change.external_id.clone(), change.run_id))
        .collect();
    changes.sort();
    let records: Vec<(String, i64)> = app
        .records()
        .await
        .into_iter()
        .map(|record| (record.external_id, record.first_seen_run_id))
        .collect();
    assert_eq!(changes, records);
}

/// `tributary --config CONFIG sync ARGS` with a clean environment, output captured.
fn sync_process(config: &std::path::Path, args: &[&str]) -> Child {
    Command::new(assert_cmd::cargo::cargo_bin("tributary"))
        .arg("--config")
        .arg(config)
        .arg("sync")
        .args(args)
        .env_remove("TRIBUTARY_DATABASE_URL")
        .env_remove("TRIBUTARY_CONFIG")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tributary starts")
}

struct Finished {
    code: i32,
    stdout: String,
    stderr: String,
}

fn finish(child: Child) -> Finished {
    let output = child.wait_with_output().expect("tributary ran");
    Finished {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Alice's listing on a scripted API whose answers wait until `open` is set.
fn gated_listing(open: tokio::sync::watch::Receiver<bool>) -> ScriptedApi {
    ScriptedApi::start(move |seen| {
        let mut open = open.clone();
        async move {
            let _ = open.wait_for(|open| *open).await;
            let page = match seen.query("cursor") {
                None => 0,
                Some(cursor) => cursor.trim_start_matches('p').parse::<usize>().unwrap(),
            };
            let start = page * PER_PAGE;
            let next = (page + 1 < PAGES).then(|| format!("p{}", page + 1));
            Reply::json(
                &json!({"data": items("k", "alice", start..start + PER_PAGE), "next_cursor": next}),
            )
        }
    })
}

#[tokio::test]
async fn eight_sync_processes_on_one_connection_run_it_once_and_skip_the_rest() {
    let app = spawn_app().await;
    let (open, gate) = tokio::sync::watch::channel(false);
    let api = gated_listing(gate);
    let config = app.write_config(&cursor_provider("acme", &api.uri(), &["alice"]));
    app.settings(&cursor_provider("acme", &api.uri(), &["alice"]))
        .await;

    // The first page is held back until seven processes have exited: whichever process
    // claimed the lease is then still running, so each of the others found it taken.
    let mut children: Vec<Option<Child>> = (0..WRITERS)
        .map(|_| Some(sync_process(&config, &["--quiet"])))
        .collect();
    let mut finished: Vec<Option<Finished>> = (0..WRITERS).map(|_| None).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for (slot, done) in children.iter_mut().zip(finished.iter_mut()) {
            let exited = slot
                .as_mut()
                .is_some_and(|child| child.try_wait().expect("wait").is_some());
            if exited {
                *done = Some(finish(slot.take().unwrap()));
            }
        }
        let exited = finished.iter().filter(|f| f.is_some()).count();
        if exited == WRITERS {
            break;
        }
        if exited == WRITERS - 1 {
            open.send_replace(true);
        }
        assert!(Instant::now() < deadline, "{exited} processes exited");
        std::thread::sleep(Duration::from_millis(20));
    }

    let finished: Vec<Finished> = finished.into_iter().map(Option::unwrap).collect();
    for process in &finished {
        assert_eq!(process.code, 0, "{}\n{}", process.stdout, process.stderr);
    }
    let ran: Vec<&Finished> = finished
        .iter()
        .filter(|p| p.stdout.contains("alice@acme succeeded"))
        .collect();
    let skipped = finished
        .iter()
        .filter(|p| {
            p.stdout
                .contains("skipped alice@acme: a run of it is already going (held by ")
        })
        .count();
    assert_eq!((ran.len(), skipped), (1, WRITERS - 1));
    assert!(
        ran[0].stdout.contains(&format!(
            "pages={PAGES} fetched={LISTING} inserted={LISTING} updated=0 unchanged=0 duplicate=0 failed=0"
        )),
        "{}",
        ran[0].stdout
    );
    let runs = sync_run::Entity::find().all(&app.db).await.unwrap();
    assert_eq!(
        runs.len(),
        1,
        "the skipped processes opened no run: {runs:?}"
    );
    assert_eq!(runs[0].status, RunStatus::Succeeded);
    assert_listing_stored_once(&app).await;
    let row = alice(&app).await;
    assert_eq!(
        (row.lease_holder, app.stream_checkpoint().await),
        (None, None)
    );
}

#[tokio::test]
async fn a_lease_free_writer_in_another_process_races_a_sync_process_on_the_same_keys() {
    let app = spawn_app().await;
    mount_cursor_listing(
        &app.api,
        "alice",
        "k",
        PAGES,
        PER_PAGE,
        Duration::from_millis(40),
    )
    .await;
    let providers = cursor_provider("acme", &app.api.uri(), &["alice"]);
    let config = app.write_config(&providers);
    let settings = app.settings(&providers).await;

    // One `tributary sync` process holds alice's lease and walks the listing, while this
    // process writes the same keys without a lease from seven runs of its own. Those stand
    // in for a holder that stalled.
    let connection = alice(&app).await;
    let gate = InsertGate::close(&app).await;
    let child = sync_process(&config, &["--json"]);
    // Its claim marks the runs it finds `running` interrupted, and a run so marked writes
    // nothing more: the lease-free runs open after the process opened its own.
    let deadline = Instant::now() + Duration::from_secs(30);
    while sync_run::Entity::find().count(&app.db).await.unwrap() == 0 {
        assert!(
            Instant::now() < deadline,
            "the sync process never opened its run"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (outcomes, ()) = tokio::join!(
        race_in_process(&app, &settings, &connection, WRITERS - 1),
        gate.open_when_waiting(&app, WRITERS)
    );
    let process = tokio::task::spawn_blocking(move || finish(child))
        .await
        .unwrap();
    assert_eq!(process.code, 0, "{}\n{}", process.stdout, process.stderr);
    let report: serde_json::Value = serde_json::from_str(&process.stdout).expect("JSON report");
    assert_eq!(report["skipped"], json!([]));
    let theirs = &report["runs"][0];
    assert_eq!(theirs["status"], "succeeded", "{report}");
    let count = |name: &str| theirs["counts"][name].as_u64().unwrap();
    let their_counts = RunCounts {
        pages_fetched: count("pages_fetched"),
        fetched: count("fetched"),
        inserted: count("inserted"),
        updated: count("updated"),
        unchanged: count("unchanged"),
        duplicate: count("duplicate"),
        parents_skipped: count("parents_skipped"),
        filtered: count("filtered"),
        failed: count("failed"),
        watermark_anomalies: count("watermark_anomalies"),
        deleted: count("deleted"),
        restored: count("restored"),
    };

    for outcome in &outcomes {
        assert_eq!(outcome.status, RunStatus::Succeeded, "{outcome:?}");
    }
    let mut counts: Vec<RunCounts> = outcomes.iter().map(|o| o.counts).collect();
    counts.push(their_counts);
    // Every run reads its stream's checkpoint when it starts: where another run
    // committed a page before that, it resumes from the page after, as any run does. So
    // each walks whole pages to the listing's end, from page 1 or from later.
    for counts in &counts {
        assert!(
            counts.fetched > 0
                && counts.fetched <= LISTING as u64
                && counts.fetched.is_multiple_of(PER_PAGE as u64),
            "{counts:?}"
        );
    }
    let fetched = counts.iter().map(|c| c.fetched).sum();
    let page_one_writers = counts
        .iter()
        .filter(|c| c.fetched == LISTING as u64)
        .count();
    let duplicates = assert_raced_totals(&counts, fetched);
    match backend() {
        // The gate held page 1 of every writer that walked it until every lookup had
        // begun, each reading what was committed then: the index turned all but one of
        // them away.
        Backend::Postgres => {
            assert!(
                duplicates >= (page_one_writers.saturating_sub(1) * PER_PAGE) as u64,
                "{counts:?}"
            )
        }
        // SQLite's single writer serialises the two processes' page transactions, each
        // taking the write lock before its lookup; on MySQL they take turns at the
        // connection's row, each reading after its turn came. So later writers find the
        // rows by lookup. What this proves here: two processes writing the same keys at
        // once neither fail on each other's locks nor store a key twice.
        Backend::Sqlite | Backend::Mysql => assert_eq!(duplicates, 0, "{counts:?}"),
    }
    let mut runs: Vec<(i64, RunCounts)> = outcomes.iter().map(|o| (o.run_id, o.counts)).collect();
    runs.push((theirs["run_id"].as_i64().unwrap(), their_counts));
    assert_run_rows(&app, &runs).await;
    assert_listing_stored_once(&app).await;
}

#[tokio::test]
async fn a_page_waiting_while_another_process_commits_is_stored_not_failed() {
    let app = spawn_app().await;
    Mock::given(method("GET"))
        .and(path("/v1/items"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(
                    json!({"data": items("k", "alice", 0..PER_PAGE), "next_cursor": null}),
                )
                .set_delay(Duration::from_millis(300)),
        )
        .mount(&app.api)
        .await;
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));
    let child = sync_process(&config, &["--json"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while sync_run::Entity::find()
        .all(&app.db)
        .await
        .unwrap()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the sync never opened its run");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Another writer (standing in for a second process syncing bob) takes the write lock on
    // SQLite, or holds inserts into `records` on the servers, and commits a record while
    // alice's page waits behind it. On SQLite a page transaction that read before it asked
    // for the lock would now be refused at once with "database is locked".
    let other = tributary::db::connect(&DatabaseSettings {
        url: app.database_url.clone(),
        max_connections: 1,
    })
    .await
    .unwrap();
    let txn = other
        .begin_with_options(sea_orm::TransactionOptions {
            sqlite_transaction_mode: Some(sea_orm::SqliteTransactionMode::Immediate),
            ..Default::default()
        })
        .await
        .unwrap();
    match backend() {
        Backend::Postgres => txn
            .execute_unprepared("LOCK TABLE records IN SHARE MODE")
            .await
            .map(drop)
            .unwrap(),
        Backend::Mysql => txn
            .execute_unprepared("SELECT id FROM records FOR UPDATE")
            .await
            .map(drop)
            .unwrap(),
        Backend::Sqlite => {}
    }
    let now = chrono::Utc::now();
    sea_orm::ActiveModelTrait::insert(
        tributary::entities::record::ActiveModel {
            user_id: sea_orm::Set("bob".into()),
            provider: sea_orm::Set("acme".into()),
            external_id: sea_orm::Set("b0".into()),
            payload: sea_orm::Set("{\"id\":\"b0\"}".into()),
            content_hash: sea_orm::Set("0".repeat(64)),
            first_seen_run_id: sea_orm::Set(0),
            last_seen_run_id: sea_orm::Set(0),
            created_at: sea_orm::Set(now),
            updated_at: sea_orm::Set(now),
            ..Default::default()
        },
        &txn,
    )
    .await
    .unwrap();
    while app.received_requests().await == 0 {
        assert!(Instant::now() < deadline, "the page was never asked for");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    match backend() {
        Backend::Sqlite => tokio::time::sleep(Duration::from_millis(800)).await,
        _ => {
            while app.lock_waits().await < 1 {
                if Instant::now() >= deadline {
                    panic!("the page never waited; sessions:\n{}", app.sessions().await);
                }
                tokio::time::sleep(LOCK_WAITS_POLL).await;
            }
        }
    }
    txn.commit().await.unwrap();

    let process = tokio::task::spawn_blocking(move || finish(child))
        .await
        .unwrap();
    assert_eq!(process.code, 0, "{}\n{}", process.stdout, process.stderr);
    let report: serde_json::Value = serde_json::from_str(&process.stdout).unwrap();
    assert_eq!(report["runs"][0]["status"], "succeeded", "{report}");
    assert_eq!(report["runs"][0]["counts"]["inserted"], PER_PAGE);
    let records = app.records().await;
    assert_eq!(records.len(), PER_PAGE + 1);
    assert_eq!(
        records.iter().filter(|r| r.user_id == "bob").count(),
        1,
        "the other writer's commit stands"
    );
}
