//! `/v1/jobs`: the sync jobs, newest first; one job (what `POST
//! /v1/connections/{id}/syncs` returned, or any other), and `/cancel` to cancel it.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::{Authorized, ConnectionsRead, SyncsWrite};
use super::connections::path_id;
use super::input::{IdCursors, Query};
use super::problem::Problem;
use super::state::ApiState;
use crate::entities::sync_job::JobStatus;
use crate::ops::jobs::{self as ops, JobState, JobView, JobsQuery};

const LIST: &str = "jobs";
const DEFAULT_LIMIT: u64 = 100;

/// A sync job: one connection's runs (one stream, or every stream its provider syncs),
/// queued, running or ended.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Job {
    pub id: i64,
    pub connection_id: i64,
    pub provider: String,
    pub user_id: String,
    /// Empty: every stream the provider syncs.
    pub stream: String,
    /// `scheduled`, `full`, `manual`, `retry` or `resume`.
    pub kind: String,
    /// `queued`, `running`, `done` (its runs ended: each run's own status is in
    /// `/v1/runs`), `skipped`, `failed` (its runs could not be recorded), `interrupted`
    /// (its instance shut down) or `cancelled`.
    pub status: String,
    /// The schedule slot a scheduled job is for.
    pub slot_at: Option<DateTime<Utc>>,
    /// Not started before this time.
    pub not_before: Option<DateTime<Utc>>,
    /// Tries before this one (retries, re-queues after an instance stopped).
    pub attempt: i32,
    pub full: bool,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// What its runs did (`run 12 succeeded`), or why it did not run.
    pub outcome: Option<String>,
    /// When someone asked to cancel it; a running job stops between pages.
    pub cancel_requested_at: Option<DateTime<Utc>>,
}

impl From<JobView> for Job {
    fn from(job: JobView) -> Job {
        Job {
            id: job.id,
            connection_id: job.connection_id,
            provider: job.provider,
            user_id: job.user_id,
            stream: job.stream,
            kind: job.kind.to_string(),
            status: job.status.to_string(),
            slot_at: job.slot_at,
            not_before: job.not_before,
            attempt: job.attempt,
            full: job.full,
            created_at: job.created_at,
            started_at: job.started_at,
            finished_at: job.finished_at,
            outcome: job.outcome,
            cancel_requested_at: job.cancel_requested_at,
        }
    }
}

/// A page of jobs.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct JobPage {
    pub items: Vec<Job>,
    /// Pass it as `cursor` for the next page; absent on the last page.
    pub next: Option<String>,
}

/// Which jobs to list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListParams {
    /// Only jobs in this state (`active`: queued or running).
    #[param(inline)]
    status: Option<JobState>,
    /// Only this connection's.
    #[param(minimum = 1)]
    connection_id: Option<i64>,
    provider: Option<String>,
    user_id: Option<String>,
    /// The `next` of the page before (or a sync status's `jobs_next`).
    cursor: Option<String>,
    /// At most this many jobs (1 to 1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u64>,
}

/// The filters a jobs cursor is bound to (status, connection, provider, user): a sync
/// status's `jobs_next` is made with those of `GET
/// /v1/jobs?connection_id=ID&status=active`, so it pages on there.
type Filters<'a> = (
    Option<JobState>,
    Option<i64>,
    Option<&'a str>,
    Option<&'a str>,
);

fn cursors(database: String, filters: &Filters<'_>) -> IdCursors {
    IdCursors::new(LIST, database, filters)
}

/// The cursor a sync status gives for the page after its `jobs`.
pub(super) fn active_jobs_cursor(database: String, connection_id: i64, before: i64) -> String {
    let filters: Filters<'_> = (Some(JobState::Active), Some(connection_id), None, None);
    cursors(database, &filters).encode(before)
}

/// List sync jobs, newest first.
#[utoipa::path(
    get,
    path = "/v1/jobs",
    params(ListParams),
    security(("bearer" = ["connections:read"])),
    responses(
        (status = 200, description = "A page of jobs", body = JobPage),
        (status = 400, description = "A query parameter is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks connections:read", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn list_jobs(
    _caller: Authorized<ConnectionsRead>,
    State(state): State<ApiState>,
    Query(params): Query<ListParams>,
) -> Result<axum::Json<JobPage>, Problem> {
    if params.connection_id.is_some_and(|id| id < 1) {
        return Err(Problem::invalid(
            "connection_id",
            "connection_id: a connection's id is a positive number",
        ));
    }
    let filters: Filters<'_> = (
        params.status,
        params.connection_id,
        params.provider.as_deref(),
        params.user_id.as_deref(),
    );
    let cursors = cursors(state.database_id().await?, &filters);
    let before = cursors.decode(params.cursor.as_deref())?;
    let query = JobsQuery {
        state: params.status,
        connection_id: params.connection_id,
        provider: params.provider.clone(),
        user_id: params.user_id.clone(),
        before,
        limit: params.limit.unwrap_or(DEFAULT_LIMIT),
    };
    let page = ops::list(state.db.main(), &query).await?;
    Ok(axum::Json(JobPage {
        items: page.items.into_iter().map(Job::from).collect(),
        next: page.next.map(|id| cursors.encode(id)),
    }))
}

/// Get a sync job.
#[utoipa::path(
    get,
    path = "/v1/jobs/{id}",
    params(("id" = i64, Path, description = "The job's id")),
    security(("bearer" = ["connections:read"])),
    responses(
        (status = 200, description = "The job", body = Job),
        (status = 400, description = "The id is not a number", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks connections:read", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No job has this id", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn get_job(
    _caller: Authorized<ConnectionsRead>,
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<axum::Json<Job>, Problem> {
    let id = path_id(&id)?;
    let job = ops::get(state.db.main(), id).await?;
    Ok(axum::Json(Job::from(job)))
}

/// Cancel a sync job. A queued job is cancelled at once and never runs (200). A running
/// job's instance, whichever it is, stops its run between pages within a poll (about a
/// second) and the job ends `cancelled`: the pages it committed are kept, the next run
/// goes on from the checkpoint, nothing is retried (202; poll `GET /v1/jobs/{id}`). The
/// job stays readable, cancelled, so this is an action on it rather than its `DELETE`.
#[utoipa::path(
    post,
    path = "/v1/jobs/{id}/cancel",
    params(("id" = i64, Path, description = "The job's id")),
    security(("bearer" = ["syncs:write"])),
    responses(
        (status = 200, description = "The job was queued and is cancelled", body = Job),
        (status = 202, description = "The job is running; its run is asked to stop", body = Job),
        (status = 400, description = "The id is not a number", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks syncs:write", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No job has this id", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The job has ended", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn cancel_job(
    _caller: Authorized<SyncsWrite>,
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<(StatusCode, axum::Json<Job>), Problem> {
    let id = path_id(&id)?;
    let job = ops::cancel(state.db.main(), id).await?;
    let status = match job.status {
        JobStatus::Cancelled => StatusCode::OK,
        _ => StatusCode::ACCEPTED,
    };
    Ok((status, axum::Json(Job::from(job))))
}
