//! Deleting records: the writes to `records` that are not a page being stored. They live
//! here so that the pipeline stays the one writer of the table; the commands that delete
//! (`connections remove --delete-records`, `reconcile`) call these inside their own
//! transactions.

use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter};

use crate::entities::record;

/// Deletes every record of the connection (user_id, provider); returns how many.
pub async fn delete_connection_records(
    db: &impl ConnectionTrait,
    user_id: &str,
    provider: &str,
) -> Result<u64, DbErr> {
    let result = record::Entity::delete_many()
        .filter(record::Column::UserId.eq(user_id))
        .filter(record::Column::Provider.eq(provider))
        .exec(db)
        .await?;
    Ok(result.rows_affected)
}

/// Deletes the records with these ids; returns how many. The caller bounds `ids` to what
/// one statement may bind.
pub async fn delete_records_by_id(db: &impl ConnectionTrait, ids: &[i64]) -> Result<u64, DbErr> {
    let result = record::Entity::delete_many()
        .filter(record::Column::Id.is_in(ids.iter().copied()))
        .exec(db)
        .await?;
    Ok(result.rows_affected)
}
