//! Deleting records: the writes to `records` that are not a page being stored. They live
//! here so that the pipeline stays the one writer of the table; the commands that delete
//! (`connections remove --delete-records`, `reconcile`) call these inside their own
//! transactions.

use sea_orm::sea_query::{Condition, Expr, ExprTrait, Func};
use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter};

use crate::entities::record;

/// Deletes every record of the connection (user_id, provider), in all its streams'
/// namespaces (`provider` and `provider.*`); returns how many.
pub async fn delete_connection_records(
    db: &impl ConnectionTrait,
    user_id: &str,
    provider: &str,
) -> Result<u64, DbErr> {
    let result = record::Entity::delete_many()
        .filter(record::Column::UserId.eq(user_id))
        .filter(of_provider(provider))
        .exec(db)
        .await?;
    Ok(result.rows_affected)
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
pub async fn delete_records_by_id(db: &impl ConnectionTrait, ids: &[i64]) -> Result<u64, DbErr> {
    let result = record::Entity::delete_many()
        .filter(record::Column::Id.is_in(ids.iter().copied()))
        .exec(db)
        .await?;
    Ok(result.rows_affected)
}
