//! Connection events in the webhook outbox (`notification_deliveries`): created,
//! reconnected, authorization failed, recovered. Each is written in the transaction of
//! the change it reports, so it commits with it or not at all, and is sent by the
//! delivery worker as a run's notification is, in order with the connection's other
//! deliveries. A body holds who and what, never a credential.

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DbErr, EntityTrait, Set};
use serde::Serialize;

use crate::entities::connection;
use crate::entities::notification_delivery::{self, DeliveryEvent, DeliveryStatus};

/// A connection event to write.
pub(crate) struct ConnectionEvent<'a> {
    pub connection_id: i64,
    pub event: DeliveryEvent,
    /// Names the transition within the connection's events of this kind (a session id,
    /// when `needs_reconnect_since` was set), so that the idempotency key is unique.
    pub transition: &'a str,
    pub now: DateTime<Utc>,
}

/// The JSON a receiver gets. The field names are a contract with receivers.
#[derive(Serialize)]
struct Body<'a> {
    delivery_id: &'a str,
    event: DeliveryEvent,
    connection_id: i64,
    user_id: &'a str,
    provider: &'a str,
    account_id: Option<&'a str>,
    at: DateTime<Utc>,
}

/// Writes `event` into `txn`, reading the connection's row there; returns its delivery id.
pub(crate) async fn write(
    txn: &impl ConnectionTrait,
    event: &ConnectionEvent<'_>,
) -> Result<String, DbErr> {
    let row = connection::Entity::find_by_id(event.connection_id)
        .one(txn)
        .await?
        .ok_or_else(|| DbErr::RecordNotFound(format!("connection {}", event.connection_id)))?;
    let delivery_id = uuid::Uuid::new_v4().to_string();
    let body = Body {
        delivery_id: &delivery_id,
        event: event.event,
        connection_id: row.id,
        user_id: &row.user_id,
        provider: &row.provider,
        account_id: row.account_id.as_deref(),
        at: event.now,
    };
    let body = serde_json::to_string(&body)
        .map_err(|error| DbErr::Custom(format!("serialising the connection event: {error}")))?;
    let event_key = format!("{}:{}:{}", event.event, row.id, event.transition);
    let delivery = notification_delivery::ActiveModel {
        delivery_id: Set(delivery_id.clone()),
        run_id: Set(None),
        user_id: Set(row.user_id),
        provider: Set(row.provider),
        body: Set(body),
        status: Set(DeliveryStatus::Pending),
        attempts: Set(0),
        last_error: Set(None),
        next_attempt_at: Set(event.now),
        created_at: Set(event.now),
        delivered_at: Set(None),
        event: Set(event.event),
        event_key: Set(Some(event_key)),
        ..Default::default()
    };
    notification_delivery::Entity::insert(delivery)
        .exec_without_returning(txn)
        .await?;
    tracing::debug!(
        connection_id = event.connection_id,
        delivery_id,
        event = %event.event,
        "Connection event queued."
    );
    Ok(delivery_id)
}
