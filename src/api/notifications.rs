//! `/v1/notifications`: the webhook deliveries and where each stands, newest first, and
//! sending one again.
//!
//! Their own scopes, `notifications:read` and `notifications:write`: a backend that
//! receives the webhooks can check and resend them without reading records or keys.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::{Authorized, NotificationsRead, NotificationsWrite};
use super::connections::path_id;
use super::input::{IdCursors, Query};
use super::problem::Problem;
use super::state::ApiState;
use crate::entities::notification_delivery::{self, DeliveryStatus};
use crate::ops::notifications::{self as ops, DeliveriesQuery, DeliveryRef};

const LIST: &str = "notifications";
const DEFAULT_LIMIT: u64 = 100;

/// One webhook delivery: a run's notification or a connection event.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Delivery {
    /// The row's id, for `/v1/notifications/{id}/redeliver`.
    pub id: i64,
    /// Sent as `Tributary-Delivery` and in the body: receivers deduplicate on it.
    pub delivery_id: String,
    /// `run`, `connection.created`, `connection.reconnected`,
    /// `connection.authorization_failed` or `connection.recovered`.
    pub event: String,
    /// The run a run notification reports; absent for a connection event.
    pub run_id: Option<i64>,
    pub user_id: String,
    pub provider: String,
    /// `pending` (not yet answered with a 2xx), `delivered` or `failed` (given up).
    pub status: String,
    /// Attempts started.
    pub attempts: i64,
    /// Why the last attempt failed.
    pub last_error: Option<String>,
    /// For a pending delivery: when it is tried next.
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub delivered_at: Option<DateTime<Utc>>,
    /// The JSON body POSTed, exactly as signed.
    pub body: String,
}

impl From<notification_delivery::Model> for Delivery {
    fn from(row: notification_delivery::Model) -> Delivery {
        Delivery {
            id: row.id,
            delivery_id: row.delivery_id,
            event: row.event.to_string(),
            run_id: row.run_id,
            user_id: row.user_id,
            provider: row.provider,
            status: row.status.to_string(),
            attempts: row.attempts,
            last_error: row.last_error,
            next_attempt_at: (row.status == DeliveryStatus::Pending).then_some(row.next_attempt_at),
            created_at: row.created_at,
            delivered_at: row.delivered_at,
            body: row.body,
        }
    }
}

/// A page of deliveries.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DeliveryPage {
    pub items: Vec<Delivery>,
    /// Pass it as `cursor` for the next page; absent on the last page.
    pub next: Option<String>,
}

/// Which deliveries to list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct DeliveriesParams {
    /// Only those given up (`failed`).
    failed: Option<bool>,
    /// The `next` of the page before.
    cursor: Option<String>,
    /// At most this many deliveries (1 to 1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u64>,
}

/// List webhook deliveries, newest first.
#[utoipa::path(
    get,
    path = "/v1/notifications",
    params(DeliveriesParams),
    security(("bearer" = ["notifications:read"])),
    responses(
        (status = 200, description = "A page of deliveries", body = DeliveryPage),
        (status = 400, description = "A query parameter is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks notifications:read", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn list_deliveries(
    _caller: Authorized<NotificationsRead>,
    State(state): State<ApiState>,
    Query(params): Query<DeliveriesParams>,
) -> Result<axum::Json<DeliveryPage>, Problem> {
    let failed_only = params.failed.unwrap_or(false);
    let cursors = IdCursors::new(LIST, state.database_id().await?, &failed_only);
    let query = DeliveriesQuery {
        failed_only,
        before: cursors.decode(params.cursor.as_deref())?,
        limit: params.limit.unwrap_or(DEFAULT_LIMIT),
    };
    let page = ops::list(state.db.main(), &query).await?;
    Ok(axum::Json(DeliveryPage {
        items: page.items.into_iter().map(Delivery::from).collect(),
        next: page.next.map(|id| cursors.encode(id)),
    }))
}

/// Send a delivered or given-up delivery again, with its original id and body.
#[utoipa::path(
    post,
    path = "/v1/notifications/{id}/redeliver",
    params(("id" = i64, Path, description = "The delivery's row id (`id`)")),
    security(("bearer" = ["notifications:write"])),
    responses(
        (status = 202, description = "Pending again: the daemon's next pass sends it", body = Delivery),
        (status = 400, description = "The id is not a number", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks notifications:write", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No delivery has this id", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The delivery is already pending", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn redeliver(
    _caller: Authorized<NotificationsWrite>,
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<(StatusCode, axum::Json<Delivery>), Problem> {
    let id = path_id(&id)?;
    let delivery = ops::redeliver(state.db.main(), &DeliveryRef::Id(id)).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(Delivery::from(delivery))))
}
