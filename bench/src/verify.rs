//! The correctness checks run after each benchmark phase, with portable SQL (SQLite,
//! PostgreSQL, MySQL/MariaDB).
//!
//! "Wrote nothing to `records`" is checked two ways:
//! - a fingerprint of the table, `(count(*), max(id), max(last_seen_run_id))`, equal before
//!   and after: an insert moves the count or `max(id)`, and every write of the pipeline
//!   sets `last_seen_run_id` to the current run, the largest run id;
//! - an exact row-write counter: for the unchanged phase only, row-level triggers on
//!   `records` (AFTER INSERT, UPDATE and DELETE) count every row written into a
//!   `bench_writes` table; they are dropped afterwards. (SQLite's `total_changes()` or WAL
//!   size would also count the run's own bookkeeping in `sync_runs` and `connections`.)

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement};
use serde::{Deserialize, Serialize};

/// One check's outcome.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    pub passed: bool,
    pub detail: String,
}

impl Check {
    pub fn equal<T: PartialEq + std::fmt::Debug>(name: &str, found: T, expected: T) -> Check {
        Check {
            name: name.to_string(),
            passed: found == expected,
            detail: format!("found {found:?}, expected {expected:?}"),
        }
    }
}

/// `(rows, max(id), max(last_seen_run_id))` of the benchmark provider's records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    pub rows: i64,
    pub max_id: i64,
    pub max_last_seen_run_id: i64,
}

async fn scalars(db: &DatabaseConnection, sql: &str, columns: &[&str]) -> Result<Vec<i64>, DbErr> {
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await?
        .ok_or_else(|| DbErr::Custom(format!("no row from {sql}")))?;
    columns
        .iter()
        .map(|column| row.try_get::<i64>("", column))
        .collect()
}

pub async fn fingerprint(db: &DatabaseConnection, provider: &str) -> Result<Fingerprint, DbErr> {
    let sql = format!(
        "SELECT count(*) AS n, COALESCE(max(id), 0) AS max_id, \
         COALESCE(max(last_seen_run_id), 0) AS max_seen FROM records WHERE provider = '{provider}'"
    );
    let values = scalars(db, &sql, &["n", "max_id", "max_seen"]).await?;
    Ok(Fingerprint {
        rows: values[0],
        max_id: values[1],
        max_last_seen_run_id: values[2],
    })
}

/// Keys stored more than once (must be 0: the unique index forbids it).
pub async fn duplicate_keys(db: &DatabaseConnection) -> Result<i64, DbErr> {
    let sql = "SELECT count(*) AS n FROM (SELECT user_id, provider, external_id FROM records \
               GROUP BY user_id, provider, external_id HAVING count(*) > 1) AS d";
    Ok(scalars(db, sql, &["n"]).await?[0])
}

/// Rows last written by a run with an id of at least `run_id`.
pub async fn rows_written_since(
    db: &DatabaseConnection,
    provider: &str,
    run_id: i64,
) -> Result<i64, DbErr> {
    let sql = format!(
        "SELECT count(*) AS n FROM records WHERE provider = '{provider}' AND last_seen_run_id >= {run_id}"
    );
    Ok(scalars(db, &sql, &["n"]).await?[0])
}

async fn execute(db: &DatabaseConnection, sql: &str) -> Result<(), DbErr> {
    db.execute_unprepared(sql).await.map(|_| ())
}

/// Creates `bench_writes` and the triggers that count every row written to `records`.
pub async fn install_write_counter(db: &DatabaseConnection) -> Result<(), DbErr> {
    remove_write_counter(db).await?;
    execute(db, "CREATE TABLE bench_writes (n BIGINT NOT NULL)").await?;
    execute(db, "INSERT INTO bench_writes (n) VALUES (0)").await?;
    match db.get_database_backend() {
        DbBackend::Postgres => {
            execute(
                db,
                "CREATE FUNCTION bench_count_write() RETURNS trigger AS $$ BEGIN \
                 UPDATE bench_writes SET n = n + 1; RETURN NULL; END $$ LANGUAGE plpgsql",
            )
            .await?;
            execute(
                db,
                "CREATE TRIGGER bench_count_writes AFTER INSERT OR UPDATE OR DELETE ON records \
                 FOR EACH ROW EXECUTE FUNCTION bench_count_write()",
            )
            .await
        }
        DbBackend::MySql => {
            for event in ["INSERT", "UPDATE", "DELETE"] {
                execute(
                    db,
                    &format!(
                        "CREATE TRIGGER bench_count_{event} AFTER {event} ON records FOR EACH ROW \
                         UPDATE bench_writes SET n = n + 1"
                    ),
                )
                .await?;
            }
            Ok(())
        }
        _ => {
            for event in ["INSERT", "UPDATE", "DELETE"] {
                execute(
                    db,
                    &format!(
                        "CREATE TRIGGER bench_count_{event} AFTER {event} ON records \
                         BEGIN UPDATE bench_writes SET n = n + 1; END"
                    ),
                )
                .await?;
            }
            Ok(())
        }
    }
}

/// Rows written to `records` since [`install_write_counter`].
pub async fn writes_counted(db: &DatabaseConnection) -> Result<i64, DbErr> {
    Ok(scalars(db, "SELECT n FROM bench_writes", &["n"]).await?[0])
}

/// Drops the counter and its triggers (if present).
pub async fn remove_write_counter(db: &DatabaseConnection) -> Result<(), DbErr> {
    match db.get_database_backend() {
        DbBackend::Postgres => {
            execute(db, "DROP TRIGGER IF EXISTS bench_count_writes ON records").await?;
            execute(db, "DROP FUNCTION IF EXISTS bench_count_write()").await?;
        }
        _ => {
            for event in ["INSERT", "UPDATE", "DELETE"] {
                execute(db, &format!("DROP TRIGGER IF EXISTS bench_count_{event}")).await?;
            }
        }
    }
    execute(db, "DROP TABLE IF EXISTS bench_writes").await
}
