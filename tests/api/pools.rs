//! The database's pools on a SQLite file: committed pages reach the database file in the
//! background. (The read-only readers are tested beside them, in src/db/readers.rs.)

use sea_orm::sqlx;
use tributary::config::DatabaseSettings;
use tributary::db::DatabasePools;
use tributary::entities::sync_run::RunStatus;

use crate::helpers::{cursor_provider, mount_cursor_listing};

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
