//! `/v1/webhooks/deliveries`: the inbox of provider webhooks, newest first: where each
//! delivery stands, the connection and job it was routed to, why a failed one failed.
//!
//! Its own scope, `webhooks:read`: the bodies are records as the provider sent them.

use axum::extract::State;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::{Authorized, WebhooksRead};
use super::input::{IdCursors, Query};
use super::problem::Problem;
use super::state::ApiState;
use crate::entities::webhook_delivery::{self, InboxStatus};
use crate::ops::webhooks::{self as ops, InboxQuery};

const LIST: &str = "inbox";
const DEFAULT_LIMIT: u64 = 100;

/// One delivery a provider sent, verified and kept.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct InboundDelivery {
    pub id: i64,
    /// The provider's name in config.toml.
    pub provider: String,
    /// The provider's id of the delivery or its event: a repeat of it is not kept again.
    pub delivery_id: String,
    /// The event's type, when the delivery names one (`issues`, `charge.refunded`).
    pub event_type: Option<String>,
    /// `received` (not applied yet), `applied`, `unmatched` (no connection has its
    /// account) or `failed` (still failing after its retries).
    pub status: String,
    /// Attempts to apply it started.
    pub attempts: i64,
    /// Why the last attempt failed.
    pub error: Option<String>,
    /// The connection it was routed to.
    pub connection_id: Option<i64>,
    /// The job it queued or joined.
    pub job_id: Option<i64>,
    pub received_at: DateTime<Utc>,
    pub applied_at: Option<DateTime<Utc>>,
    /// The body exactly as received and verified.
    pub body: String,
}

impl From<webhook_delivery::Model> for InboundDelivery {
    fn from(row: webhook_delivery::Model) -> InboundDelivery {
        InboundDelivery {
            id: row.id,
            provider: row.provider,
            delivery_id: row.delivery_id,
            event_type: row.event_type,
            status: row.status.to_string(),
            attempts: row.attempts,
            error: row.error,
            connection_id: row.connection_id,
            job_id: row.job_id,
            received_at: row.received_at,
            applied_at: row.applied_at,
            body: row.body,
        }
    }
}

/// A page of inbound deliveries.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct InboundPage {
    pub items: Vec<InboundDelivery>,
    /// Pass it as `cursor` for the next page; absent on the last page.
    pub next: Option<String>,
}

/// Where a delivery stands, as a filter.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum InboundStatus {
    Received,
    Applied,
    Unmatched,
    Failed,
}

impl From<InboundStatus> for InboxStatus {
    fn from(status: InboundStatus) -> InboxStatus {
        match status {
            InboundStatus::Received => InboxStatus::Received,
            InboundStatus::Applied => InboxStatus::Applied,
            InboundStatus::Unmatched => InboxStatus::Unmatched,
            InboundStatus::Failed => InboxStatus::Failed,
        }
    }
}

/// Which deliveries to list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct InboxParams {
    /// Only this provider's (its name in config.toml).
    provider: Option<String>,
    /// Only those standing so.
    #[param(inline)]
    status: Option<InboundStatus>,
    /// The `next` of the page before.
    cursor: Option<String>,
    /// At most this many deliveries (1 to 1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u64>,
}

/// List inbound provider webhook deliveries, newest first.
#[utoipa::path(
    get,
    path = "/v1/webhooks/deliveries",
    params(InboxParams),
    security(("bearer" = ["webhooks:read"])),
    responses(
        (status = 200, description = "A page of inbound deliveries", body = InboundPage),
        (status = 400, description = "A query parameter is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks webhooks:read", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn list_inbox(
    _caller: Authorized<WebhooksRead>,
    State(state): State<ApiState>,
    Query(params): Query<InboxParams>,
) -> Result<axum::Json<InboundPage>, Problem> {
    let cursors = IdCursors::new(
        LIST,
        state.database_id().await?,
        &(&params.provider, &params.status),
    );
    let before = cursors.decode(params.cursor.as_deref())?;
    let query = InboxQuery {
        provider: params.provider.as_deref(),
        status: params.status.map(InboxStatus::from),
        before,
        limit: params.limit.unwrap_or(DEFAULT_LIMIT),
    };
    let page = ops::inbox(state.db.main(), &query).await?;
    Ok(axum::Json(InboundPage {
        items: page.items.into_iter().map(InboundDelivery::from).collect(),
        next: page.next.map(|id| cursors.encode(id)),
    }))
}
