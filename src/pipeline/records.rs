//! Deleting records: the writes to `records` that are not a page being stored. They live
//! here so that the pipeline stays the one writer of the table; the commands that delete
//! (`connections remove --delete-records`, `reconcile`) call these. Each removal of a live
//! record is a `deleted` change in the removing transaction, so that a follower of the
//! feed learns of it.

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Condition, Expr, ExprTrait, Func};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect, TransactionTrait,
};

use super::changes::{self, BatchOwner, ChangeBatch};
use crate::entities::change::ChangeKind;
use crate::entities::{connection, record};

/// The `run_id` of the change batches a removal outside any run writes (`connections
/// remove --delete-records`, `reconcile`): no run has it, run ids start at 1.
pub const NO_RUN: i64 = 0;

/// How many records one step of a removal reads and deletes.
const REMOVAL_CHUNK: u64 = 500;

/// Removes connection `connection_id` (`user_id`, `provider`) and, with `delete_records`,
/// its records in all its streams' namespaces (`provider` and `provider.*`); returns how
/// many records were deleted, or `None` when the connection was gone already.
///
/// A transaction records one change batch, and on PostgreSQL takes one seq, so each
/// namespace's records go in a transaction of their own, the connection's row with the
/// last one. A removal stopped partway leaves the connection with the records not yet
/// deleted, and running it again finishes it.
pub async fn remove_connection(
    db: &DatabaseConnection,
    connection_id: i64,
    user_id: &str,
    provider: &str,
    delete_records: bool,
) -> Result<Option<u64>, DbErr> {
    let mut deleted = 0u64;
    loop {
        let txn = db.begin().await?;
        // The connection's row before its records, the order a page takes them in: a
        // page being stored is waited for, and its records are deleted too.
        connection::Entity::update_many()
            .col_expr(connection::Column::Id, Expr::col(connection::Column::Id))
            .filter(connection::Column::Id.eq(connection_id))
            .exec(&txn)
            .await?;
        if connection::Entity::find_by_id(connection_id)
            .one(&txn)
            .await?
            .is_none()
        {
            return Ok(None);
        }
        let namespaces: Vec<String> = match delete_records {
            true => {
                record::Entity::find()
                    .select_only()
                    .column(record::Column::Provider)
                    .distinct()
                    .filter(record::Column::UserId.eq(user_id))
                    .filter(of_provider(provider))
                    .order_by_asc(record::Column::Provider)
                    .into_tuple()
                    .all(&txn)
                    .await?
            }
            false => Vec::new(),
        };
        let last = namespaces.len() <= 1;
        if last {
            connection::Entity::delete_by_id(connection_id)
                .exec(&txn)
                .await?;
        }
        if let Some(namespace) = namespaces.first() {
            deleted = deleted.saturating_add(delete_namespace(&txn, user_id, namespace).await?);
        }
        txn.commit().await?;
        if last {
            return Ok(Some(deleted));
        }
    }
}

/// Deletes every record of `user_id` in `namespace`, with a `deleted` change in one
/// batch for each live one (a record marked deleted had its change then), and stamps the
/// batch: the caller commits next. Returns how many records it deleted.
async fn delete_namespace(
    txn: &impl ConnectionTrait,
    user_id: &str,
    namespace: &str,
) -> Result<u64, DbErr> {
    let owner = BatchOwner {
        run_id: NO_RUN,
        user_id,
        provider: namespace,
    };
    let mut batch = changes::open_batch(txn, owner).await?;
    let mut recorded = 0u64;
    let mut deleted = 0u64;
    loop {
        let live: Vec<(i64, String)> = record::Entity::find()
            .select_only()
            .columns([record::Column::Id, record::Column::ExternalId])
            .filter(record::Column::UserId.eq(user_id))
            .filter(record::Column::Provider.eq(namespace))
            .filter(record::Column::DeletedAt.is_null())
            .order_by_asc(record::Column::Id)
            .limit(REMOVAL_CHUNK)
            .into_tuple()
            .all(txn)
            .await?;
        if live.is_empty() {
            break;
        }
        let ids: Vec<i64> = live.iter().map(|(id, _)| *id).collect();
        let keys = live.iter().map(|(_, external_id)| external_id.as_str());
        recorded += record_deleted(txn, &mut batch, keys, live.len()).await?;
        deleted += delete_records_by_id(txn, &ids).await?;
    }
    deleted += record::Entity::delete_many()
        .filter(record::Column::UserId.eq(user_id))
        .filter(record::Column::Provider.eq(namespace))
        .exec(txn)
        .await?
        .rows_affected;
    close_batch(txn, &batch, recorded, crate::db::now()).await?;
    Ok(deleted)
}

/// Deletes duplicate rows `row_ids` of `user_id`'s records in `namespace`, each key of
/// `keys` (the keys they duplicate, each once) getting a `deleted` change in one batch,
/// which it stamps: the caller commits next. The key's kept row stays, and a reader sees
/// it as the change's record. Returns how many rows it deleted.
pub async fn delete_duplicates(
    txn: &impl ConnectionTrait,
    user_id: &str,
    namespace: &str,
    row_ids: &[i64],
    keys: &[&str],
) -> Result<u64, DbErr> {
    let owner = BatchOwner {
        run_id: NO_RUN,
        user_id,
        provider: namespace,
    };
    let mut batch = changes::open_batch(txn, owner).await?;
    let mut recorded = 0u64;
    for chunk in keys.chunks(REMOVAL_CHUNK as usize) {
        recorded += record_deleted(txn, &mut batch, chunk.iter().copied(), chunk.len()).await?;
    }
    let mut deleted = 0u64;
    for chunk in row_ids.chunks(REMOVAL_CHUNK as usize) {
        deleted += delete_records_by_id(txn, chunk).await?;
    }
    close_batch(txn, &batch, recorded, crate::db::now()).await?;
    Ok(deleted)
}

/// Records a `deleted` change for each of `count` keys in `batch`.
async fn record_deleted<'k>(
    txn: &impl ConnectionTrait,
    batch: &mut ChangeBatch,
    keys: impl IntoIterator<Item = &'k str>,
    count: usize,
) -> Result<u64, DbErr> {
    let slot = batch.reserve(count)?;
    changes::record_changes(txn, slot, ChangeKind::Deleted, keys).await
}

/// Stamps `batch` as the transaction's last statement, or removes it when it recorded
/// nothing, so that the transaction takes no seq.
async fn close_batch(
    txn: &impl ConnectionTrait,
    batch: &ChangeBatch,
    recorded: u64,
    now: DateTime<Utc>,
) -> Result<(), DbErr> {
    match recorded {
        0 => changes::discard_batch(txn, batch).await,
        _ => changes::stamp_batch(txn, batch, now).await,
    }
}

/// Records whose namespace is `provider` or one of its streams' (`provider.STREAM`). A
/// prefix compared for equality, not `LIKE`: `_` is a wildcard there and is allowed in
/// provider names.
pub(crate) fn of_provider(provider: &str) -> Condition {
    let prefix = format!("{provider}.");
    // A provider name is at most 64 characters; PostgreSQL's substr takes 32-bit integers.
    let length = i32::try_from(prefix.chars().count()).unwrap_or(i32::MAX);
    let head = Func::cust("SUBSTR").args([
        Expr::col(record::Column::Provider),
        Expr::val(1i32),
        Expr::val(length),
    ]);
    Condition::any()
        .add(record::Column::Provider.eq(provider))
        .add(Expr::expr(head).eq(prefix))
}

/// Deletes the records with these ids; returns how many. The caller bounds `ids` to what
/// one statement may bind.
async fn delete_records_by_id(db: &impl ConnectionTrait, ids: &[i64]) -> Result<u64, DbErr> {
    let result = record::Entity::delete_many()
        .filter(record::Column::Id.is_in(ids.iter().copied()))
        .exec(db)
        .await?;
    Ok(result.rows_affected)
}
