//! `webhook_deliveries`: the inbox of verified provider webhooks, written before the
//! delivery is answered and applied after (docs/decisions/inbound-webhooks.md).

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, serde::Serialize)]
#[sea_orm(table_name = "webhook_deliveries")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    /// The provider's name in config.toml.
    pub provider: String,
    /// The provider's id of the delivery (or of its event); unique with `provider`.
    pub delivery_id: String,
    /// The event's type when the delivery names one (`issues`, `charge.refunded`).
    pub event_type: Option<String>,
    pub received_at: DateTimeUtc,
    /// The body exactly as received and verified.
    #[sea_orm(column_type = "Text")]
    pub body: String,
    pub status: InboxStatus,
    /// Attempts to apply it started.
    pub attempts: i64,
    /// When the next attempt to apply it is due.
    pub next_attempt_at: DateTimeUtc,
    /// Why the last attempt failed.
    #[sea_orm(column_type = "Text", nullable)]
    pub error: Option<String>,
    pub applied_at: Option<DateTimeUtc>,
    /// The provider-side account ids the delivery names, read at receipt, separated by
    /// spaces (GitHub's installation, repository owner and sender). Empty: a Stripe
    /// platform's own event, for the connections without an account id. `None`: it
    /// names no account, and matches no connection.
    pub account_ids: Option<String>,
    /// The connection it was routed to (the first, when several have the account).
    pub connection_id: Option<i64>,
    /// The webhook job it queued or joined.
    pub job_id: Option<i64>,
}

/// Where a delivery stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum, serde::Serialize)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(16))")]
#[serde(rename_all = "lowercase")]
pub enum InboxStatus {
    /// Verified and kept; not applied yet.
    #[sea_orm(string_value = "received")]
    Received,
    /// Applied to its connection's records.
    #[sea_orm(string_value = "applied")]
    Applied,
    /// No connection has the account it names.
    #[sea_orm(string_value = "unmatched")]
    Unmatched,
    /// Still failing after its retries; `error` says why.
    #[sea_orm(string_value = "failed")]
    Failed,
}

super::display_as_stored!(InboxStatus);

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
