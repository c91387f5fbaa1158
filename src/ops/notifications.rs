//! The webhook deliveries (`notification_deliveries`), newest first.

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
