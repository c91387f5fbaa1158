//! Read-only connections to a SQLite file, handed out one lookup at a time.
//!
//! Not a sqlx pool: a pool pings every connection given back to it, which on SQLite is one
//! more hand-off to the connection's worker thread and back for every lookup (see
//! docs/decisions/sqlite.md). A connection here goes back to the idle list as it is, once
//! its statement has succeeded; a lookup that failed or was abandoned halfway closes its
//! connection instead, so no connection is reused in an unknown state.

use std::sync::{Mutex, PoisonError};

use sea_orm::sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sea_orm::sqlx::{self, ConnectOptions};
use tokio::sync::{Semaphore, SemaphorePermit};

/// Each reader's page cache (`PRAGMA cache_size`; negative is KiB) instead of SQLite's
/// 2 MiB: a lookup probes the index and reads the rows it finds, which the operating
/// system's file cache serves as fast, so a large cache per reader only adds memory.
const READER_CACHE_SIZE: &str = "-128";

/// At most `limit` read-only connections to one file, opened when first needed and kept
/// open while the process runs. Public so that tests can check they are read-only and
/// bounded.
pub struct SqliteReaders {
    options: SqliteConnectOptions,
    idle: Mutex<Vec<SqliteConnection>>,
    permits: Semaphore,
}

impl SqliteReaders {
    /// Readers of the file `options` opens, read-only whatever `options` says.
    pub fn new(options: SqliteConnectOptions, limit: usize) -> SqliteReaders {
        SqliteReaders {
            options: options
                .read_only(true)
                .create_if_missing(false)
                .pragma("cache_size", READER_CACHE_SIZE),
            idle: Mutex::new(Vec::with_capacity(limit)),
            permits: Semaphore::new(limit),
        }
    }

    /// A connection for one lookup: an idle one, or a new one while fewer than the limit
    /// are out; otherwise waits for one to come back.
    pub async fn acquire(&self) -> Result<Reader<'_>, sqlx::Error> {
        let permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| sqlx::Error::PoolClosed)?;
        let idle = self.idle_list().pop();
        let connection = match idle {
            Some(connection) => connection,
            None => self.options.connect().await?,
        };
        Ok(Reader {
            connection,
            readers: self,
            _permit: permit,
        })
    }

    /// Connections open and idle now.
    #[cfg(test)]
    pub fn idle_connections(&self) -> usize {
        self.idle_list().len()
    }

    /// Closes the idle connections. Those out at the time close when they are abandoned,
    /// or, if given back, when the readers are dropped.
    pub async fn close(&self) {
        let idle: Vec<SqliteConnection> = std::mem::take(&mut *self.idle_list());
        for connection in idle {
            let _ = sqlx::Connection::close(connection).await;
        }
    }

    fn idle_list(&self) -> std::sync::MutexGuard<'_, Vec<SqliteConnection>> {
        // The list is only pushed to and popped from: a panic elsewhere cannot leave it
        // half-changed.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for SqliteReaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteReaders")
            .field("file", &self.options.get_filename())
            .field("available", &self.permits.available_permits())
            .finish_non_exhaustive()
    }
}

/// One reader connection, out for one lookup. Dropped without [`Reader::give_back`] (the
/// lookup failed or was abandoned), its connection is closed.
pub struct Reader<'a> {
    connection: SqliteConnection,
    readers: &'a SqliteReaders,
    _permit: SemaphorePermit<'a>,
}

impl Reader<'_> {
    /// The connection to run the lookup on.
    pub fn connection(&mut self) -> &mut SqliteConnection {
        &mut self.connection
    }

    /// The lookup finished: the connection goes back to the idle list for the next one.
    pub fn give_back(self) {
        self.readers.idle_list().push(self.connection);
    }
}

#[cfg(test)]
mod tests {
    use sea_orm::{ConnectionTrait, DatabaseConnection, Statement};

    use super::*;
    use crate::db::DatabasePools;
    use crate::pipeline::PageExpectation;
    use crate::testing::{backend, open_run, page_of, Backend, TestDb};

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
        let settings = crate::config::DatabaseSettings {
            url: format!(
                "sqlite://{}?mode=rwc",
                dir.path().join("pools.db").display()
            ),
            max_connections: 4,
        };
        crate::db::connect_and_migrate(&settings)
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
        let settings = crate::config::DatabaseSettings {
            url: "sqlite::memory:".to_string(),
            max_connections: 4,
        };
        let db = crate::db::connect_and_migrate(&settings)
            .await
            .expect("migrated");
        assert!(db.sqlite_readers().is_none());
    }

    /// On the suite's backend: a page expected unchanged is answered by one lookup, which
    /// on a SQLite file goes through the readers, and on a server through the main pool.
    #[tokio::test]
    async fn an_unchanged_page_is_looked_up_through_the_readers_on_a_sqlite_file() {
        let test = TestDb::new().await;
        let on_sqlite = backend() == Backend::Sqlite;
        assert_eq!(test.db.sqlite_readers().is_some(), on_sqlite);
        let readers_open = || {
            test.db
                .sqlite_readers()
                .map(SqliteReaders::idle_connections)
        };
        assert_eq!(readers_open(), on_sqlite.then_some(0), "opened lazily");
        let alice = test.alice().await;
        let names: Vec<String> = (0..20).map(|i| format!("it{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();

        let mut first = open_run(&test.db, &alice).await;
        let stored = first.store(page_of(&names)).await.expect("stored");
        assert_eq!((stored.inserted, stored.unchanged), (20, 0));
        let mut again = open_run(&test.db, &alice).await;
        let page = crate::pipeline::RunPage {
            expect: PageExpectation::Unchanged,
            ..page_of(&names)
        };
        let stored = again.store(page).await.expect("stored");
        assert_eq!((stored.inserted, stored.unchanged), (0, 20));
        assert_eq!(count(test.main(), "records").await, 20);
        if let Some(open) = readers_open() {
            assert!(open >= 1, "the lookup went through the readers");
        }
    }
}
