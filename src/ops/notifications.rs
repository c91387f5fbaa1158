//! The webhook deliveries (`notification_deliveries`), newest first.

use chrono::Utc;
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use serde::Deserialize;

use super::{check_limit, OpsError, Page};
use crate::entities::notification_delivery::{self, DeliveryStatus};

/// The largest page of deliveries.
pub const MAX_LIMIT: u64 = 1_000;

/// Which deliveries to list.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct DeliveriesQuery {
    /// Only those given up after `give_up_after`.
    pub failed_only: bool,
    /// Only deliveries older than this one (by row id: the `next` of the page before).
    pub before: Option<i64>,
    /// At most this many (1 to [`MAX_LIMIT`]).
    pub limit: u64,
}

/// The newest deliveries that match `query`.
pub async fn list(
    db: &DatabaseConnection,
    query: &DeliveriesQuery,
) -> Result<Page<notification_delivery::Model>, OpsError> {
    let limit = check_limit(query.limit, MAX_LIMIT)?;
    let mut select = notification_delivery::Entity::find();
    if query.failed_only {
        select = select.filter(notification_delivery::Column::Status.eq(DeliveryStatus::Failed));
    }
    if let Some(before) = query.before {
        select = select.filter(notification_delivery::Column::Id.lt(before));
    }
    let rows = select
        .order_by_desc(notification_delivery::Column::Id)
        .limit(limit.saturating_add(1))
        .all(db)
        .await?;
    Ok(Page::from_rows(rows, limit, |delivery| delivery.id))
}

/// Which delivery: the API names it by its row id, the CLI by the `delivery_id` it shows.
#[derive(Clone, Debug)]
pub(crate) enum DeliveryRef {
    Id(i64),
    DeliveryId(String),
}

/// Makes a delivered or given-up delivery pending again and due now, so that the
/// daemon's next pass sends it once more with its original `delivery_id` and body. A
/// given-up delivery is tried once (its deadline has passed), a delivered one sent again;
/// until then it heads its connection's queue. A delivery already pending is a conflict.
pub(crate) async fn redeliver(
    db: &DatabaseConnection,
    which: &DeliveryRef,
) -> Result<notification_delivery::Model, OpsError> {
    use notification_delivery::Column;
    let (matches, what) = match which {
        DeliveryRef::Id(id) => (Column::Id.eq(*id), format!("delivery with id {id}")),
        DeliveryRef::DeliveryId(uuid) => (
            Column::DeliveryId.eq(uuid.as_str()),
            format!(
                "delivery {:?}",
                tributary_providers::quote::truncated(uuid, 64)
            ),
        ),
    };
    // One conditional UPDATE, so that two callers (or a worker settling an attempt) never
    // both move the row.
    let changed = notification_delivery::Entity::update_many()
        .col_expr(Column::Status, Expr::value(DeliveryStatus::Pending))
        .col_expr(Column::NextAttemptAt, Expr::value(crate::db::now()))
        .col_expr(
            Column::DeliveredAt,
            Expr::value(None::<chrono::DateTime<Utc>>),
        )
        .filter(matches.clone())
        .filter(Column::Status.ne(DeliveryStatus::Pending))
        .exec(db)
        .await?
        .rows_affected;
    let row = notification_delivery::Entity::find()
        .filter(matches)
        .one(db)
        .await?
        .ok_or_else(|| OpsError::NotFound {
            what: what.clone(),
            hint: "; `tributary notifications` lists them",
        })?;
    if changed == 0 {
        return Err(OpsError::Conflict(format!(
            "the {what} is already pending: the daemon sends it when it is due"
        )));
    }
    Ok(row)
}
