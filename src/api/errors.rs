//! Runs' errors: `/v1/runs/{id}/errors` (a run's, resolved or not), `/v1/errors` (the open
//! ones of every run), each with its raw payload, and `/v1/runs/{id}/replay`.
//!
//! Reading errors takes `records:read`, not `connections:read`: a record-level error's
//! payload is the record as the provider sent it.

use axum::extract::{Path, State};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::{Authorized, RecordsRead, SyncsWrite};
use super::connections::path_id;
use super::input::{IdCursors, Query};
use super::problem::Problem;
use super::state::ApiState;
use crate::entities::run_error;
use crate::ops::errors::{self as ops, OpenErrorsQuery, RunErrorsQuery};
use crate::ops::replay::ReplayReport;

const RUN_LIST: &str = "run-errors";
const OPEN_LIST: &str = "open-errors";
const DEFAULT_LIMIT: u64 = 100;
/// The largest page over HTTP: payloads can be whole page bodies.
const MAX_LIMIT: u64 = 1_000;

/// A record (or page) a run could not store, with what it received.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RunError {
    pub id: i64,
    pub run_id: i64,
    /// The stream of the run; absent for a run from before streams.
    pub stream: Option<String>,
    pub user_id: String,
    pub provider: String,
    /// Absent when the record had no usable id.
    pub external_id: Option<String>,
    /// `fetch`, `parse`, `validate` or `persist`.
    pub stage: String,
    /// `record` (replayable) or `page` (the next sync fetches the page again).
    pub scope: String,
    pub message: String,
    /// The record (or page body) exactly as received, as text: it may not be JSON.
    pub payload: String,
    pub created_at: DateTime<Utc>,
    /// The replay run that stored the record; absent while the error is open.
    pub resolved_by_run_id: Option<i64>,
}

impl RunError {
    fn of(error: run_error::Model, stream: Option<String>) -> RunError {
        RunError {
            id: error.id,
            run_id: error.run_id,
            stream,
            user_id: error.user_id,
            provider: error.provider,
            external_id: error.external_id,
            stage: error.stage.to_string(),
            scope: error.scope.to_string(),
            message: error.message,
            payload: error.payload,
            created_at: error.created_at,
            resolved_by_run_id: error.resolved_by_run_id,
        }
    }
}

/// A page of errors, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RunErrorPage {
    pub items: Vec<RunError>,
    /// Pass it as `cursor` for the next page; absent on the last page.
    pub next: Option<String>,
}

/// A page of a run's errors.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct RunErrorsParams {
    /// The `next` of the page before.
    cursor: Option<String>,
    /// At most this many errors (1 to 1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u64>,
}

/// Which open errors to list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct OpenErrorsParams {
    /// Only this run's.
    #[param(minimum = 1)]
    run_id: Option<i64>,
    /// Only errors of runs of this stream.
    stream: Option<String>,
    /// The `next` of the page before.
    cursor: Option<String>,
    /// At most this many errors (1 to 1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u64>,
}

/// The page size asked for, within the API's bound.
fn limit(limit: Option<u64>) -> Result<u64, Problem> {
    match limit.unwrap_or(DEFAULT_LIMIT) {
        limit @ 1..=MAX_LIMIT => Ok(limit),
        other => Err(Problem::invalid(
            "limit",
            format!("limit: must be between 1 and {MAX_LIMIT}, not {other}"),
        )),
    }
}

/// List a run's errors (resolved or not), oldest first.
#[utoipa::path(
    get,
    path = "/v1/runs/{id}/errors",
    params(("id" = i64, Path, description = "The run's id"), RunErrorsParams),
    security(("bearer" = ["records:read"])),
    responses(
        (status = 200, description = "A page of the run's errors", body = RunErrorPage),
        (status = 400, description = "The id or a query parameter is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks records:read", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No run has this id", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn run_errors(
    _caller: Authorized<RecordsRead>,
    State(state): State<ApiState>,
    Path(id): Path<String>,
    Query(params): Query<RunErrorsParams>,
) -> Result<axum::Json<RunErrorPage>, Problem> {
    let run_id = path_id(&id)?;
    let cursors = IdCursors::new(RUN_LIST, state.database_id().await?, &run_id);
    let query = RunErrorsQuery {
        run_id,
        after: cursors.decode(params.cursor.as_deref())?,
        limit: limit(params.limit)?,
    };
    let report = ops::of_run(state.db.main(), &query).await?;
    let stream = report.run.stream;
    Ok(axum::Json(RunErrorPage {
        items: report
            .errors
            .items
            .into_iter()
            .map(|error| RunError::of(error, stream.clone()))
            .collect(),
        next: report.errors.next.map(|id| cursors.encode(id)),
    }))
}

/// List the open errors (those no replay resolved) of every run, oldest first.
#[utoipa::path(
    get,
    path = "/v1/errors",
    params(OpenErrorsParams),
    security(("bearer" = ["records:read"])),
    responses(
        (status = 200, description = "A page of open errors", body = RunErrorPage),
        (status = 400, description = "A query parameter is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks records:read", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn open_errors(
    _caller: Authorized<RecordsRead>,
    State(state): State<ApiState>,
    Query(params): Query<OpenErrorsParams>,
) -> Result<axum::Json<RunErrorPage>, Problem> {
    if params.run_id.is_some_and(|id| id < 1) {
        return Err(Problem::invalid(
            "run_id",
            "run_id: expected a positive number",
        ));
    }
    let cursors = IdCursors::new(
        OPEN_LIST,
        state.database_id().await?,
        &(params.run_id, &params.stream),
    );
    let query = OpenErrorsQuery {
        run_id: params.run_id,
        after: cursors.decode(params.cursor.as_deref())?,
        stream: params.stream,
        limit: limit(params.limit)?,
    };
    let page = ops::open(state.db.main(), &query).await?;
    Ok(axum::Json(RunErrorPage {
        items: page
            .items
            .into_iter()
            .map(|item| RunError::of(item.error, item.stream))
            .collect(),
        next: page.next.map(|id| cursors.encode(id)),
    }))
}

/// What a replay did.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Replay {
    /// The replay run (trigger `replay`); absent when the run had no open record errors.
    pub replay_run_id: Option<i64>,
    /// Errors whose record went through, now resolved.
    pub resolved: Vec<i64>,
    /// Errors whose record still fails, with today's reason; they stay open.
    pub still_failing: Vec<StillFailing>,
    /// Errors closed without replaying: a newer run stored or deleted their record since.
    pub superseded: Vec<i64>,
    /// Page-level errors, which a replay cannot redo (the next sync fetches the page).
    pub not_replayable: Vec<i64>,
    /// Why the replay stopped before its last error, when it did; the errors it did not
    /// replay are in `still_failing`.
    pub stopped: Option<String>,
}

/// An error a replay left open.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct StillFailing {
    pub error_id: i64,
    pub reason: String,
}

impl From<ReplayReport> for Replay {
    fn from(report: ReplayReport) -> Replay {
        Replay {
            replay_run_id: report.replay_run_id,
            resolved: report.resolved,
            still_failing: report
                .still_failing
                .into_iter()
                .map(|(error_id, reason)| StillFailing { error_id, reason })
                .collect(),
            superseded: report.superseded,
            not_replayable: report.not_replayable,
            stopped: report.stopped,
        }
    }
}

/// Replay a run's open record errors from their stored payloads, as a new run.
#[utoipa::path(
    post,
    path = "/v1/runs/{id}/replay",
    params(("id" = i64, Path, description = "The run whose open errors to replay")),
    security(("bearer" = ["syncs:write"])),
    responses(
        (status = 200, description = "What the replay did", body = Replay),
        (status = 400, description = "The id is not a number", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks syncs:write", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No run has this id", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A run of the connection is going, or its provider or connection is gone", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn replay_run(
    _caller: Authorized<SyncsWrite>,
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<axum::Json<Replay>, Problem> {
    let run_id = path_id(&id)?;
    // Its own task, so that a request cut short (a timeout, a client gone) does not stop
    // the replay midway with the connection's lease held.
    let replay = tokio::spawn(async move {
        crate::ops::replay::replay(&state.db, &state.settings, run_id).await
    })
    .await
    .map_err(|error| {
        tracing::error!(run_id, %error, "A replay asked for over the API panicked.");
        Problem::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "the replay failed on the server; its log says why",
        )
    })??;
    Ok(axum::Json(Replay::from(replay)))
}
