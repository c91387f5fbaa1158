//! The database as a process holds it: the pool every statement goes through, and on a
//! SQLite file read-only connections for the lookups the pipeline makes outside any
//! transaction (`readers.rs`), and the background WAL checkpoints.
//!
//! SQLite has one writer, so the main pool has one connection (see [`super::connect`]),
//! and everything sent through it waits its turn: each statement is a hand-off to sqlx's
//! worker thread for that connection and back. In WAL mode readers neither wait for the
//! writer nor hold it up, so "is every record of this page stored unchanged already?",
//! which is all an unchanged re-sync asks, runs on reader connections, several at once,
//! while page writes keep the main connection. The readers open the file read-only: they
//! cannot write, whatever is sent through them.

use std::ops::Deref;
use std::sync::Arc;

use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, DbErr, ExecResult, QueryResult, Statement,
};

use crate::secrets::Keyring;

use super::readers::SqliteReaders;
use super::wal_checkpoints::WalCheckpoints;

/// How many reader connections a SQLite file gets. A lookup spends most of its time in
/// hand-offs between threads rather than in SQLite, so more readers than cores still pay.
const READERS: usize = 4;

/// The main pool; on a SQLite file its readers and background checkpoints; and the keys
/// that open and seal `connections.credentials`. Dereferences to the main pool, so it goes
/// wherever a `&DatabaseConnection` does.
#[derive(Clone, Debug)]
pub struct DatabasePools {
    main: DatabaseConnection,
    readers: Option<Arc<SqliteReaders>>,
    checkpoints: Option<Arc<WalCheckpoints>>,
    secrets: Arc<Keyring>,
}

impl DatabasePools {
    /// `main` alone: every statement, reads included, goes through it.
    pub fn single(main: DatabaseConnection) -> DatabasePools {
        DatabasePools {
            main,
            readers: None,
            checkpoints: None,
            secrets: Arc::new(Keyring::none()),
        }
    }

    /// `main`, a pool on a SQLite file (not an in-memory database, which other
    /// connections could not share), up to [`READERS`] read-only connections to the same
    /// file, opened when first used, and its background checkpoints.
    /// [`super::connect`] decides which databases get them.
    pub(crate) fn with_sqlite_readers(main: DatabaseConnection) -> DatabasePools {
        if main.get_database_backend() != DbBackend::Sqlite {
            return DatabasePools::single(main);
        }
        let options = (*main.get_sqlite_connection_pool().connect_options()).clone();
        DatabasePools {
            readers: Some(Arc::new(SqliteReaders::new(options.clone(), READERS))),
            checkpoints: Some(Arc::new(WalCheckpoints::start(options))),
            ..DatabasePools::single(main)
        }
    }

    /// These pools with `keyring` as the keys for stored credentials (without one, no
    /// secret can be stored and only secrets in clear can be read).
    pub fn with_keyring(self, keyring: Keyring) -> DatabasePools {
        DatabasePools {
            secrets: Arc::new(keyring),
            ..self
        }
    }

    /// These pools with `count` called after every statement sent through the main pool
    /// (transactions' statements included); its clones made from now on count too.
    pub(crate) fn counting_statements(
        mut self,
        count: impl Fn() + Send + Sync + 'static,
    ) -> DatabasePools {
        self.main.set_metric_callback(move |_| count());
        self
    }

    /// The keys that open and seal `connections.credentials`.
    pub fn secrets(&self) -> &Keyring {
        &self.secrets
    }

    /// The same keys, for a task that outlives the borrow of the pools.
    pub(crate) fn shared_secrets(&self) -> Arc<Keyring> {
        Arc::clone(&self.secrets)
    }

    /// The pool every write and every transaction goes through.
    pub fn main(&self) -> &DatabaseConnection {
        &self.main
    }

    /// The read-only connections for lookups outside transactions, on a SQLite file.
    pub(crate) fn sqlite_readers(&self) -> Option<&SqliteReaders> {
        self.readers.as_deref()
    }

    /// Something was committed: on a SQLite file, the background checkpoints copy it into
    /// the database file soon.
    pub(crate) fn wal_written(&self) {
        if let Some(checkpoints) = &self.checkpoints {
            checkpoints.wal_written();
        }
    }

    /// Closes the pools, the checkpoints' connection first, so that the last connection
    /// to close can remove a SQLite file's WAL.
    pub async fn close(self) -> Result<(), DbErr> {
        if let Some(checkpoints) = self.checkpoints {
            checkpoints.stop().await;
        }
        if let Some(readers) = self.readers {
            readers.close().await;
        }
        self.main.close().await
    }
}

impl Deref for DatabasePools {
    type Target = DatabaseConnection;

    fn deref(&self) -> &DatabaseConnection {
        &self.main
    }
}

/// Every statement sent to the pools themselves goes through the main pool, so they serve
/// wherever sea-orm takes a connection (`.all(&pools)`, `.exec(&pools)`).
#[async_trait::async_trait]
impl ConnectionTrait for DatabasePools {
    fn get_database_backend(&self) -> DbBackend {
        self.main.get_database_backend()
    }

    async fn execute_raw(&self, statement: Statement) -> Result<ExecResult, DbErr> {
        self.main.execute_raw(statement).await
    }

    async fn execute_unprepared(&self, sql: &str) -> Result<ExecResult, DbErr> {
        self.main.execute_unprepared(sql).await
    }

    async fn query_one_raw(&self, statement: Statement) -> Result<Option<QueryResult>, DbErr> {
        self.main.query_one_raw(statement).await
    }

    async fn query_all_raw(&self, statement: Statement) -> Result<Vec<QueryResult>, DbErr> {
        self.main.query_all_raw(statement).await
    }

    fn support_returning(&self) -> bool {
        self.main.support_returning()
    }
}

impl From<DatabaseConnection> for DatabasePools {
    fn from(main: DatabaseConnection) -> DatabasePools {
        DatabasePools::single(main)
    }
}
