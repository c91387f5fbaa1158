//! `/v1/connections`: listing, reading and pausing connections, never their secrets.

use axum::extract::{Path, State};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::{Authorized, ConnectionsRead, ConnectionsWrite};
use super::input::{decode_cursor, encode_cursor, Json, Query};
use super::problem::Problem;
use super::state::ApiState;
use crate::ops::connections::{self as ops, ConnectionView, ConnectionsQuery};

/// The name cursors of this list carry.
const LIST: &str = "connections";
/// The page size when `limit` is not given.
const DEFAULT_LIMIT: u64 = 100;

/// A connection: a user's account at a provider, with the state of each of its streams.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Connection {
    pub id: i64,
    /// The `[providers.NAME]` table it belongs to.
    pub provider: String,
    pub user_id: String,
    pub enabled: bool,
    /// Since when it is paused (left out of its schedule); absent when it is not.
    pub paused_at: Option<DateTime<Utc>>,
    /// Its own schedule, replacing its provider's.
    pub schedule: Option<String>,
    /// `config` (config.toml lists it), `cli` (added besides it) or `removed`.
    pub defined_in: String,
    /// How its credentials are held (`sealed (key ID)`, `env VAR`, ...), never the secret.
    pub credentials: String,
    pub streams: Vec<StreamState>,
}

/// One stream of a connection.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct StreamState {
    /// The stream; absent for a connection whose provider config.toml no longer has.
    pub name: Option<String>,
    /// Where the next incremental run starts.
    pub cursor: Option<String>,
    /// Whether a run stopped midway and the next one resumes it.
    pub unfinished_run: bool,
    pub last_success_run_id: Option<i64>,
    pub last_success_at: Option<DateTime<Utc>>,
}

/// A page of connections.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ConnectionPage {
    pub items: Vec<Connection>,
    /// Pass it as `cursor` for the next page; absent on the last page.
    pub next: Option<String>,
}

/// The connections' views, one per stream and grouped by connection, as connections.
fn grouped(views: Vec<ConnectionView>) -> Vec<Connection> {
    let mut connections: Vec<Connection> = Vec::new();
    for view in views {
        let stream = StreamState {
            name: view.stream,
            cursor: view.cursor,
            unfinished_run: view.unfinished_run,
            last_success_run_id: view.last_success_run_id,
            last_success_at: view.last_success_at,
        };
        match connections.last_mut() {
            Some(last) if last.id == view.id => last.streams.push(stream),
            _ => connections.push(Connection {
                id: view.id,
                provider: view.provider,
                user_id: view.user_id,
                enabled: view.enabled,
                paused_at: view.paused_at,
                schedule: view.schedule,
                defined_in: view.defined_in.to_string(),
                credentials: view.credentials,
                streams: vec![stream],
            }),
        }
    }
    connections
}

/// Which connections to list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListParams {
    /// Only this provider's connections.
    provider: Option<String>,
    /// Only this user's connections.
    user_id: Option<String>,
    /// Only enabled (`true`) or disabled (`false`) connections.
    enabled: Option<bool>,
    /// The `next` of the page before.
    cursor: Option<String>,
    /// At most this many connections (1 to 1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u64>,
}

/// List connections, ordered by provider and user id.
#[utoipa::path(
    get,
    path = "/v1/connections",
    params(ListParams),
    security(("bearer" = ["connections:read"])),
    responses(
        (status = 200, description = "A page of connections", body = ConnectionPage),
        (status = 400, description = "A query parameter is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks connections:read", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn list_connections(
    _caller: Authorized<ConnectionsRead>,
    State(state): State<ApiState>,
    Query(params): Query<ListParams>,
) -> Result<axum::Json<ConnectionPage>, Problem> {
    let after = params
        .cursor
        .as_deref()
        .map(|cursor| decode_cursor(LIST, cursor))
        .transpose()?;
    let query = ConnectionsQuery {
        provider: params.provider,
        user_id: params.user_id,
        enabled: params.enabled,
        after,
        limit: params.limit.unwrap_or(DEFAULT_LIMIT),
    };
    let page = ops::list(&state.db, &state.settings, &query).await?;
    Ok(axum::Json(ConnectionPage {
        items: grouped(page.items),
        next: page.next.map(|id| encode_cursor(LIST, id)),
    }))
}

/// Get one connection.
#[utoipa::path(
    get,
    path = "/v1/connections/{id}",
    params(("id" = i64, Path, description = "The connection's id")),
    security(("bearer" = ["connections:read"])),
    responses(
        (status = 200, description = "The connection", body = Connection),
        (status = 400, description = "The id is not a number", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks connections:read", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No connection has this id", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn get_connection(
    _caller: Authorized<ConnectionsRead>,
    State(state): State<ApiState>,
    Path(id): Path<String>,
) -> Result<axum::Json<Connection>, Problem> {
    let id = path_id(&id)?;
    one(&state, id).await.map(axum::Json)
}

/// What to change in a connection; absent fields are left as they are.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConnectionChange {
    /// Pause (leave it out of its schedule's firings) or resume it.
    paused: Option<bool>,
}

/// Change a connection: pause or resume it.
#[utoipa::path(
    patch,
    path = "/v1/connections/{id}",
    params(("id" = i64, Path, description = "The connection's id")),
    request_body = ConnectionChange,
    security(("bearer" = ["connections:write"])),
    responses(
        (status = 200, description = "The connection as changed", body = Connection),
        (status = 400, description = "The body or the id is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks connections:write", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No connection has this id", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "The body is larger than [api] max_body_bytes", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is not JSON", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn change_connection(
    _caller: Authorized<ConnectionsWrite>,
    State(state): State<ApiState>,
    Path(id): Path<String>,
    Json(change): Json<ConnectionChange>,
) -> Result<axum::Json<Connection>, Problem> {
    let id = path_id(&id)?;
    let target = ops::target_of(state.db.main(), id).await?;
    if let Some(paused) = change.paused {
        ops::set_paused(state.db.main(), &target, paused).await?;
    }
    one(&state, id).await.map(axum::Json)
}

async fn one(state: &ApiState, id: i64) -> Result<Connection, Problem> {
    let views = ops::get(&state.db, &state.settings, id).await?;
    grouped(views).into_iter().next().ok_or_else(|| {
        Problem::new(
            axum::http::StatusCode::NOT_FOUND,
            format!("there is no connection with id {id}"),
        )
    })
}

/// A row id from the path: a positive number, else a 400 naming `id`.
pub(crate) fn path_id(text: &str) -> Result<i64, Problem> {
    text.parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| {
            Problem::invalid(
                "id",
                format!(
                    "id: expected a positive number, got {:?}",
                    tributary_providers::quote::truncated(text, 64)
                ),
            )
        })
}
