//! Instances that start at once take turns migrating, one database at a time, and none
//! waits for another forever.
//!
//! - PostgreSQL: `pg_advisory_lock` on one key, under a `lock_timeout`. Advisory locks
//!   belong to the database they are taken in, so instances of other databases on the
//!   server never wait for it.
//! - MySQL/MariaDB: a named lock (`GET_LOCK` with a timeout). Its names are the server's,
//!   not a database's, so the name carries the database: `tributary_migrations_` and the
//!   MD5 of `DATABASE()` (a database name can be 64 characters, and so can a lock name).
//! - SQLite: an exclusive lock on `<file>.migrate.lock`, the file that also serialises
//!   opening the database (see [`super::connect`]), tried again every [`RETRY_EVERY`].
//!   An in-memory database has no lock.
//!
//! The servers wake a waiting session as soon as the lock is free. The wait is bounded
//! ([`MIGRATION_LOCK_WAIT`] unless the caller says otherwise): a lock still held then is
//! an instance stuck migrating, or a person holding it, and the error says which lock and
//! how long it waited rather than migrating without it.

use std::path::Path;
use std::time::Duration;

use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, Statement,
    TransactionTrait,
};
use tokio::time::Instant;

use super::paths::{lock_path, sqlite_file};

/// How long an instance waits for another's migrations before it gives up. Migrations of
/// the tables this project has take seconds; a lock held longer is someone stuck.
pub const MIGRATION_LOCK_WAIT: Duration = Duration::from_secs(300);

/// How often a lock file held by someone else is tried again.
const RETRY_EVERY: Duration = Duration::from_millis(100);

/// The PostgreSQL advisory-lock key ("trib" in ASCII).
const POSTGRES_KEY: i64 = 0x7472_6962;

/// The lock file purpose for a SQLite database (`<file>.migrate.lock`).
pub(super) const SQLITE_LOCK_PURPOSE: &str = "migrate";

/// Why the migration lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum MigrationLockError {
    #[error("waited {} s for the migration lock ({lock}), which another instance still holds; if no instance is migrating, end the session or process that holds it", waited.as_secs())]
    Timeout { lock: String, waited: Duration },
    #[error("taking the migration lock ({lock}) failed: {source}")]
    Failed { lock: String, source: DbErr },
}

/// The migration lock of one database, held until [`MigrationLock::release`] (or until
/// it is dropped: the server then frees it when the session ends, the kernel when the
/// file closes). Public so that tests can hold it as another instance migrating would.
#[derive(Debug)]
pub struct MigrationLock {
    held: Held,
}

#[derive(Debug)]
enum Held {
    /// A server session pinned by a transaction, and the statement that unlocks.
    Session {
        session: DatabaseTransaction,
        unlock: Statement,
    },
    /// The open lock file: closing it frees the lock.
    File {
        _open: std::fs::File,
    },
    Nothing,
}

impl MigrationLock {
    /// Takes the migration lock of the database `db` is connected to (`url` is its URL),
    /// waiting at most `wait` for whoever holds it.
    pub async fn acquire(
        db: &DatabaseConnection,
        url: &str,
        wait: Duration,
    ) -> Result<MigrationLock, MigrationLockError> {
        let deadline = Instant::now() + wait;
        let held = match db.get_database_backend() {
            DbBackend::Postgres | DbBackend::MySql => server_lock(db, wait).await?,
            _ => match sqlite_file(url) {
                Some(file) => Held::File {
                    _open: file_lock(&file, SQLITE_LOCK_PURPOSE, deadline, wait).await?,
                },
                None => Held::Nothing,
            },
        };
        Ok(MigrationLock { held })
    }

    /// Frees the lock.
    pub async fn release(self) -> Result<(), DbErr> {
        match self.held {
            Held::Session { session, unlock } => {
                let released = session.execute_raw(unlock).await;
                // Ending the session's transaction gives its connection back; a named or
                // advisory lock is not part of the transaction and was freed above.
                let _ = session.commit().await;
                released.map(|_| ())
            }
            Held::File { .. } | Held::Nothing => Ok(()),
        }
    }
}

async fn server_lock(db: &DatabaseConnection, wait: Duration) -> Result<Held, MigrationLockError> {
    let backend = db.get_database_backend();
    let (lock, timeout, take, unlock) = match backend {
        DbBackend::Postgres => (
            format!("PostgreSQL advisory lock {POSTGRES_KEY}"),
            // Local to the session's transaction, which ends when the lock is released.
            Some(format!(
                "SET LOCAL lock_timeout = {}",
                wait.as_millis().clamp(1, i32::MAX as u128)
            )),
            format!("SELECT pg_advisory_lock({POSTGRES_KEY}) IS NOT NULL AS taken"),
            format!("SELECT pg_advisory_unlock({POSTGRES_KEY})"),
        ),
        _ => {
            let name = "CONCAT('tributary_migrations_', MD5(DATABASE()))";
            (
                "MySQL named lock tributary_migrations_ + MD5(DATABASE())".to_string(),
                None,
                // GET_LOCK counts its timeout in whole seconds.
                format!(
                    "SELECT GET_LOCK({name}, {}) = 1 AS taken",
                    wait.as_secs_f64().ceil()
                ),
                format!("SELECT RELEASE_LOCK({name})"),
            )
        }
    };
    let failed = |source| MigrationLockError::Failed {
        lock: lock.clone(),
        source,
    };
    // A transaction pins one pooled connection: the session that holds the lock.
    let session = db.begin().await.map_err(failed)?;
    if let Some(timeout) = timeout {
        session
            .execute_raw(Statement::from_string(backend, timeout))
            .await
            .map_err(failed)?;
    }
    let taken = match session
        .query_one_raw(Statement::from_string(backend, take))
        .await
    {
        // GET_LOCK answers 0 when the wait is over, NULL on an error, and `NULL = 1` is
        // NULL: neither is taken.
        Ok(Some(row)) => row.try_get::<Option<bool>>("", "taken").map_err(failed)?,
        Ok(None) => None,
        Err(error) if is_lock_timeout(&error) => None,
        Err(error) => return Err(failed(error)),
    };
    if taken == Some(true) {
        return Ok(Held::Session {
            session,
            unlock: Statement::from_string(backend, unlock),
        });
    }
    let _ = session.rollback().await;
    Err(MigrationLockError::Timeout { lock, waited: wait })
}

/// PostgreSQL's `lock_not_available`: the wait for a lock outlasted `lock_timeout`.
fn is_lock_timeout(error: &DbErr) -> bool {
    const LOCK_NOT_AVAILABLE: &str = "55P03";
    match error {
        DbErr::Query(sea_orm::RuntimeErr::SqlxError(sqlx_error))
        | DbErr::Exec(sea_orm::RuntimeErr::SqlxError(sqlx_error)) => sqlx_error
            .as_database_error()
            .and_then(|database_error| database_error.code())
            .is_some_and(|code| code == LOCK_NOT_AVAILABLE),
        _ => false,
    }
}

/// Takes an exclusive lock on `<database_file>.<purpose>.lock`, waiting at most until
/// `deadline`; it is held until the returned file is dropped (or the process exits).
pub(super) async fn file_lock(
    database_file: &Path,
    purpose: &str,
    deadline: Instant,
    wait: Duration,
) -> Result<std::fs::File, MigrationLockError> {
    let path = lock_path(database_file, purpose);
    let lock = format!("lock file {}", path.display());
    let failed = |error: std::io::Error| MigrationLockError::Failed {
        lock: lock.clone(),
        source: DbErr::Custom(error.to_string()),
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(failed)?;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) => {}
            Err(std::fs::TryLockError::Error(error)) => return Err(failed(error)),
        }
        if !wait_for_next_try(deadline).await {
            return Err(MigrationLockError::Timeout { lock, waited: wait });
        }
    }
}

/// Sleeps until the next try, [`RETRY_EVERY`] or less; `false` once `deadline` has come
/// (the last try was made at it). On tokio's clock, so tests can pause it.
async fn wait_for_next_try(deadline: Instant) -> bool {
    match deadline.checked_duration_since(Instant::now()) {
        Some(left) if !left.is_zero() => {
            tokio::time::sleep(left.min(RETRY_EVERY)).await;
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DatabaseSettings;
    use crate::db::{migrate_with, DbSetupError, OlderInstances};
    use crate::testing::{backend, Backend, TestDb};
    use tributary_migrations::MigratorTrait;

    async fn migrate_waiting_at_most(
        db: &DatabaseConnection,
        settings: &DatabaseSettings,
        wait: Duration,
    ) -> Result<(), DbSetupError> {
        migrate_with(db, settings, wait, OlderInstances::Refuse)
            .await
            .map(|_| ())
    }

    fn settings(url: &str) -> DatabaseSettings {
        DatabaseSettings {
            url: url.to_string(),
            max_connections: 4,
        }
    }

    /// What the error calls the lock on each backend.
    fn lock_kind() -> &'static str {
        match backend() {
            Backend::Sqlite => "lock file ",
            Backend::Postgres => "PostgreSQL advisory lock ",
            Backend::Mysql => "MySQL named lock ",
        }
    }

    /// The setup lock file only serialises opening; a database whose lock file cannot be
    /// created (here a folder stands in its way) still opens, and migrating names the lock.
    #[tokio::test]
    async fn a_sqlite_database_opens_where_its_setup_lock_file_cannot_be_created() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("locked.db");
        let settings = settings(&format!("sqlite://{}?mode=rwc", file.display()));
        let db = crate::db::connect_and_migrate(&settings)
            .await
            .expect("created");
        db.close().await.expect("closed");
        let lock = dir.path().join("locked.db.migrate.lock");
        std::fs::remove_file(&lock).expect("lock file removed");
        std::fs::create_dir(&lock).expect("a folder in its way");

        let db = crate::db::connect(&settings).await.expect("opens");
        let tables = db
            .query_all_raw(Statement::from_string(
                db.get_database_backend(),
                "SELECT id FROM records",
            ))
            .await
            .expect("reads");
        assert!(tables.is_empty());
        // The service's wait: failing to create the lock file is no reason to wait.
        let migrated = migrate_waiting_at_most(&db, &settings, MIGRATION_LOCK_WAIT).await;
        let message = migrated.expect_err("no lock, no migration").to_string();
        assert!(message.contains("migration lock (lock file"), "{message}");
    }

    #[tokio::test]
    async fn a_migration_waits_for_the_lock_no_longer_than_told_and_names_it() {
        let test = TestDb::new().await;
        let held = MigrationLock::acquire(test.main(), &test.url, Duration::from_secs(5))
            .await
            .expect("the lock is free");

        let started = std::time::Instant::now();
        let refused =
            migrate_waiting_at_most(test.main(), &settings(&test.url), Duration::from_secs(1))
                .await;
        let waited = started.elapsed();
        let error = refused.expect_err("the lock is held");
        assert!(
            matches!(
                &error,
                DbSetupError::MigrationLock {
                    source: MigrationLockError::Timeout { .. },
                    ..
                }
            ),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(
            message.contains(&format!(
                "waited 1 s for the migration lock ({}",
                lock_kind()
            )),
            "{message}"
        );
        assert!(
            message.contains("another instance still holds"),
            "{message}"
        );
        assert!(
            waited >= Duration::from_secs(1) && waited < Duration::from_secs(10),
            "waited {waited:?}"
        );

        held.release().await.expect("released");
        migrate_waiting_at_most(test.main(), &settings(&test.url), Duration::from_secs(1))
            .await
            .expect("the lock is free again");
    }

    #[tokio::test]
    async fn a_migration_lock_held_on_one_database_does_not_hold_up_another_on_the_same_server() {
        let test = TestDb::new().await;
        let held = MigrationLock::acquire(test.main(), &test.url, Duration::from_secs(5))
            .await
            .expect("the lock is free");

        let other_dir = tempfile::tempdir().expect("temp dir");
        let other_url = crate::testing::scratch_database_url(other_dir.path()).await;
        assert_ne!(other_url, test.url);
        let other = crate::db::connect(&settings(&other_url))
            .await
            .expect("connects");
        migrate_waiting_at_most(&other, &settings(&other_url), Duration::from_secs(1))
            .await
            .expect("another database's lock is its own");
        let applied = other
            .query_all_raw(Statement::from_string(
                other.get_database_backend(),
                "SELECT version FROM seaql_migrations",
            ))
            .await
            .expect("migrations listed");
        assert_eq!(
            applied.len(),
            tributary_migrations::Migrator::migrations().len()
        );
        held.release().await.expect("released");
    }

    /// With the clock paused, the wait for a lock file someone else holds ends exactly
    /// when told, naming the file; a free lock file is taken at once.
    #[tokio::test(start_paused = true)]
    async fn a_held_lock_file_is_waited_for_no_longer_than_told() {
        let dir = tempfile::tempdir().expect("temp dir");
        let database = dir.path().join("app.db");
        let other = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(lock_path(&database, SQLITE_LOCK_PURPOSE))
            .expect("lock file");
        other.lock().expect("held by the other");

        let wait = MIGRATION_LOCK_WAIT;
        let started = Instant::now();
        let refused = file_lock(&database, SQLITE_LOCK_PURPOSE, started + wait, wait).await;
        let waited = started.elapsed();
        let message = refused.expect_err("the lock is held").to_string();
        assert!(
            message.starts_with("waited 300 s for the migration lock (lock file "),
            "{message}"
        );
        assert!(message.contains("app.db.migrate.lock"), "{message}");
        assert!(
            waited >= wait && waited < wait + RETRY_EVERY,
            "waited {waited:?}"
        );

        drop(other);
        let started = Instant::now();
        let taken = file_lock(&database, SQLITE_LOCK_PURPOSE, started + wait, wait).await;
        assert!(taken.is_ok(), "{taken:?}");
        assert_eq!(started.elapsed(), Duration::ZERO);
    }
}
