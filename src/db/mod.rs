//! Opening the database and running migrations: infrastructure that knows the schema but
//! no domain rule (configured connections are loaded by `connections`).

use std::time::Duration;

use sea_orm::sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, DbErr};
use tributary_migrations::{Migrator, MigratorTrait};

use schema::SchemaState;

use crate::config::{redact_url, DatabaseSettings};

mod clock;
pub(crate) mod connection_events;
mod health;
mod instances;
mod migration_lock;
pub(crate) mod parameters;
mod paths;
mod pools;
mod readers;
mod schema;
mod wal_checkpoints;

pub(crate) use clock::follow_clock;
pub use clock::now;
pub(crate) use clock::SYNC_CLOCK_EVERY;
pub(crate) use health::{clear_needs_reconnect, mark_needs_reconnect, Announce};
pub(crate) use instances::schema_version;
pub(crate) use instances::stale_before;
pub(crate) use instances::HEARTBEAT_EVERY;
pub(crate) use instances::{Instance, RELEASE};
pub use migration_lock::MigrationLock;
pub use migration_lock::MigrationLockError;
pub(crate) use migration_lock::MIGRATION_LOCK_WAIT;
pub(crate) use paths::{lock_path, sqlite_file};
pub use pools::DatabasePools;

/// A database problem at start-up, with the URL (password redacted) in the message.
#[derive(Debug, thiserror::Error)]
pub enum DbSetupError {
    #[error("cannot connect to database {url}: {source}")]
    Connect { url: String, source: DbErr },
    /// The server's address did not accept a connection, or the SQLite file could not be
    /// created; `target` is the address or the file.
    #[error("cannot connect to database {url}: {target}: {reason}")]
    Open {
        url: String,
        target: String,
        reason: String,
    },
    #[error("migrating database {url} failed: {source}")]
    Migrate { url: String, source: DbErr },
    #[error("cannot migrate database {url}: {source}")]
    MigrationLock {
        url: String,
        source: MigrationLockError,
    },
    /// A newer release migrated the database: this binary would write rows its schema
    /// does not describe.
    #[error("the database {url} has schema {database}, newer than this binary knows (tributary {release}, schema {known}): a newer release migrated it ({unknown}). Run that release or a newer one; going back to this one means restoring the backup taken before that upgrade")]
    NewerSchema {
        url: String,
        database: String,
        known: String,
        release: &'static str,
        unknown: String,
    },
    /// Migrating now would leave instances of an older schema writing under the new one.
    #[error("refusing to migrate the database {url} to schema {target} while instances of an older schema are alive: {alive}. Stop every instance, back up the database, then migrate (docs/operations.md, \"Upgrading\"); or migrate anyway with `tributary migrate --while-others-run`")]
    OlderInstancesAlive {
        url: String,
        target: String,
        alive: String,
    },
    #[error("reading the indexes of the records table failed: {0}")]
    KeyIndex(#[source] DbErr),
    #[error("the records table has no unique index on (user_id, provider, external_id), so duplicates could be written; it probably holds rows from before the index existed. Run `tributary reconcile --dry-run` to see them, then `tributary reconcile --audit-log FILE` to remove them and create the index")]
    MissingKeyIndex,
}

/// After how many pages of WAL a SQLite commit copies them into the database file
/// (SQLite's default is 1000). Each such checkpoint syncs both files to disk while the
/// writer waits, so fewer and larger ones cost a first sync less.
const WAL_AUTOCHECKPOINT_PAGES: u32 = 10_000;

/// Rows a SQLite statement's worker thread may hand over before the reading task takes
/// them: a page of records (1,000 and the one that tells a next page exists) fits. With
/// sqlx's 50, a reader slower than SQLite (the records API writing JSON) left the worker
/// waiting on a full channel, woken for each row it took, a thread switch per row.
pub(crate) const ROW_BUFFER: usize = 1_024;

/// Opens a pool on `settings.url`. SQLite gets WAL, `synchronous = NORMAL`, a busy timeout,
/// checkpoints every [`WAL_AUTOCHECKPOINT_PAGES`], and a single pooled connection: SQLite
/// has one writer, and one connection per process keeps this process's page transactions
/// from waiting on each other's locks. A SQLite file also gets read-only readers for the
/// pipeline's lookups outside transactions (see [`DatabasePools`]).
pub async fn connect(settings: &DatabaseSettings) -> Result<DatabasePools, DbSetupError> {
    let mut options = ConnectOptions::new(settings.url.clone());
    options
        .sqlx_logging(false)
        .connect_timeout(Duration::from_secs(10))
        .acquire_timeout(Duration::from_secs(120))
        // sqlx pings every connection it hands out by default: on SQLite a hand-off to
        // its worker thread and back, on a server a round trip, for each statement. Only
        // a connection idle long enough to have been dropped by the server is pinged.
        .test_before_acquire_if_idle_for(Duration::from_secs(30));
    if settings.url.starts_with("sqlite:") {
        options.max_connections(1).map_sqlx_sqlite_opts(|opts| {
            opts.journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(Duration::from_secs(30))
                .foreign_keys(true)
                // Deleted content (an old copy of rewritten credentials) is zeroed, not
                // left in freed space of the file.
                .pragma("secure_delete", "ON")
                .pragma("wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES.to_string())
                .row_buffer_size(ROW_BUFFER)
        });
    } else {
        options
            .max_connections(settings.max_connections)
            .map_sqlx_postgres_pool_opts(|pool| pool.after_connect(plan_each_statement));
    }
    let failed = |source| DbSetupError::Connect {
        url: redact_url(&settings.url),
        source,
    };
    // Opening a fresh SQLite file switches it to WAL, which needs the file to itself:
    // SQLite answers a second process doing the same with "database is locked" at once,
    // without waiting out the busy timeout. The setup lock file makes them take turns.
    // Where it cannot be created (a folder this user may only read), SQLite could not
    // create the database or its WAL there either, so there is no race to prevent. A
    // lock held past the wait is another process stuck opening or migrating: this one
    // goes on without it, and SQLite itself refuses what would conflict.
    let _guard = match sqlite_file(&settings.url) {
        Some(file) => {
            let deadline = tokio::time::Instant::now() + MIGRATION_LOCK_WAIT;
            let purpose = migration_lock::SQLITE_LOCK_PURPOSE;
            match migration_lock::file_lock(&file, purpose, deadline, MIGRATION_LOCK_WAIT).await {
                Ok(guard) => Some(guard),
                Err(error @ MigrationLockError::Timeout { .. }) => {
                    tracing::warn!(%error, "Opening the database without the setup lock file.");
                    None
                }
                Err(error) => {
                    tracing::debug!(%error, "Opening the database without the setup lock file.");
                    None
                }
            }
        }
        None => None,
    };
    probe_server(&settings.url).await?;
    create_private_sqlite_file(&settings.url).map_err(|(target, reason)| DbSetupError::Open {
        url: redact_url(&settings.url),
        target,
        reason,
    })?;
    let main = Database::connect(options).await.map_err(failed)?;
    Ok(match sqlite_file(&settings.url) {
        Some(_) => DatabasePools::with_sqlite_readers(main),
        None => DatabasePools::single(main),
    })
}

/// Has PostgreSQL plan each statement for its own parameters. A plan it caches for a
/// session is made while a table may still be small (a new deployment's first minutes,
/// before autovacuum analyzes it) and stays with that connection as the table grows: a
/// daemon's lookup of a connection's running runs kept a scan of the whole history that
/// way, which took most of the database's time per run at scale (docs/performance.md).
fn plan_each_statement(
    connection: &mut sea_orm::sqlx::PgConnection,
    _: sea_orm::sqlx::pool::PoolConnectionMetadata,
) -> futures::future::BoxFuture<'_, Result<(), sea_orm::sqlx::Error>> {
    Box::pin(async move {
        sea_orm::sqlx::Executor::execute(connection, "SET plan_cache_mode = force_custom_plan")
            .await
            .map(|_| ())
    })
}

/// Creates a SQLite file the URL allows creating (`mode=rwc`) and that does not exist
/// yet, readable by its owner only: it will hold every record and credential. SQLite
/// gives its `-wal` and `-shm` files the database file's permissions.
fn create_private_sqlite_file(url: &str) -> Result<(), (String, String)> {
    use std::os::unix::fs::OpenOptionsExt;
    let Some(file) = sqlite_file(url) else {
        return Ok(());
    };
    let creates = url
        .split_once('?')
        .is_some_and(|(_, query)| query.split('&').any(|pair| pair == "mode=rwc"));
    if !creates || file.exists() {
        return Ok(());
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&file)
    {
        Ok(_) => Ok(()),
        // Another process created it meanwhile.
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err((file.display().to_string(), error.to_string())),
    }
}

/// How long a database server's address gets to accept a TCP connection at start. sqlx
/// retries a refused connection until its acquire timeout, minutes later; a server that is
/// down or a wrong port should fail a command at once, naming the address.
const SERVER_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Checks that a PostgreSQL or MySQL server's host and port accept a TCP connection. URLs
/// that name a Unix socket, or no host, are left to the driver.
async fn probe_server(url: &str) -> Result<(), DbSetupError> {
    let Some((host, port)) = server_address(url) else {
        return Ok(());
    };
    let address = format!("{host}:{port}");
    let unreachable = |reason: String| DbSetupError::Open {
        url: redact_url(url),
        target: address.clone(),
        reason,
    };
    let connect = tokio::net::TcpStream::connect((host.as_str(), port));
    match tokio::time::timeout(SERVER_PROBE_TIMEOUT, connect).await {
        Ok(Ok(_stream)) => Ok(()),
        Ok(Err(error)) => Err(unreachable(error.to_string())),
        Err(_) => Err(unreachable(format!(
            "no answer within {}s",
            SERVER_PROBE_TIMEOUT.as_secs()
        ))),
    }
}

/// The TCP host and port of a `postgres://` or `mysql://` URL (default ports filled in).
fn server_address(url: &str) -> Option<(String, u16)> {
    let parsed = url::Url::parse(url).ok()?;
    let default_port = match parsed.scheme() {
        "postgres" | "postgresql" => 5432,
        "mysql" | "mariadb" => 3306,
        _ => return None,
    };
    // `?host=/run/postgresql` or `?socket=...` point the driver at a Unix socket.
    if parsed
        .query_pairs()
        .any(|(name, _)| name == "host" || name == "socket")
    {
        return None;
    }
    let host = match parsed.host()? {
        url::Host::Domain("") => return None,
        url::Host::Domain(name) => name.to_string(),
        url::Host::Ipv4(address) => address.to_string(),
        url::Host::Ipv6(address) => address.to_string(),
    };
    Some((host, parsed.port().unwrap_or(default_port)))
}

/// Whether a migration goes on while instances of an older schema are alive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OlderInstances {
    /// Refuse, naming them ([`DbSetupError::OlderInstancesAlive`]).
    #[default]
    Refuse,
    /// Migrate anyway: the operator said so.
    Allow,
}

/// Connects and applies every pending migration, refusing while instances of an older
/// schema are alive.
pub async fn connect_and_migrate(
    settings: &DatabaseSettings,
) -> Result<DatabasePools, DbSetupError> {
    Ok(connect_and_migrate_with(settings, OlderInstances::Refuse)
        .await?
        .0)
}

/// [`connect_and_migrate`], with `older` saying what to do about instances of an older
/// schema; also returns the migrations it applied.
pub(crate) async fn connect_and_migrate_with(
    settings: &DatabaseSettings,
    older: OlderInstances,
) -> Result<(DatabasePools, Vec<String>), DbSetupError> {
    let db = connect(settings).await?;
    let applied = migrate_with(&db, settings, MIGRATION_LOCK_WAIT, older).await?;
    Ok((db, applied))
}

/// Connects for a command that only reads. When no migration is pending it takes no
/// migration lock, so it neither waits behind an instance that holds it nor pays for the
/// lock's session, and it keeps to one pooled connection: such a command runs one
/// statement at a time, and each further connection costs a handshake. Otherwise it
/// connects and migrates like [`connect_and_migrate`].
pub(crate) async fn connect_for_reading(
    settings: &DatabaseSettings,
) -> Result<DatabasePools, DbSetupError> {
    let reading = DatabaseSettings {
        max_connections: 1,
        ..settings.clone()
    };
    let db = connect(&reading).await?;
    let schema = SchemaState::read(db.main())
        .await
        .map_err(|source| DbSetupError::Migrate {
            url: redact_url(&settings.url),
            source,
        })?;
    refuse_newer(&schema, settings)?;
    if schema.pending.is_empty() {
        return Ok(db);
    }
    // Migrating takes a session for the lock and another for the migrations.
    let _ = db.close().await;
    connect_and_migrate(settings).await
}

/// Applies every pending migration, under the database's migration lock so that only
/// one of the instances starting at once creates the tables (see [`MigrationLock`]),
/// waiting at most `wait` for another instance's migrations (the service waits
/// [`MIGRATION_LOCK_WAIT`]; tests wait a second, not minutes, for the lock they hold),
/// with `older` saying what to do about instances of an older schema that are alive;
/// returns the migrations applied, in the order they ran.
pub(crate) async fn migrate_with(
    db: &DatabaseConnection,
    settings: &DatabaseSettings,
    wait: Duration,
    older: OlderInstances,
) -> Result<Vec<String>, DbSetupError> {
    let url = || redact_url(&settings.url);
    let lock = MigrationLock::acquire(db, &settings.url, wait)
        .await
        .map_err(|source| DbSetupError::MigrationLock { url: url(), source })?;
    let migrated = migrate_locked(db, settings, older).await;
    let released = lock.release().await;
    let applied = migrated?;
    released.map_err(|source| DbSetupError::Migrate { url: url(), source })?;
    Ok(applied)
}

/// Under the migration lock: refuses a schema newer than this binary knows, and unless
/// `older` allows it a migration while instances of an older schema are alive, before
/// anything is written; then applies the pending migrations.
async fn migrate_locked(
    db: &DatabaseConnection,
    settings: &DatabaseSettings,
    older: OlderInstances,
) -> Result<Vec<String>, DbSetupError> {
    let failed = |source| DbSetupError::Migrate {
        url: redact_url(&settings.url),
        source,
    };
    let schema = SchemaState::read(db).await.map_err(failed)?;
    refuse_newer(&schema, settings)?;
    if schema.pending.is_empty() {
        return Ok(Vec::new());
    }
    let alive = instances::alive_under_older_schema(db, &schema)
        .await
        .map_err(failed)?;
    if !alive.is_empty() {
        match older {
            OlderInstances::Refuse => {
                return Err(DbSetupError::OlderInstancesAlive {
                    url: redact_url(&settings.url),
                    target: schema_version(),
                    alive: alive.join("; "),
                })
            }
            OlderInstances::Allow => tracing::warn!(
                alive = alive.join("; "),
                "Migrating while instances of an older schema are alive, as told."
            ),
        }
    }
    Migrator::up(db, None).await.map_err(failed)?;
    Ok(schema.pending)
}

/// [`DbSetupError::NewerSchema`] when a newer release migrated the database.
fn refuse_newer(schema: &SchemaState, settings: &DatabaseSettings) -> Result<(), DbSetupError> {
    match schema.newer() {
        None => Ok(()),
        Some(database) => Err(DbSetupError::NewerSchema {
            url: redact_url(&settings.url),
            database: database.to_string(),
            known: schema_version(),
            release: RELEASE,
            unknown: match schema.unknown.len() {
                1 => format!("migration {database} is unknown here"),
                n => format!(
                    "{n} migrations are unknown here: {}",
                    schema.unknown.join(", ")
                ),
            },
        }),
    }
}

/// Whether `records` has a unique index on exactly the key columns, read from the
/// database's own catalogue.
pub(crate) async fn key_index_present(db: &DatabaseConnection) -> Result<bool, DbErr> {
    let sql = match db.get_database_backend() {
        DbBackend::Sqlite => {
            "SELECT il.name AS index_name, ii.name AS column_name \
             FROM pragma_index_list('records') il, pragma_index_info(il.name) ii \
             WHERE il.\"unique\" = 1 ORDER BY il.name, ii.seqno"
        }
        DbBackend::Postgres => {
            "SELECT ic.relname AS index_name, a.attname AS column_name \
             FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
             WHERE i.indrelid = 'records'::regclass AND i.indisunique \
             ORDER BY ic.relname, array_position(i.indkey::int2[], a.attnum)"
        }
        _ => {
            "SELECT INDEX_NAME AS index_name, COLUMN_NAME AS column_name \
             FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() \
             AND TABLE_NAME = 'records' AND NON_UNIQUE = 0 ORDER BY INDEX_NAME, SEQ_IN_INDEX"
        }
    };
    let rows = db
        .query_all_raw(sea_orm::Statement::from_string(
            db.get_database_backend(),
            sql,
        ))
        .await?;
    let mut indexes: Vec<(String, Vec<String>)> = Vec::new();
    for row in rows {
        let index: String = row.try_get("", "index_name")?;
        let column: String = row.try_get("", "column_name")?;
        match indexes.last_mut() {
            Some((name, columns)) if *name == index => columns.push(column),
            _ => indexes.push((index, vec![column])),
        }
    }
    let key: Vec<String> = crate::entities::record::KEY_COLUMNS
        .iter()
        .map(sea_orm::Iden::to_string)
        .collect();
    Ok(indexes.iter().any(|(_, columns)| *columns == key))
}

/// Refuses to write records without the unique index the pipeline relies on.
pub(crate) async fn require_key_index(db: &DatabaseConnection) -> Result<(), DbSetupError> {
    match key_index_present(db).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(DbSetupError::MissingKeyIndex),
        Err(source) => Err(DbSetupError::KeyIndex(source)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failed_read_of_the_indexes_says_so_not_that_connections_failed() {
        let db = Database::connect("sqlite::memory:").await.unwrap();
        let closed = db.clone();
        closed.close().await.unwrap();
        let message = require_key_index(&db).await.unwrap_err().to_string();
        assert!(
            message.starts_with("reading the indexes of the records table failed: "),
            "{message}"
        );
    }

    #[tokio::test]
    async fn every_postgresql_session_plans_each_statement_for_its_parameters() {
        let test = crate::testing::TestDb::new().await;
        let db = test.main();
        if db.get_database_backend() != DbBackend::Postgres {
            return;
        }
        // Several at once, so that the pool opens more than its first session.
        let show = || async {
            db.query_one_raw(sea_orm::Statement::from_string(
                DbBackend::Postgres,
                "SELECT current_setting('plan_cache_mode') AS mode, pg_sleep(0.05)::text AS slept",
            ))
            .await
            .expect("plan_cache_mode read")
            .expect("a row")
            .try_get::<String>("", "mode")
            .expect("a setting")
        };
        let modes = futures::future::join_all((0..4).map(|_| show())).await;
        assert_eq!(modes, vec!["force_custom_plan"; 4]);
    }
}
