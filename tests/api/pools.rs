//! The database's pools: on a SQLite file, the pipeline's lookups outside transactions go
//! through read-only readers of the file; elsewhere through the main pool.

use sea_orm::sqlx;
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement};
use tributary::config::DatabaseSettings;
use tributary::db::{DatabasePools, SqliteReaders};
use tributary::pipeline::RunStatus;

use crate::helpers::{backend, cursor_provider, mount_cursor_listing, spawn_app, Backend};

async fn count(db: &DatabaseConnection, table: &str) -> i64 {
    let row = db
        .query_one_raw(Statement::from_string(
            db.get_database_backend(),
            format!("SELECT count(*) AS n FROM {table}"),
        ))
        .await
        .expect("count")
        .expect("one row");
    row.try_get("", "n").expect("n")
}

async fn count_on_reader(readers: &SqliteReaders, table: &str) -> i64 {
    let mut reader = readers.acquire().await.expect("a reader");
    let n = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(reader.connection())
        .await
        .expect("count");
    reader.give_back();
    n
}

/// A migrated SQLite file in `dir`, whatever backend the suite runs on.
async fn sqlite_file(dir: &tempfile::TempDir) -> DatabasePools {
    let settings = DatabaseSettings {
        url: format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("pools.db").display()
        ),
        max_connections: 4,
    };
    tributary::db::connect_and_migrate(&settings)
        .await
        .expect("migrated")
}

#[tokio::test]
async fn a_sqlite_file_gets_read_only_readers_that_see_every_commit() {
    let dir = tempfile::tempdir().unwrap();
    let db = sqlite_file(&dir).await;
    let readers = db.sqlite_readers().expect("a SQLite file has readers");
    assert_eq!(readers.idle_connections(), 0, "opened when first used");
    db.execute_unprepared("CREATE TABLE probe (x INTEGER NOT NULL)")
        .await
        .unwrap();
    db.execute_unprepared("INSERT INTO probe (x) VALUES (1)")
        .await
        .unwrap();
    assert_eq!(count_on_reader(readers, "probe").await, 1);
    assert_eq!(readers.idle_connections(), 1, "given back, kept open");
    let mut reader = readers.acquire().await.unwrap();
    let cache_kib: i64 = sqlx::query_scalar("PRAGMA cache_size")
        .fetch_one(reader.connection())
        .await
        .unwrap();
    reader.give_back();
    assert_eq!(cache_kib, -128, "a reader keeps a small page cache");

    let mut reader = readers.acquire().await.unwrap();
    let refused = sqlx::query("INSERT INTO probe (x) VALUES (2)")
        .execute(reader.connection())
        .await
        .expect_err("a reader cannot write");
    assert!(
        refused.to_string().contains("readonly"),
        "the error says why: {refused}"
    );
    drop(reader);
    assert_eq!(
        readers.idle_connections(),
        0,
        "a reader dropped without being given back is closed"
    );
    db.execute_unprepared("INSERT INTO probe (x) VALUES (3)")
        .await
        .unwrap();
    assert_eq!(
        count_on_reader(readers, "probe").await,
        2,
        "the readers see the main pool's latest commit, and nothing of the refused write"
    );
    assert_eq!(count(db.main(), "probe").await, 2);
    db.close().await.expect("both close");
}

/// At most four readers are out at once; a fifth lookup waits for one to come back.
#[tokio::test]
async fn sqlite_readers_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let db = sqlite_file(&dir).await;
    let readers = db.sqlite_readers().expect("readers");
    let mut out = Vec::new();
    for _ in 0..4 {
        out.push(readers.acquire().await.expect("a reader"));
    }
    let fifth = tokio::time::timeout(std::time::Duration::from_millis(100), readers.acquire());
    assert!(fifth.await.is_err(), "the fifth waits while four are out");
    out.pop().expect("one").give_back();
    let fifth = tokio::time::timeout(std::time::Duration::from_secs(5), readers.acquire())
        .await
        .expect("served once one is given back")
        .expect("a reader");
    fifth.give_back();
    assert_eq!(readers.idle_connections(), 1);
}

/// An in-memory database cannot be shared with other connections: it reads through its
/// one connection.
#[tokio::test]
async fn an_in_memory_sqlite_database_has_no_readers() {
    let settings = DatabaseSettings {
        url: "sqlite::memory:".to_string(),
        max_connections: 4,
    };
    let db = tributary::db::connect_and_migrate(&settings)
        .await
        .expect("migrated");
    assert!(db.sqlite_readers().is_none());
}

/// On the suite's backend: an unchanged re-sync is answered by lookups, which on a SQLite
/// file go through the readers, and on a server through the main pool.
#[tokio::test]
async fn an_unchanged_resync_looks_up_through_the_readers_on_a_sqlite_file() {
    let app = spawn_app().await;
    let on_sqlite = backend() == Backend::Sqlite;
    assert_eq!(app.db.sqlite_readers().is_some(), on_sqlite);
    let readers_open = || app.db.sqlite_readers().map(SqliteReaders::idle_connections);
    assert_eq!(readers_open(), on_sqlite.then_some(0), "opened lazily");
    mount_cursor_listing(&app.api, "alice", "it", 4, 5, std::time::Duration::ZERO).await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;

    let first = app.sync_one(&settings).await;
    let again = app.sync_one(&settings).await;

    assert_eq!(first.status, RunStatus::Succeeded);
    assert_eq!((first.counts.inserted, first.counts.unchanged), (20, 0));
    assert_eq!(again.status, RunStatus::Succeeded);
    assert_eq!((again.counts.inserted, again.counts.unchanged), (0, 20));
    assert_eq!(count(app.db.main(), "records").await, 20);
    if let Some(open) = readers_open() {
        assert!(open >= 1, "the lookups went through the readers");
    }
}

/// How many records the database file itself holds, the WAL aside (`immutable`: read
/// as if nothing else had it open); 0 while even the table is only in the WAL.
async fn records_in_the_database_file(file: &std::path::Path) -> i64 {
    use sea_orm::sqlx::{sqlite::SqliteConnectOptions, ConnectOptions, Connection};
    let options = SqliteConnectOptions::new()
        .filename(file)
        .read_only(true)
        .immutable(true);
    let mut connection = options.connect().await.expect("the file opens");
    let count = sqlx::query_scalar("SELECT count(*) FROM records")
        .fetch_one(&mut connection)
        .await
        .unwrap_or(0);
    connection.close().await.expect("closed");
    count
}

/// On a SQLite file, committed pages are copied from the WAL into the database file in
/// the background, long before the writer's own checkpoint (at 10,000 WAL pages) would
/// come due; the checkpoints' connection closes with the pools, so the WAL goes too.
#[tokio::test]
async fn on_a_sqlite_file_committed_pages_reach_the_database_file_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pools.db");
    let db = sqlite_file(&dir).await;
    let app = crate::helpers::TestApp::new(db, format!("sqlite://{}", file.display()), dir).await;
    mount_cursor_listing(&app.api, "alice", "it", 4, 5, std::time::Duration::ZERO).await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    assert_eq!(records_in_the_database_file(&file).await, 0);

    let run = app.sync_one(&settings).await;
    assert_eq!(
        (run.status, run.counts.inserted),
        (RunStatus::Succeeded, 20)
    );
    let copied = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while records_in_the_database_file(&file).await != 20 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        copied.is_ok(),
        "the records never reached the database file"
    );

    let wal = dir_file(&file, "-wal");
    assert!(wal.exists(), "the WAL is in use while the pools are open");
    app.db.close().await.expect("closed");
    assert!(!wal.exists(), "the last connection closed removes the WAL");
}

fn dir_file(file: &std::path::Path, suffix: &str) -> std::path::PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}
