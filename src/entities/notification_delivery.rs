//! `notification_deliveries`: one row per run that notifies, written in the transaction
//! that closes the run, and one per connection event, written in the transaction of the
//! change it reports; the daemon's delivery worker sends them.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, serde::Serialize)]
#[sea_orm(table_name = "notification_deliveries")]
pub struct Model {
    /// Orders a connection's deliveries: they are sent in this order.
    #[sea_orm(primary_key)]
    pub id: i64,
    /// A UUID, sent as `Tributary-Delivery` and in the body, for the receiver to
    /// deduplicate on.
    #[sea_orm(unique)]
    pub delivery_id: String,
    /// The run a run notification reports; `None` for a connection event.
    #[sea_orm(unique)]
    pub run_id: Option<i64>,
    pub user_id: String,
    pub provider: String,
    /// The JSON POSTed, exactly as signed.
    #[sea_orm(column_type = "Text")]
    pub body: String,
    pub status: DeliveryStatus,
    /// Attempts started, the one in flight included.
    pub attempts: i64,
    /// Why the last attempt failed: a bounded excerpt, secrets removed.
    #[sea_orm(column_type = "Text", nullable)]
    pub last_error: Option<String>,
    /// When a pending delivery may be tried next; while an attempt is in flight, when its
    /// claim lapses.
    pub next_attempt_at: DateTimeUtc,
    pub created_at: DateTimeUtc,
    pub delivered_at: Option<DateTimeUtc>,
    pub event: DeliveryEvent,
    /// A connection event's idempotency key (unique): the connection, the event and the
    /// transition it reports. `None` for a run, which `run_id` keys.
    #[sea_orm(unique)]
    pub event_key: Option<String>,
}

/// What a delivery reports. The stored names are the body's `event`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum, serde::Serialize)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(40))")]
pub enum DeliveryEvent {
    /// A run closed (every row from before connection events).
    #[sea_orm(string_value = "run")]
    #[serde(rename = "run")]
    Run,
    /// A user connected an account on the Connect page.
    #[sea_orm(string_value = "connection.created")]
    #[serde(rename = "connection.created")]
    ConnectionCreated,
    /// A user authorized an existing connection again on the Connect page.
    #[sea_orm(string_value = "connection.reconnected")]
    #[serde(rename = "connection.reconnected")]
    ConnectionReconnected,
    /// The provider revoked the authorization: the connection needs a reconnect.
    #[sea_orm(string_value = "connection.authorization_failed")]
    #[serde(rename = "connection.authorization_failed")]
    ConnectionAuthorizationFailed,
    /// A connection that needed a reconnect works again.
    #[sea_orm(string_value = "connection.recovered")]
    #[serde(rename = "connection.recovered")]
    ConnectionRecovered,
}

super::display_as_stored!(DeliveryEvent);

/// Where a delivery stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum, serde::Serialize)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(16))")]
#[serde(rename_all = "lowercase")]
pub enum DeliveryStatus {
    /// Not yet answered with a 2xx; retried until `give_up_after`.
    #[sea_orm(string_value = "pending")]
    Pending,
    /// The receiver answered 2xx.
    #[sea_orm(string_value = "delivered")]
    Delivered,
    /// Given up after `give_up_after`; kept for `tributary notifications --failed`.
    #[sea_orm(string_value = "failed")]
    Failed,
}

super::display_as_stored!(DeliveryStatus);

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
