//! The database a test writes to: which server (`TRIBUTARY_TEST_DB`) and a fresh, empty
//! database on it. Shared by the `api` suite and the benchmark's tests (`#[path]`).

use sea_orm::ConnectionTrait;

/// Which database server the suite runs against: `TRIBUTARY_TEST_DB` = `sqlite` (the
/// default), `postgres` or `mysql`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
    Mysql,
}

pub fn backend() -> Backend {
    match std::env::var("TRIBUTARY_TEST_DB").as_deref() {
        Ok("postgres") => Backend::Postgres,
        Ok("mysql") => Backend::Mysql,
        Ok("sqlite") | Err(_) => Backend::Sqlite,
        Ok(other) => panic!("TRIBUTARY_TEST_DB={other}: expected sqlite, postgres or mysql"),
    }
}

/// A fresh, empty database for one test: a file in `dir` for SQLite, a scratch database
/// (`tributary_test_*`, dropped by scripts/test before each run) on the servers.
pub async fn scratch_database_url(dir: &std::path::Path) -> String {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let server = match backend() {
        Backend::Sqlite => {
            return format!("sqlite://{}?mode=rwc", dir.join("test.db").display());
        }
        Backend::Postgres => std::env::var("TRIBUTARY_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_string()),
        Backend::Mysql => std::env::var("TRIBUTARY_TEST_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".to_string()),
    };
    let name = format!(
        "tributary_test_{}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst),
        chrono::Utc::now().timestamp_subsec_nanos()
    );
    let admin_url = match backend() {
        Backend::Postgres => format!("{server}/postgres"),
        _ => server.clone(),
    };
    let admin = sea_orm::Database::connect(&admin_url)
        .await
        .unwrap_or_else(|e| panic!("cannot reach the test database server {admin_url}: {e}"));
    admin
        .execute_unprepared(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create scratch database");
    admin.close().await.expect("close admin connection");
    format!("{server}/{name}")
}
