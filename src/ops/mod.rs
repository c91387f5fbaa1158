//! The operations every face calls: each takes typed input, returns serde-serializable
//! data and a typed [`OpsError`], and never prints. The CLI formats what they return as
//! tables or JSON; the HTTP API will return it as it is.
//!
//! Lists are paged: a page holds at most its query's `limit` items, and `next` is the
//! key to ask for the page after it (absent on the last page). Keys are row ids, so a
//! page boundary never moves when rows are added.

pub(crate) mod api_keys;
pub(crate) mod changes;
pub(crate) mod connect;
pub(crate) mod connections;
pub(crate) mod errors;
pub(crate) mod health;
pub(crate) mod jobs;
pub(crate) mod notifications;
pub(crate) mod operator;
pub(crate) mod records;
pub mod replay;
pub(crate) mod runs;
pub(crate) mod secrets;
pub(crate) mod stream_states;
pub(crate) mod sync;
pub(crate) mod sync_status;
pub(crate) mod webhooks;

use sea_orm::DbErr;
use serde::Serialize;

/// One page of a list; `K` is its paging key (a row id unless the list says otherwise).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Page<T, K = i64> {
    pub items: Vec<T>,
    /// Where the next page starts (pass it as the query's `after`/`before`); `None` on the
    /// last page.
    pub next: Option<K>,
}

impl<T, K> Page<T, K> {
    /// A page of `limit` items from `rows`, fetched with one row more than the limit so
    /// that the extra row tells whether a next page exists; `key` is the paging key.
    pub(crate) fn from_rows(mut rows: Vec<T>, limit: u64, key: impl Fn(&T) -> K) -> Page<T, K> {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let more = rows.len() > limit;
        rows.truncate(limit);
        let next = match more {
            true => rows.last().map(key),
            false => None,
        };
        Page { items: rows, next }
    }
}

/// Why an operation did not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// The input named something that does not exist.
    #[error("there is no {what}{hint}")]
    NotFound {
        /// What was looked for, as `run with id 5` or `connection alice@github`.
        what: String,
        /// How to find the right one, for a person at a terminal.
        hint: &'static str,
    },
    /// A field of the input is out of its range or malformed.
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    /// The request conflicts with what exists (a connection that is already there, one
    /// that config.toml owns).
    #[error("{0}")]
    Conflict(String),
    /// A secret could not be sealed for storing.
    #[error("{0}")]
    Secrets(#[from] crate::secrets::SecretsError),
    #[error(transparent)]
    Sealing(#[from] crate::connections::sealing::SealingError),
    #[error(transparent)]
    Sync(#[from] crate::sync::SyncError),
    #[error(transparent)]
    Replay(crate::pipeline::replay::ReplayError),
    /// The change feed cannot serve the cursor.
    #[error(transparent)]
    Feed(#[from] crate::pipeline::changes::FeedError),
    #[error("database error: {0}")]
    Database(#[from] DbErr),
}

impl OpsError {
    /// Whether the configuration (or a provider or stream the input named from it) is at
    /// fault.
    pub fn is_config(&self) -> bool {
        match self {
            OpsError::Sync(error) => error.is_config(),
            _ => false,
        }
    }

    /// Whether a secret could not be stored because no secrets key is configured (and
    /// `allow_plaintext` is not set).
    pub fn is_missing_key(&self) -> bool {
        matches!(
            self,
            OpsError::Secrets(crate::secrets::SecretsError::NoKey { .. })
        )
    }

    /// Whether a change feed reader must take its baseline again (head, then `records`,
    /// then follow): its cursor expired, is ahead of the head, or came from another
    /// database or from a release whose cursors named none.
    pub fn needs_resync(&self) -> bool {
        use crate::pipeline::changes::FeedError;
        matches!(
            self,
            OpsError::Feed(
                FeedError::Expired { .. }
                    | FeedError::Ahead { .. }
                    | FeedError::OtherDatabase { .. }
                    | FeedError::Unidentified { .. }
            )
        )
    }
}

/// Whether the database answers, for a health check.
pub(crate) async fn ping(db: &sea_orm::DatabaseConnection) -> Result<(), OpsError> {
    Ok(db.ping().await?)
}

/// Checks a page size against `1..=max`.
pub(crate) fn check_limit(limit: u64, max: u64) -> Result<u64, OpsError> {
    match limit {
        1.. if limit <= max => Ok(limit),
        _ => Err(OpsError::Invalid {
            field: "limit",
            message: format!("must be between 1 and {max}, not {limit}"),
        }),
    }
}
