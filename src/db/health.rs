//! A connection's health: `needs_reconnect_since` is set when the provider revoked its
//! authorization and cleared when it works again. Each change is one conditional
//! `UPDATE`, so of two writers only one sees the change happen.

use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter};

use crate::entities::connection;

/// Marks connection `id` as needing a reconnect since `now`; returns whether it was
/// healthy until now.
pub(crate) async fn mark_needs_reconnect(
    db: &impl ConnectionTrait,
    id: i64,
    now: DateTime<Utc>,
) -> Result<bool, DbErr> {
    let marked = connection::Entity::update_many()
        .col_expr(
            connection::Column::NeedsReconnectSince,
            Expr::value(Some(now)),
        )
        .filter(connection::Column::Id.eq(id))
        .filter(connection::Column::NeedsReconnectSince.is_null())
        .exec(db)
        .await?;
    Ok(marked.rows_affected == 1)
}

/// Clears connection `id`'s need to reconnect; returns whether it was set.
pub(crate) async fn clear_needs_reconnect(
    db: &impl ConnectionTrait,
    id: i64,
) -> Result<bool, DbErr> {
    let cleared = connection::Entity::update_many()
        .col_expr(
            connection::Column::NeedsReconnectSince,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .filter(connection::Column::Id.eq(id))
        .filter(connection::Column::NeedsReconnectSince.is_not_null())
        .exec(db)
        .await?;
    Ok(cleared.rows_affected == 1)
}
