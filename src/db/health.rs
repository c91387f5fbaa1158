//! A connection's health: `needs_reconnect_since` is set when the provider revoked its
//! authorization and cleared when it works again. Each change is one conditional
//! `UPDATE`, so of two writers only one sees the change happen, and only that one writes
//! the change's connection event (when `[notify]` is on).

use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QuerySelect};

use super::connection_events::{self, ConnectionEvent};
use crate::config::NotifyRuns;
use crate::entities::connection;
use crate::entities::notification_delivery::DeliveryEvent;

/// Whether a change of health is announced in the webhook outbox (`[notify]` is on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Announce {
    Yes,
    No,
}

impl Announce {
    /// Whether a provider with these `[notify]` settings announces its connections' events:
    /// whenever `[notify]` is on, whichever runs it notifies.
    pub(crate) fn under(notify: NotifyRuns) -> Announce {
        match notify {
            NotifyRuns::None => Announce::No,
            NotifyRuns::Changed | NotifyRuns::All => Announce::Yes,
        }
    }
}

/// Marks connection `id` as needing a reconnect since `now`, in `txn`; returns whether it
/// was healthy until now. The change writes a `connection.authorization_failed` event.
pub(crate) async fn mark_needs_reconnect(
    txn: &impl ConnectionTrait,
    id: i64,
    now: DateTime<Utc>,
    announce: Announce,
) -> Result<bool, DbErr> {
    let marked = connection::Entity::update_many()
        .col_expr(
            connection::Column::NeedsReconnectSince,
            Expr::value(Some(now)),
        )
        .filter(connection::Column::Id.eq(id))
        .filter(connection::Column::NeedsReconnectSince.is_null())
        .exec(txn)
        .await?;
    let changed = marked.rows_affected == 1;
    if changed && announce == Announce::Yes {
        let transition = now.timestamp_micros().to_string();
        let event = ConnectionEvent {
            connection_id: id,
            event: DeliveryEvent::ConnectionAuthorizationFailed,
            transition: &transition,
            now,
        };
        connection_events::write(txn, &event).await?;
    }
    Ok(changed)
}

/// Clears connection `id`'s need to reconnect, in `txn`; returns whether it was set. The
/// change writes a `connection.recovered` event.
pub(crate) async fn clear_needs_reconnect(
    txn: &impl ConnectionTrait,
    id: i64,
    now: DateTime<Utc>,
    announce: Announce,
) -> Result<bool, DbErr> {
    let since: Option<DateTime<Utc>> = connection::Entity::find_by_id(id)
        .select_only()
        .column(connection::Column::NeedsReconnectSince)
        .into_tuple::<Option<DateTime<Utc>>>()
        .one(txn)
        .await?
        .flatten();
    let Some(since) = since else {
        return Ok(false);
    };
    let cleared = connection::Entity::update_many()
        .col_expr(
            connection::Column::NeedsReconnectSince,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .filter(connection::Column::Id.eq(id))
        .filter(connection::Column::NeedsReconnectSince.is_not_null())
        .exec(txn)
        .await?;
    let changed = cleared.rows_affected == 1;
    if changed && announce == Announce::Yes {
        // The episode it ends names it: one recovery per time the connection was marked.
        let transition = since.timestamp_micros().to_string();
        let event = ConnectionEvent {
            connection_id: id,
            event: DeliveryEvent::ConnectionRecovered,
            transition: &transition,
            now,
        };
        connection_events::write(txn, &event).await?;
    }
    Ok(changed)
}
