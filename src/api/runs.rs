//! `/v1/runs`: the run history, newest first.

use axum::extract::{Path, State};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::{Authorized, ConnectionsRead};
use super::connections::path_id;
use super::input::{IdCursors, Query};
use super::problem::Problem;
use super::state::ApiState;
use crate::entities::sync_run;
use crate::ops::runs::{self as ops, RunsQuery};

const LIST: &str = "runs";
const DEFAULT_LIMIT: u64 = 100;

/// One run of one stream of one connection, with its counters.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Run {
    pub id: i64,
    pub user_id: String,
    pub provider: String,
    pub stream: Option<String>,
    /// `manual`, `schedule` or `replay`.
    pub trigger: String,
    /// `running`, `succeeded`, `partial`, `failed`, `interrupted` or `deferred`.
    pub status: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub heartbeat_at: DateTime<Utc>,
    pub pages_fetched: i64,
    pub records_fetched: i64,
    pub records_inserted: i64,
    pub records_updated: i64,
    pub records_unchanged: i64,
    pub records_duplicate: i64,
    pub records_failed: i64,
    pub watermark_anomalies: i64,
    pub records_deleted: i64,
    pub records_restored: i64,
    pub parents_skipped: i64,
    pub records_filtered: i64,
    /// Why it failed, when it did.
    pub error: Option<String>,
    /// For a `deferred` run: when its spent request budget reopens and it may resume.
    pub resume_at: Option<DateTime<Utc>>,
}

impl From<sync_run::Model> for Run {
    fn from(run: sync_run::Model) -> Run {
        Run {
            id: run.id,
            user_id: run.user_id,
            provider: run.provider,
            stream: run.stream,
            trigger: run.trigger.to_string(),
            status: run.status.to_string(),
            started_at: run.started_at,
            finished_at: run.finished_at,
            heartbeat_at: run.heartbeat_at,
            pages_fetched: run.pages_fetched,
            records_fetched: run.records_fetched,
            records_inserted: run.records_inserted,
            records_updated: run.records_updated,
            records_unchanged: run.records_unchanged,
            records_duplicate: run.records_duplicate,
            records_failed: run.records_failed,
            watermark_anomalies: run.watermark_anomalies,
            records_deleted: run.records_deleted,
            records_restored: run.records_restored,
            parents_skipped: run.parents_skipped,
            records_filtered: run.records_filtered,
            error: run.error,
            resume_at: run.resume_at,
        }
    }
}

/// A page of runs.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RunPage {
    pub items: Vec<Run>,
    /// Pass it as `cursor` for the next page; absent on the last page.
    pub next: Option<String>,
}

/// Which runs to list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListParams {
    provider: Option<String>,
    stream: Option<String>,
    user_id: Option<String>,
    /// The `next` of the page before.
    cursor: Option<String>,
    /// At most this many runs (1 to 1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u64>,
}

/// List runs, newest first.
#[utoipa::path(
    get,
    path = "/v1/runs",
    params(ListParams),
    security(("bearer" = ["connections:read"])),
    responses(
        (status = 200, description = "A page of runs", body = RunPage),
        (status = 400, description = "A query parameter is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks connections:read", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn list_runs(
    _caller: Authorized<ConnectionsRead>,
    State(state): State<ApiState>,
    Query(params): Query<ListParams>,
) -> Result<axum::Json<RunPage>, Problem> {
    let cursors = IdCursors::new(
        LIST,
        state.database_id().await?,
        &(&params.provider, &params.stream, &params.user_id),
    );
    let before = cursors.decode(params.cursor.as_deref())?;
    let query = RunsQuery {
        provider: params.provider,
        stream: params.stream,
        user_id: params.user_id,
        status: None,
        before,
        limit: params.limit.unwrap_or(DEFAULT_LIMIT),
    };
    let page = ops::list(state.db.main(), &query).await?;
    Ok(axum::Json(RunPage {
        items: page.items.into_iter().map(Run::from).collect(),
        next: page.next.map(|id| cursors.encode(id)),
    }))
}

/// Get one run with its counters.
#[utoipa::path(
    get,
    path = "/v1/runs/{id}",
    params(("id" = i64, Path, description = "The run's id", minimum = 1)),
    security(("bearer" = ["connections:read"])),
    responses(
        (status = 200, description = "The run", body = Run),
        (status = 400, description = "The id is not a number", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks connections:read", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No run has this id", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn get_run(
    _caller: Authorized<ConnectionsRead>,
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<axum::Json<Run>, Problem> {
    let id = path_id(&id)?;
    let run = ops::get(state.db.main(), id).await?;
    Ok(axum::Json(Run::from(run)))
}
