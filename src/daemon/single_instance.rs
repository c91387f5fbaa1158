//! With SQLite, one daemon per database file: a second one refuses to start. The guard is
//! an advisory lock on `<database file>.daemon.lock`, released by the kernel when the
//! process exits, however it exits.

use crate::db::{lock_path, sqlite_file};
use std::fs::{File, OpenOptions, TryLockError};

/// Holds the lock for as long as it lives.
pub struct SqliteDaemonLock {
    _file: File,
}

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum SingleInstanceError {
    #[error("another tributary daemon is already running on {database} (it holds {lock}); with SQLite only one daemon may run per database file. Stop the other one, or move to PostgreSQL or MySQL to run several instances")]
    AlreadyRunning { database: String, lock: String },
    #[error("cannot open the daemon lock file {lock}: {source}")]
    Open {
        lock: String,
        source: std::io::Error,
    },
}

/// Takes the lock when `database_url` is a SQLite file; `None` for other backends and
/// in-memory SQLite.
pub fn lock_sqlite(database_url: &str) -> Result<Option<SqliteDaemonLock>, SingleInstanceError> {
    let Some(path) = sqlite_file(database_url) else {
        return Ok(None);
    };
    let lock_path = lock_path(&path, "daemon");
    let lock_display = lock_path.display().to_string();
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|source| SingleInstanceError::Open {
            lock: lock_display.clone(),
            source,
        })?;
    match file.try_lock() {
        Ok(()) => Ok(Some(SqliteDaemonLock { _file: file })),
        Err(TryLockError::WouldBlock) => Err(SingleInstanceError::AlreadyRunning {
            database: path.display().to_string(),
            lock: lock_display,
        }),
        Err(TryLockError::Error(source)) => Err(SingleInstanceError::Open {
            lock: lock_display,
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_file_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("t.db").display());
        let first = lock_sqlite(&url).unwrap();
        assert!(first.is_some());
        let second = lock_sqlite(&url).err().unwrap().to_string();
        assert!(
            second.contains("another tributary daemon is already running"),
            "{second}"
        );
        drop(first);
        assert!(lock_sqlite(&url).unwrap().is_some(), "released on drop");
        assert!(lock_sqlite("postgres://x@h/db").unwrap().is_none());
        assert!(lock_sqlite("sqlite::memory:").unwrap().is_none());
    }
}
