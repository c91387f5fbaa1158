//! `/v1/connections/{id}/syncs`: where a connection's syncs stand, stream by stream, and a
//! run asked for now, queued as a job that the first free instance claims, before
//! scheduled ones.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::{Authorized, ConnectionsRead, SyncsWrite};
use super::connections::path_id;
use super::input::Json;
use super::jobs::Job;
use super::problem::Problem;
use super::state::ApiState;
use crate::ops::sync_status as status;

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

/// A run, briefly (`/v1/runs/{id}` has all its counters).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RunBrief {
    pub id: i64,
    /// `manual`, `schedule` or `replay`.
    pub trigger: String,
    /// `running`, `succeeded`, `partial`, `failed`, `interrupted` or `deferred`.
    pub status: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Refreshed with every page the run commits.
    pub heartbeat_at: DateTime<Utc>,
    pub pages_fetched: i64,
    pub records_fetched: i64,
    pub records_failed: i64,
    /// Why it failed or stopped early.
    pub error: Option<String>,
}

impl From<status::RunBrief> for RunBrief {
    fn from(run: status::RunBrief) -> RunBrief {
        RunBrief {
            id: run.id,
            trigger: run.trigger.to_string(),
            status: run.status.to_string(),
            started_at: run.started_at,
            finished_at: run.finished_at,
            heartbeat_at: run.heartbeat_at,
            pages_fetched: run.pages_fetched,
            records_fetched: run.records_fetched,
            records_failed: run.records_failed,
            error: run.error,
        }
    }
}

/// Where one stream's syncs stand.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct StreamSyncs {
    /// The stream; absent for a connection whose provider config.toml no longer has.
    pub stream: Option<String>,
    /// `healthy`, `never_synced`, `degraded` (the last run's records partly failed) or
    /// `failing` (the last run failed).
    pub health: String,
    /// The run going now.
    pub running: Option<RunBrief>,
    /// The running job that covers the stream.
    pub running_job_id: Option<i64>,
    /// The latest run that ended.
    pub last_run: Option<RunBrief>,
    /// Failed runs since the last one that did not fail (counted over the latest 20).
    pub failures_in_a_row: u32,
    pub last_success_run_id: Option<i64>,
    pub last_success_at: Option<DateTime<Utc>>,
    /// The cron expression (with seconds) that applies.
    pub schedule: Option<String>,
    /// `stream`, `connection` or `provider`: whose schedule it is.
    pub schedule_from: String,
    /// The schedule's next slot; absent while it or its connection is paused, or the
    /// connection disabled.
    pub next_slot: Option<DateTime<Utc>>,
    /// Since when the stream is paused (left out of its schedules while the connection's
    /// other streams go on); absent when it is not.
    pub paused_at: Option<DateTime<Utc>>,
    /// Where the next incremental run starts.
    pub cursor: Option<String>,
    /// Whether a run stopped midway and the next one goes on from its checkpoint.
    pub unfinished_run: bool,
    /// Full passes the provider's `full_sync_schedule` still owes it.
    pub full_passes_owed: i64,
}

/// Where a connection's syncs stand.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SyncStatus {
    pub connection_id: i64,
    pub provider: String,
    pub user_id: String,
    pub enabled: bool,
    /// Since when it is paused (left out of its schedules); absent when it is not.
    pub paused_at: Option<DateTime<Utc>>,
    /// Since when the provider has refused its authorization (scheduled runs skip it
    /// until a reconnect or a run that succeeds); absent when it has not.
    pub needs_reconnect_since: Option<DateTime<Utc>>,
    /// The worst of its streams': `healthy`, `never_synced`, `degraded` or `failing`.
    pub health: String,
    /// Its running and queued jobs, newest first: the first 100 (each stream's running
    /// job is also its `running_job_id`).
    pub jobs: Vec<Job>,
    /// The cursor of the page after `jobs` at `GET
    /// /v1/jobs?connection_id=ID&status=active`; absent when `jobs` holds them all.
    pub jobs_next: Option<String>,
    pub streams: Vec<StreamSyncs>,
}

impl SyncStatus {
    /// `status`, with `jobs_next` the cursor of its jobs' next page.
    fn of(status: status::SyncStatus, jobs_next: Option<String>) -> SyncStatus {
        SyncStatus {
            connection_id: status.connection_id,
            provider: status.provider,
            user_id: status.user_id,
            enabled: status.enabled,
            paused_at: status.paused_at,
            needs_reconnect_since: status.needs_reconnect_since,
            health: status.health.to_string(),
            jobs: status.jobs.into_iter().map(Job::from).collect(),
            jobs_next,
            streams: status
                .streams
                .into_iter()
                .map(|stream| StreamSyncs {
                    stream: stream.stream,
                    health: stream.health.to_string(),
                    running: stream.running.map(RunBrief::from),
                    running_job_id: stream.running_job_id,
                    last_run: stream.last_run.map(RunBrief::from),
                    failures_in_a_row: stream.failures_in_a_row,
                    last_success_run_id: stream.last_success_run_id,
                    last_success_at: stream.last_success_at,
                    schedule: stream.schedule,
                    schedule_from: stream.schedule_from.to_string(),
                    next_slot: stream.next_slot,
                    paused_at: stream.paused_at,
                    cursor: stream.cursor,
                    unfinished_run: stream.unfinished_run,
                    full_passes_owed: stream.full_passes_owed,
                })
                .collect(),
        }
    }
}

/// Where a connection's syncs stand: per stream the run going and its job, the last run
/// and its outcome, the next slot, the cursor and the health; the jobs waiting.
#[utoipa::path(
    get,
    path = "/v1/connections/{id}/syncs",
    params(("id" = i64, Path, description = "The connection's id")),
    security(("bearer" = ["connections:read"])),
    responses(
        (status = 200, description = "The connection's syncs", body = SyncStatus),
        (status = 400, description = "The id is not a number", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks connections:read", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No connection has this id", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn sync_status(
    _caller: Authorized<ConnectionsRead>,
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<axum::Json<SyncStatus>, Problem> {
    let id = path_id(&id)?;
    let status = status::status(&state.db, &state.settings, id).await?;
    let jobs_next = match status.jobs_next {
        Some(before) => Some(super::jobs::active_jobs_cursor(
            state.database_id().await?,
            id,
            before,
        )),
        None => None,
    };
    Ok(axum::Json(SyncStatus::of(status, jobs_next)))
}
