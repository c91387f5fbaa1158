//! SQLite: copying the WAL into the database file on a connection of its own, while pages
//! are being written, so the writer seldom has to.
//!
//! Left to itself, the commit that takes the WAL past `wal_autocheckpoint` pages copies
//! all of them into the database file and syncs both files to disk, while every page
//! waits for those syncs.
//! Here a task copies what has been committed at most every [`INTERVAL`] while pages are
//! written (`PRAGMA wal_checkpoint(PASSIVE)`, which never waits for the writer nor holds
//! it up). When the writer's own checkpoint comes due, nearly everything is in the
//! database file already, so its copy and its syncs are short. The writer's checkpoint
//! stays as it was, so the WAL stays bounded whether or not this task keeps up.
//!
//! The task sleeps while nothing is written (a daemon between firings, an unchanged
//! re-sync), and its connection is closed with the pools: the last connection to close
//! removes the WAL file.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sea_orm::sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sea_orm::sqlx::{self, ConnectOptions, Connection};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How often, at most, the WAL is copied while pages are written. Each copy that finds
/// new pages syncs both files; a short interval keeps the writer's own checkpoints short
/// (docs/performance.md has the trial that kept this task).
const INTERVAL: Duration = Duration::from_millis(10);

/// The page cache of the checkpointing connection (`PRAGMA cache_size`; negative is KiB).
/// A checkpoint copies pages from the WAL file without going through it.
const CACHE_SIZE: &str = "-128";

/// The background checkpoints of one SQLite file.
#[derive(Debug)]
pub struct WalCheckpoints {
    written: Arc<Notify>,
    stop: CancellationToken,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl WalCheckpoints {
    /// Starts the task for the file `options` opens. Its connection is opened when pages
    /// are first written.
    pub fn start(options: SqliteConnectOptions) -> WalCheckpoints {
        let written = Arc::new(Notify::new());
        let stop = CancellationToken::new();
        let options = options.pragma("cache_size", CACHE_SIZE);
        let task = tokio::spawn(checkpoint_while_written(
            options,
            written.clone(),
            stop.clone(),
        ));
        WalCheckpoints {
            written,
            stop,
            task: Mutex::new(Some(task)),
        }
    }

    /// Something was committed: the task copies it within [`INTERVAL`].
    pub fn wal_written(&self) {
        self.written.notify_one();
    }

    /// Stops the task and closes its connection.
    pub async fn stop(&self) {
        self.stop.cancel();
        let task = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

impl Drop for WalCheckpoints {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn checkpoint_while_written(
    options: SqliteConnectOptions,
    written: Arc<Notify>,
    stop: CancellationToken,
) {
    let mut connection: Option<SqliteConnection> = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = written.notified() => {}
        }
        if let Err(error) = checkpoint(&options, &mut connection).await {
            // The writer's own checkpoints still keep the WAL bounded.
            tracing::debug!(%error, "A background WAL checkpoint failed; the writer checkpoints instead.");
            if let Some(broken) = connection.take() {
                let _ = broken.close().await;
            }
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(INTERVAL) => {}
        }
    }
    if let Some(connection) = connection {
        let _ = connection.close().await;
    }
}

/// Copies what the WAL holds into the database file, as far as no reader still needs it.
async fn checkpoint(
    options: &SqliteConnectOptions,
    connection: &mut Option<SqliteConnection>,
) -> Result<(), sqlx::Error> {
    let connection = match connection {
        Some(connection) => connection,
        None => connection.insert(options.connect().await?),
    };
    sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
        .execute(connection)
        .await?;
    Ok(())
}
