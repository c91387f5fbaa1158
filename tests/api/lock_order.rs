//! One lock order for every writer of a connection: a page's transaction locks its run's
//! and its connection's rows before anything else, so two writers of one connection take
//! turns instead of deadlocking.
//!
//! The interleaving that deadlocked while the usual path locked those rows last (after
//! inserting its keys) and the all-new page first is forced here, not hoped for: a gate
//! holds the usual page's run row, the all-new page is started only once the usual one
//! waits at it, and the gate opens only once the all-new page has finished or waits too.
//! Removing a connection with its records is forced the same way into a page being
//! stored.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait, DatabaseTransaction, TransactionTrait};
use tributary::config::{DatabaseSettings, WriteMode};
use tributary::entities::connection;
use tributary::pipeline::{Checkpoint, PageExpectation, PageStoreCounts, RunCounts, RunPage};
use tributary_providers::record::sha256_hex;
use tributary_providers::{PageItem, PagePosition, Record};

use crate::helpers::{
    backend, cursor_provider, open_run, run, spawn_app, tributary, Backend, TestApp,
};

const KEYS: usize = 10;

/// The same page for both writers: `KEYS` records, in key order.
fn page() -> Vec<PageItem> {
    (0..KEYS)
        .map(|index| {
            let payload = format!(r#"{{"id":"k{index}"}}"#);
            PageItem::Record(Record {
                external_id: format!("k{index}"),
                content_hash: sha256_hex(payload.as_bytes()),
                payload,
            })
        })
        .collect()
}

/// Holds one run's row locked from another session, so that a page of that run waits at
/// the first statement that locks it. `None` on SQLite, whose one writer takes turns anyway.
struct RunRowGate(Option<DatabaseTransaction>);

impl RunRowGate {
    async fn close(app: &TestApp, run_id: i64) -> RunRowGate {
        if backend() == Backend::Sqlite {
            return RunRowGate(None);
        }
        let txn = app.db.begin().await.expect("gate transaction");
        txn.execute_unprepared(&format!(
            "SELECT id FROM sync_runs WHERE id = {run_id} FOR UPDATE"
        ))
        .await
        .expect("gate closed");
        RunRowGate(Some(txn))
    }

    async fn open(self) {
        if let Some(txn) = self.0 {
            txn.commit().await.expect("gate opened");
        }
    }
}

/// Waits until `done()` holds, for at most 30 s. It polls less often than MariaDB
/// refreshes what `information_schema.INNODB_TRX` shows (see [`TestApp::lock_waits`]).
async fn wait_until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(crate::helpers::LOCK_WAITS_POLL).await;
    }
}

/// The writers' own pool, with room for both page transactions at once.
async fn writer_pool(app: &TestApp) -> tributary::db::DatabasePools {
    tributary::db::connect(&DatabaseSettings {
        url: app.database_url.clone(),
        max_connections: 4,
    })
    .await
    .expect("writer pool")
    .with_keyring(app.keyring())
}

#[tokio::test]
async fn an_all_new_page_and_a_usual_page_of_one_connection_take_turns_without_deadlock() {
    let app = spawn_app().await;
    let connection = app.alice().await;
    let pool = writer_pool(&app).await;
    let mut run_new = open_run(&pool, &connection).await;
    let mut run_usual = open_run(&pool, &connection).await;
    let next = Checkpoint {
        position: Some(PagePosition::Cursor {
            cursor: "p2".to_string(),
        }),
        parent: None,
        walk_started: None,
        since: None,
        watermark: None,
    };
    let page_of = |expect| RunPage {
        items: page(),
        next_checkpoint: Some(&next),
        mode: WriteMode::Upsert,
        expect,
        ..RunPage::default()
    };
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    let _recording = metrics::set_default_local_recorder(&recorder);
    let new_done = AtomicBool::new(false);

    let gate = RunRowGate::close(&app, run_usual.id()).await;
    let gated = backend() != Backend::Sqlite;
    let waits = async |n| !gated || app.lock_waits().await >= n;
    let (start_new, mut new_may_start) = tokio::sync::watch::channel(false);
    let usual = run_usual.store(page_of(PageExpectation::Unknown));
    let all_new = async {
        let _ = new_may_start.wait_for(|start| *start).await;
        let stored = run_new.store(page_of(PageExpectation::New)).await;
        new_done.store(true, Ordering::SeqCst);
        stored
    };
    let driver = async {
        wait_until("the usual page waits at the gate", async || waits(1).await).await;
        start_new.send_replace(true);
        // Either the all-new page went in while the usual one waited holding nothing it
        // needs, or it waits behind the usual one's locks; before, it waited for the usual
        // page's keys while holding the connection's row that the usual page needed next.
        wait_until("the all-new page is stored or waits", async || {
            new_done.load(Ordering::SeqCst) || waits(2).await
        })
        .await;
        gate.open().await;
    };
    let (usual, all_new, ()) = tokio::join!(usual, all_new, driver);

    let usual = usual.expect("the usual page is stored");
    let all_new = all_new.expect("the all-new page is stored");
    let rendered = metrics.render();
    assert!(
        !rendered.contains(r#"reason="contention""#),
        "no page was rolled back for another's locks: {rendered}"
    );
    let stored = app.records().await;
    let ids: Vec<&str> = stored.iter().map(|r| r.external_id.as_str()).collect();
    let mut expected: Vec<String> = (0..KEYS).map(|index| format!("k{index}")).collect();
    expected.sort();
    assert_eq!(ids, expected, "each key stored once");
    assert_eq!(
        usual.inserted + all_new.inserted,
        KEYS as u64,
        "{usual:?} {all_new:?}"
    );
    for (run_id, counts, totals) in [
        (run_usual.id(), &usual, run_usual.counts()),
        (run_new.id(), &all_new, run_new.counts()),
    ] {
        assert_eq!(
            counts.inserted + counts.duplicate + counts.unchanged,
            KEYS as u64,
            "every record inserted, skipped or unchanged: {counts:?}"
        );
        assert_eq!((counts.failed, counts.updated), (0, 0), "{counts:?}");
        assert_committed(&app, run_id, counts, totals).await;
    }
    let checkpoint = connection_checkpoint(&app).await;
    assert_eq!(checkpoint, Some(next.to_column().expect("json")));
}

/// The run's row holds what its page counted.
async fn assert_committed(
    app: &TestApp,
    run_id: i64,
    counts: &PageStoreCounts,
    totals: &RunCounts,
) {
    let row = app.run_row(run_id).await;
    assert_eq!(
        (
            row.records_fetched,
            row.records_inserted,
            row.records_duplicate,
            row.records_unchanged
        ),
        (
            KEYS as i64,
            counts.inserted as i64,
            counts.duplicate as i64,
            counts.unchanged as i64
        ),
        "{row:?}"
    );
    assert_eq!(totals.fetched, KEYS as u64);
}

async fn connection_checkpoint(app: &TestApp) -> Option<String> {
    app.stream_checkpoint().await
}

/// Holds every insert into `records` at a trigger that locks a row of a table of the
/// test's own, while this gate's transaction holds that row. `None` on SQLite.
struct InsertTrigger(Option<DatabaseTransaction>);

impl InsertTrigger {
    async fn close(app: &TestApp) -> InsertTrigger {
        let trigger = match backend() {
            Backend::Sqlite => return InsertTrigger(None),
            Backend::Postgres => {
                app.execute(
                    "CREATE FUNCTION wait_at_gate() RETURNS trigger AS $$ BEGIN \
                     PERFORM 1 FROM insert_gate WHERE id = 1 FOR UPDATE; RETURN NEW; END \
                     $$ LANGUAGE plpgsql",
                )
                .await;
                "CREATE TRIGGER wait_at_gate BEFORE INSERT ON records \
                 FOR EACH ROW EXECUTE FUNCTION wait_at_gate()"
            }
            Backend::Mysql => {
                "CREATE TRIGGER wait_at_gate BEFORE INSERT ON records FOR EACH ROW \
                 BEGIN DECLARE gate INT; \
                 SELECT id INTO gate FROM insert_gate WHERE id = 1 FOR UPDATE; END"
            }
        };
        app.execute("CREATE TABLE insert_gate (id INTEGER PRIMARY KEY)")
            .await;
        app.execute("INSERT INTO insert_gate (id) VALUES (1)").await;
        app.execute(trigger).await;
        let txn = app.db.begin().await.expect("gate transaction");
        txn.execute_unprepared("SELECT id FROM insert_gate WHERE id = 1 FOR UPDATE")
            .await
            .expect("gate closed");
        InsertTrigger(Some(txn))
    }

    async fn open(self) {
        if let Some(txn) = self.0 {
            txn.commit().await.expect("gate opened");
        }
    }
}

/// `tributary --config CONFIG connections remove --provider acme --user USER
/// --delete-records`, started and left running.
fn remove_with_records(config: &std::path::Path, user: &str) -> std::process::Child {
    std::process::Command::new(assert_cmd::cargo::cargo_bin("tributary"))
        .arg("--config")
        .arg(config)
        .args([
            "connections",
            "remove",
            "--provider",
            "acme",
            "--user",
            user,
        ])
        .arg("--delete-records")
        .env_remove("TRIBUTARY_DATABASE_URL")
        .env_remove("TRIBUTARY_CONFIG")
        .env_remove("TRIBUTARY_SECRETS_KEY")
        .env_remove("CREDENTIALS_DIRECTORY")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("tributary starts")
}

/// `connections remove --delete-records` takes the connection's row before its records,
/// as a page does: run while a page of the connection is being stored, it waits for that
/// page and deletes its records too, instead of deleting what was committed before and
/// leaving the page's records behind (or, on MySQL, deadlocking with it).
#[tokio::test]
async fn removing_a_connection_while_its_page_is_stored_deletes_that_page_too() {
    let app = spawn_app().await;
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));
    let added = run(tributary(&config)
        .args(["connections", "add", "--provider", "acme", "--user", "bob"])
        .args(["--token-stdin"])
        .write_stdin("token-bob\n"));
    assert_eq!(added.code, 0, "{}", added.stderr);
    let bob = {
        use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
        connection::Entity::find()
            .filter(connection::Column::UserId.eq("bob"))
            .one(&app.db)
            .await
            .expect("connections")
            .expect("bob's connection")
    };
    let pool = writer_pool(&app).await;
    let mut run = open_run(&pool, &bob).await;
    let gated = backend() != Backend::Sqlite;

    let gate = InsertTrigger::close(&app).await;
    let page = run.store(RunPage {
        items: page(),
        mode: WriteMode::Upsert,
        expect: PageExpectation::Unknown,
        ..RunPage::default()
    });
    let remove = async {
        wait_until(
            "the page waits at the gate holding the connection's row",
            async || !gated || app.lock_waits().await >= 1,
        )
        .await;
        let child = remove_with_records(&config, "bob");
        wait_until("the removal waits too", async || {
            !gated || app.lock_waits().await >= 2
        })
        .await;
        gate.open().await;
        tokio::task::spawn_blocking(move || child.wait_with_output().expect("removal ran"))
            .await
            .expect("removal joined")
    };
    let (stored, removed) = tokio::join!(page, remove);

    let stored = stored.expect("the page was stored before the removal went on");
    assert_eq!(stored.inserted, KEYS as u64);
    let stdout = String::from_utf8_lossy(&removed.stdout);
    assert!(
        removed.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&removed.stderr)
    );
    assert!(
        stdout.contains(&format!("Removed bob@acme and its {KEYS} record(s).")),
        "{stdout}"
    );
    assert!(app.records().await.is_empty(), "no record of bob is left");
}
