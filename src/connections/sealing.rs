//! Keeping `connections.credentials` sealed: encrypting in place the rows a database
//! holds in clear, re-sealing rows under the current key (`secrets rotate`), counting
//! rows per key (`secrets status`), and leaving no old copy in a SQLite file.
//!
//! Each row is rewritten by one conditional `UPDATE` (its own transaction) that applies
//! only if the column still holds what was read, so a rotation stopped at any point
//! leaves every row either as it was or fully re-sealed, and running it again finishes
//! the job. A refresh that wrote the row meanwhile wins; the row is read again.

use std::collections::BTreeMap;

use chrono::Utc;
use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect, Statement,
};

use crate::config::Settings;
use crate::credentials::StoredCredentials;
use crate::entities::connection;
use crate::secrets::{sealed_key_id, sealed_prefix, SecretsError};

use crate::db::DatabasePools;

/// How many times a row changed by a concurrent refresh is read again.
const ATTEMPTS_PER_ROW: usize = 3;

/// A stored-credentials problem at start or in `secrets rotate`.
#[derive(Debug, thiserror::Error)]
pub enum SealingError {
    #[error("{0}")]
    Database(#[from] DbErr),
    #[error("{0}")]
    Secrets(String),
    #[error(
        "secrets rotate needs a current key to seal with: {}",
        crate::secrets::HOW_TO_CONFIGURE
    )]
    NoCurrentKey,
}

/// Which rows [`reseal`] rewrites.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reseal {
    /// Rows holding a secret in clear (on the first start with a key).
    InClear,
    /// Every row holding a secret that is not sealed under the current key.
    NotCurrent,
}

/// What [`reseal`] did.
#[derive(Debug, Default, serde::Serialize)]
pub struct ResealReport {
    /// Rows rewritten under the current key.
    pub resealed: u64,
    /// Rows that could not be opened, each with the reason (naming the connection).
    pub failed: Vec<String>,
}

/// Refuses to start when a configured connection's credentials are sealed with a key
/// this process does not hold: a wrong key must fail before anything is written.
pub async fn check_configured_keys(
    db: &DatabasePools,
    settings: &Settings,
) -> Result<(), SealingError> {
    let rows = connection::Entity::find().all(db.main()).await?;
    for row in rows {
        if !settings.lists_connection(&row.provider, &row.user_id) {
            continue;
        }
        if let Err(error @ SecretsError::UnknownKey { .. }) =
            db.secrets().open(row.binding(), &row.credentials)
        {
            return Err(SealingError::Secrets(error.to_string()));
        }
    }
    Ok(())
}

/// Rewrites the chosen rows under the current key, one row per statement, in id order.
/// On SQLite, what was rewritten is then checkpointed out of the WAL (see
/// [`scrub_sqlite`]).
pub async fn reseal(db: &DatabasePools, which: Reseal) -> Result<ResealReport, SealingError> {
    let Some((current_id, _)) = db.secrets().current() else {
        return match which {
            Reseal::InClear => Ok(ResealReport::default()),
            Reseal::NotCurrent => Err(SealingError::NoCurrentKey),
        };
    };
    // Only rows that may need rewriting are visited; each is checked again when read.
    let done = match which {
        Reseal::InClear => sealed_prefix(None),
        Reseal::NotCurrent => sealed_prefix(Some(current_id)),
    };
    let ids: Vec<i64> = connection::Entity::find()
        .filter(connection::Column::Credentials.not_like(format!("{done}%")))
        .select_only()
        .column(connection::Column::Id)
        .order_by_asc(connection::Column::Id)
        .into_tuple()
        .all(db.main())
        .await?;
    let mut report = ResealReport::default();
    for id in ids {
        match reseal_row(db, id, which).await? {
            Ok(true) => report.resealed += 1,
            Ok(false) => {}
            Err(message) => report.failed.push(message),
        }
    }
    if report.resealed > 0 {
        scrub_sqlite(db).await?;
    }
    Ok(report)
}

/// Re-seals one row if `which` covers it: `Ok(true)` when rewritten, `Err` with the
/// reason when it cannot be opened.
async fn reseal_row(
    db: &DatabasePools,
    id: i64,
    which: Reseal,
) -> Result<Result<bool, String>, DbErr> {
    let keyring = db.secrets();
    for _ in 0..ATTEMPTS_PER_ROW {
        let Some(row) = connection::Entity::find_by_id(id).one(db.main()).await? else {
            return Ok(Ok(false));
        };
        let sealed = sealed_key_id(&row.credentials).is_some();
        if keyring.is_current(&row.credentials) || (sealed && which == Reseal::InClear) {
            return Ok(Ok(false));
        }
        let stored = match StoredCredentials::from_column(keyring, row.binding(), &row.credentials)
        {
            Ok(stored) => stored,
            Err(message) => return Ok(Err(message)),
        };
        if !stored.holds_secrets() {
            return Ok(Ok(false));
        }
        let column = match stored.to_column_for(keyring, row.binding()) {
            Ok(column) => column,
            Err(error) => return Ok(Err(error.to_string())),
        };
        let written = connection::Entity::update_many()
            .col_expr(connection::Column::Credentials, Expr::value(column))
            .col_expr(connection::Column::UpdatedAt, Expr::value(Utc::now()))
            .filter(connection::Column::Id.eq(id))
            .filter(connection::Column::Credentials.eq(row.credentials.as_str()))
            .exec(db.main())
            .await?;
        if written.rows_affected == 1 {
            return Ok(Ok(true));
        }
    }
    Ok(Err(format!(
        "connection {id} changed during each of {ATTEMPTS_PER_ROW} attempts; run it again"
    )))
}

/// On SQLite, copies the WAL into the database file and truncates it, so the pages that
/// held a secret before it was rewritten are left neither in the WAL nor (thanks to
/// `secure_delete`, set on the writing connection) in freed space of the file.
pub async fn scrub_sqlite(db: &DatabasePools) -> Result<(), DbErr> {
    if db.get_database_backend() != DbBackend::Sqlite {
        return Ok(());
    }
    let row = db
        .main()
        .query_one_raw(Statement::from_string(
            DbBackend::Sqlite,
            "PRAGMA wal_checkpoint(TRUNCATE)",
        ))
        .await?;
    let busy: i64 = match row {
        Some(row) => row.try_get_by_index(0)?,
        None => 0,
    };
    if busy != 0 {
        tracing::warn!("The WAL could not be truncated while other connections read; old copies of rewritten credentials stay in it until the next checkpoint.");
    }
    Ok(())
}

/// How `connections.credentials` is held: rows per key id, rows in clear.
#[derive(Debug, Default, serde::Serialize)]
pub struct SealingStatus {
    /// The key the configuration names as current, if any.
    pub current_key_id: Option<String>,
    /// Rows sealed, by the id of the key they were sealed with.
    pub sealed_by_key_id: BTreeMap<String, u64>,
    /// Rows holding a secret in clear.
    pub in_clear: u64,
    /// Rows that only name environment variables (nothing to seal).
    pub without_secrets: u64,
    /// Rows that are neither sealed nor readable JSON.
    pub unreadable: u64,
}

/// Counts rows per key id without opening any: `secrets status` needs no key.
pub async fn status(db: &DatabasePools) -> Result<SealingStatus, DbErr> {
    let columns: Vec<String> = connection::Entity::find()
        .select_only()
        .column(connection::Column::Credentials)
        .into_tuple()
        .all(db.main())
        .await?;
    let mut status = SealingStatus {
        current_key_id: db.secrets().current().map(|(id, _)| id.to_string()),
        ..SealingStatus::default()
    };
    for column in columns {
        match (sealed_key_id(&column), StoredCredentials::parse(&column)) {
            (Some(id), _) => *status.sealed_by_key_id.entry(id.to_string()).or_default() += 1,
            (None, Ok(stored)) if stored.holds_secrets() => status.in_clear += 1,
            (None, Ok(_)) => status.without_secrets += 1,
            (None, Err(_)) => status.unreadable += 1,
        }
    }
    Ok(status)
}
