//! The deliveries table as the worker uses it: which deliveries are due, claiming one, and
//! settling an attempt.
//!
//! A claim is one conditional `UPDATE` that counts the attempt and moves
//! `next_attempt_at` past the attempt's longest duration, on the condition that the row
//! is still pending, due, and at the attempt count that was read. Of several daemons that
//! read the same row, one changes it and the others find nothing to change; a daemon that
//! dies mid-attempt leaves a row that falls due again when the claim lapses. The attempt
//! count is the claim's token: an attempt is settled only if the count is still its own.

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Query};
use sea_orm::{
    ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
};

use crate::entities::notification_delivery::{Column, DeliveryStatus, Entity, Model};

/// The pending deliveries due at `now` that are each the oldest pending one of their
/// connection: a connection's later delivery waits until the earlier one is delivered or
/// given up, so each connection's notifications arrive in order.
pub(super) async fn due(
    db: &DatabaseConnection,
    now: DateTime<Utc>,
    limit: u64,
) -> Result<Vec<Model>, DbErr> {
    let earlier = Alias::new("earlier");
    let earlier_pending = Query::select()
        .expr(Expr::val(1))
        .from_as(Entity, earlier.clone())
        .and_where(Expr::col((earlier.clone(), Column::UserId)).equals((Entity, Column::UserId)))
        .and_where(
            Expr::col((earlier.clone(), Column::Provider)).equals((Entity, Column::Provider)),
        )
        .and_where(Expr::col((earlier.clone(), Column::Status)).eq(DeliveryStatus::Pending))
        .and_where(Expr::col((earlier, Column::Id)).lt(Expr::col((Entity, Column::Id))))
        .to_owned();
    Entity::find()
        .filter(Column::Status.eq(DeliveryStatus::Pending))
        .filter(Column::NextAttemptAt.lte(now))
        .filter(Expr::exists(earlier_pending).not())
        .order_by_asc(Column::NextAttemptAt)
        .order_by_asc(Column::Id)
        .limit(limit)
        .all(db)
        .await
}

/// Claims `delivery` for one attempt until `until`. Returns the attempt's number, or
/// `None` when another worker claimed it first.
pub(super) async fn claim(
    db: &DatabaseConnection,
    delivery: &Model,
    now: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<Option<i64>, DbErr> {
    let Some(attempt) = delivery.attempts.checked_add(1) else {
        return Ok(None);
    };
    let claimed = Entity::update_many()
        .col_expr(Column::Attempts, Expr::value(attempt))
        .col_expr(Column::NextAttemptAt, Expr::value(until))
        .filter(Column::Id.eq(delivery.id))
        .filter(Column::Status.eq(DeliveryStatus::Pending))
        .filter(Column::Attempts.eq(delivery.attempts))
        .filter(Column::NextAttemptAt.lte(now))
        .exec(db)
        .await?
        .rows_affected;
    Ok((claimed == 1).then_some(attempt))
}

/// How an attempt ended, as the row records it.
pub(super) enum Settle {
    Delivered {
        at: DateTime<Utc>,
    },
    Retry {
        error: String,
        at: DateTime<Utc>,
    },
    /// `at` is when it was given up: made pending again by hand, it is due at once.
    GiveUp {
        error: String,
        at: DateTime<Utc>,
    },
}

/// Records how attempt `attempt` of delivery `id` ended. Returns false when the claim was
/// no longer ours (it lapsed and another worker took the delivery over).
pub(super) async fn settle(
    db: &DatabaseConnection,
    id: i64,
    attempt: i64,
    settle: Settle,
) -> Result<bool, DbErr> {
    let update = Entity::update_many();
    let update = match settle {
        Settle::Delivered { at } => update
            .col_expr(Column::Status, Expr::value(DeliveryStatus::Delivered))
            .col_expr(Column::DeliveredAt, Expr::value(at)),
        Settle::Retry { error, at } => update
            .col_expr(Column::LastError, Expr::value(error))
            .col_expr(Column::NextAttemptAt, Expr::value(at)),
        Settle::GiveUp { error, at } => update
            .col_expr(Column::Status, Expr::value(DeliveryStatus::Failed))
            .col_expr(Column::LastError, Expr::value(error))
            .col_expr(Column::NextAttemptAt, Expr::value(at)),
    };
    let settled = update
        .filter(Column::Id.eq(id))
        .filter(Column::Status.eq(DeliveryStatus::Pending))
        .filter(Column::Attempts.eq(attempt))
        .exec(db)
        .await?
        .rows_affected;
    Ok(settled == 1)
}
