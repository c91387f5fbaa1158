//! `/v1/connections/{id}/syncs`: a run of a connection asked for now, queued as a job that
//! the first free instance claims, before scheduled ones.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::{Authorized, SyncsWrite};
use super::connections::path_id;
use super::input::Json;
use super::problem::Problem;
use super::state::ApiState;

/// What to sync; absent fields take their defaults.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SyncRequest {
    /// One stream of the connection; absent: every stream its provider syncs.
    stream: Option<String>,
    /// Ignore the incremental cursor and walk the whole listing.
    #[serde(default)]
    full: bool,
}

/// The job queued.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SyncJob {
    /// The job in `sync_jobs` (`tributary jobs` lists it).
    job_id: i64,
    connection_id: i64,
    provider: String,
    user_id: String,
    /// Empty: every stream the provider syncs.
    stream: String,
    full: bool,
    /// `queued`: an instance's worker starts it when it is free.
    status: &'static str,
}

/// Sync a connection now.
#[utoipa::path(
    post,
    path = "/v1/connections/{id}/syncs",
    params(("id" = i64, Path, description = "The connection's id", minimum = 1)),
    request_body = SyncRequest,
    security(("bearer" = ["syncs:write"])),
    responses(
        (status = 202, description = "The run is queued as a job", body = SyncJob,
            links(("GetConnection" = (operation_id = "get_connection", parameters(("id" = "$response.body#/connection_id")))))),
        (status = 400, description = "The body, the id or the stream is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks syncs:write", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No connection has this id", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The connection or its provider is disabled", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "The body is larger than [api] max_body_bytes", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is not JSON", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn trigger_sync(
    _caller: Authorized<SyncsWrite>,
    State(state): State<ApiState>,
    Path(id): Path<String>,
    Json(request): Json<SyncRequest>,
) -> Result<(StatusCode, axum::Json<SyncJob>), Problem> {
    let id = path_id(&id)?;
    let queued = crate::ops::sync::queue_connection(
        &state.db,
        &state.settings,
        id,
        request.stream.as_deref(),
        request.full,
    )
    .await?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(SyncJob {
            job_id: queued.job_id,
            connection_id: id,
            provider: queued.provider,
            user_id: queued.user_id,
            stream: queued.stream,
            full: request.full,
            status: "queued",
        }),
    ))
}
