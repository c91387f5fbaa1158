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
