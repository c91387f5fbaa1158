//! `/v1/connections`: listing, reading, creating, changing and deleting connections,
//! never showing their secrets.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use chrono::{DateTime, Utc};
use secrecy::SecretString;
use serde::{Deserialize, Deserializer, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::{Authorized, ConnectionsRead, ConnectionsWrite};
use super::input::{IdCursors, Json, Query};
use super::problem::Problem;
use super::state::ApiState;
use crate::ops::connections::{
    self as ops, ConnectionView, ConnectionsQuery, NewConnection, ScheduleOverride, Target,
};
use crate::ops::health::Health;

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
    /// The provider-side account (a GitHub user id, a Strava athlete id, a Stripe
    /// account), when it was connected on the Connect page; two users' connections with
    /// one account show the same value.
    pub account_id: Option<String>,
    /// Whether the provider revoked its authorization (its token endpoint refused the
    /// refresh): scheduled runs skip it until the user reconnects on the Connect page or a
    /// run succeeds.
    pub needs_reconnect: bool,
    /// Since when it needs a reconnect; absent when it does not.
    pub needs_reconnect_since: Option<DateTime<Utc>>,
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
    /// Its own schedule, replacing its connection's; absent: the connection's.
    pub schedule: Option<String>,
    /// Since when it is paused (left out of its schedules while the connection's other
    /// streams go on); absent when it is not.
    pub paused_at: Option<DateTime<Utc>>,
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
            schedule: view.stream_schedule,
            paused_at: view.stream_paused_at,
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
                account_id: view.account_id,
                needs_reconnect: view.needs_reconnect_since.is_some(),
                needs_reconnect_since: view.needs_reconnect_since,
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
    /// Only connections that sync this stream: those of the providers (of `provider`,
    /// when given) whose config lists it. A stream none of them syncs is a 400.
    stream: Option<String>,
    /// Only connections of this health, as their `syncs` shows it: `healthy`,
    /// `never_synced`, `degraded` or `failing`; the worst of their streams', or with
    /// `stream` that stream's. Pages stay full: `next` is absent only on the last page.
    #[param(pattern = "^(healthy|never_synced|degraded|failing)$")]
    health: Option<String>,
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
    let cursors = IdCursors::new(
        LIST,
        state.database_id().await?,
        &(
            &params.provider,
            &params.user_id,
            params.enabled,
            &params.stream,
            &params.health,
        ),
    );
    let after = cursors.decode(params.cursor.as_deref())?;
    let query = ConnectionsQuery {
        provider: params.provider,
        user_id: params.user_id,
        enabled: params.enabled,
        stream: params.stream,
        health: params
            .health
            .as_deref()
            .map(|text| Health::parse("health", text))
            .transpose()?,
        after,
        limit: params.limit.unwrap_or(DEFAULT_LIMIT),
    };
    let page = ops::list(&state.db, &state.settings, &query).await?;
    Ok(axum::Json(ConnectionPage {
        items: grouped(page.items),
        next: page.next.map(|id| cursors.encode(id)),
    }))
}

/// Get one connection.
#[utoipa::path(
    get,
    path = "/v1/connections/{id}",
    params(("id" = i64, Path, description = "The connection's id", minimum = 1)),
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

/// A connection to create (or import, tokens and all), besides config.toml's.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewConnectionBody {
    /// A `[providers.NAME]` table of the daemon's config.
    #[schema(min_length = 1)]
    provider: String,
    /// The user's id in the app.
    #[schema(min_length = 1, max_length = 255)]
    user_id: String,
    /// The access token or API key. Stored sealed with the secrets key (refused without
    /// one unless `[secrets] allow_plaintext`); never returned.
    #[serde(default, deserialize_with = "secret")]
    #[schema(value_type = Option<String>, write_only, min_length = 1)]
    token: Option<SecretString>,
    /// OAuth2: the refresh token, stored like `token`.
    #[serde(default, deserialize_with = "secret")]
    #[schema(value_type = Option<String>, write_only, min_length = 1)]
    refresh_token: Option<SecretString>,
    /// OAuth2: when the access token expires, in seconds since the Unix epoch.
    expires_at: Option<i64>,
    /// Whether it is synced (default `true`).
    enabled: Option<bool>,
    /// Its own schedule, a cron expression with seconds, replacing its provider's.
    schedule: Option<String>,
    /// Streams on schedules of their own, by stream name.
    #[serde(default)]
    streams: BTreeMap<String, StreamChange>,
}

/// A secret from a body: a non-empty string, refused without quoting what was sent.
fn secret<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<SecretString>, D::Error> {
    use serde::de::Error;
    match Option::<serde_json::Value>::deserialize(deserializer)? {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(text)) if !text.is_empty() => {
            Ok(Some(SecretString::from(text)))
        }
        Some(serde_json::Value::String(_)) => Err(D::Error::custom("must not be empty")),
        Some(_) => Err(D::Error::custom("expected a string")),
    }
}

/// A schedule override from a body: a cron expression, or `null` for the inherited one.
fn schedule_override<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<ScheduleOverride>, D::Error> {
    Ok(Some(match Option::<String>::deserialize(deserializer)? {
        Some(expression) => ScheduleOverride::Own(expression),
        None => ScheduleOverride::Inherited,
    }))
}

/// A stream's change.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamChange {
    /// The stream's own schedule, a cron expression with seconds replacing its
    /// connection's; `null`: back on its connection's; absent: as it is.
    #[serde(default, deserialize_with = "schedule_override")]
    #[schema(value_type = Option<String>)]
    schedule: Option<ScheduleOverride>,
}

/// The streams' schedules a body names, checked and written by the operation.
fn stream_schedules(streams: BTreeMap<String, StreamChange>) -> Vec<(String, ScheduleOverride)> {
    streams
        .into_iter()
        .filter_map(|(name, change)| change.schedule.map(|schedule| (name, schedule)))
        .collect()
}

/// Create a connection with its tokens. Answered with the connection, never its secrets.
#[utoipa::path(
    post,
    path = "/v1/connections",
    request_body = NewConnectionBody,
    security(("bearer" = ["connections:write"])),
    responses(
        (status = 201, description = "The connection as created", body = Connection,
            headers(("Location" = String, description = "The connection's URL")),
            links(
                ("GetConnection" = (operation_id = "get_connection", parameters(("id" = "$response.body#/id")))),
                ("ChangeConnection" = (operation_id = "change_connection", parameters(("id" = "$response.body#/id")))),
                ("TriggerSync" = (operation_id = "trigger_sync", parameters(("id" = "$response.body#/id")))),
                ("DeleteConnection" = (operation_id = "delete_connection", parameters(("id" = "$response.body#/id")))),
            )),
        (status = 400, description = "A body field is wrong (an unknown provider or stream, a bad schedule, a missing token)", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks connections:write", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The connection exists, config.toml lists it, or no secrets key is configured to seal its tokens", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "The body is larger than [api] max_body_bytes", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is not JSON", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn create_connection(
    _caller: Authorized<ConnectionsWrite>,
    State(state): State<ApiState>,
    Json(body): Json<NewConnectionBody>,
) -> Result<
    (
        StatusCode,
        [(header::HeaderName, String); 1],
        axum::Json<Connection>,
    ),
    Problem,
> {
    let stream_schedules = stream_schedules(body.streams)
        .into_iter()
        .filter_map(|(name, schedule)| match schedule {
            ScheduleOverride::Own(expression) => Some((name, expression)),
            ScheduleOverride::Inherited => None,
        })
        .collect();
    // Tokens only: a `token_env` would let a caller send any of the daemon's environment
    // variables to a provider as a token.
    let new = NewConnection {
        target: Target {
            provider: body.provider,
            user_id: body.user_id,
        },
        token_env: None,
        token: body.token,
        refresh_token_env: None,
        refresh_token: body.refresh_token,
        expires_at: body.expires_at,
        enabled: body.enabled.unwrap_or(true),
        schedule: body.schedule,
        stream_schedules,
    };
    let added = ops::add(&state.db, &state.settings, new)
        .await
        .map_err(in_streams)?;
    let connection = one(&state, added.id).await?;
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, format!("/v1/connections/{}", added.id))],
        axum::Json(connection),
    ))
}

/// The operation's problem, with a wrong stream named as the body's `streams` field.
fn in_streams(error: crate::ops::OpsError) -> Problem {
    let mut problem = Problem::from(error);
    if problem.field.as_deref() == Some("stream") {
        problem.field = Some("streams".to_string());
    }
    problem
}

/// What to change in a connection; absent fields are left as they are.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConnectionChange {
    /// Pause (leave it out of its schedule's firings) or resume it.
    paused: Option<bool>,
    /// Enable or disable it (a connection config.toml lists is changed there: 409).
    enabled: Option<bool>,
    /// Its own schedule, a cron expression with seconds replacing its provider's; `null`:
    /// back on its provider's.
    #[serde(default, deserialize_with = "schedule_override")]
    #[schema(value_type = Option<String>)]
    schedule: Option<ScheduleOverride>,
    /// Changes to its streams, by stream name.
    #[serde(default)]
    streams: BTreeMap<String, StreamUpdate>,
}

/// A change to one stream of a connection.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamUpdate {
    /// The stream's own schedule, a cron expression with seconds replacing its
    /// connection's; `null`: back on its connection's; absent: as it is.
    #[serde(default, deserialize_with = "schedule_override")]
    #[schema(value_type = Option<String>)]
    schedule: Option<ScheduleOverride>,
    /// Pause the stream (its schedules leave it out; the connection's other streams go
    /// on) or resume it.
    paused: Option<bool>,
}

/// Change a connection: pause or resume it or one of its streams, enable or disable it,
/// and set or clear its own schedule and its streams'. All or nothing.
#[utoipa::path(
    patch,
    path = "/v1/connections/{id}",
    params(("id" = i64, Path, description = "The connection's id", minimum = 1)),
    request_body = ConnectionChange,
    security(("bearer" = ["connections:write"])),
    responses(
        (status = 200, description = "The connection as changed", body = Connection),
        (status = 400, description = "The body or the id is wrong (an unknown stream, a bad schedule)", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks connections:write", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No connection has this id", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`enabled` for a connection config.toml lists", body = Problem, content_type = "application/problem+json"),
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
    let stream_pauses = change
        .streams
        .iter()
        .filter_map(|(name, update)| update.paused.map(|paused| (name.clone(), paused)))
        .collect();
    let change = ops::ConnectionChange {
        enabled: change.enabled,
        paused: change.paused,
        schedule: change.schedule,
        stream_schedules: stream_schedules(
            change
                .streams
                .into_iter()
                .map(|(name, update)| {
                    let change = StreamChange {
                        schedule: update.schedule,
                    };
                    (name, change)
                })
                .collect(),
        ),
        stream_pauses,
    };
    ops::change(state.db.main(), &state.settings, id, &change)
        .await
        .map_err(in_streams)?;
    one(&state, id).await.map(axum::Json)
}

/// What becomes of a deleted connection's records.
#[derive(Clone, Copy, Debug, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RecordsOnDelete {
    /// They stay in `records`.
    Keep,
    /// They are deleted, each a `deleted` change in the feed.
    Delete,
}

/// How to delete a connection.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct DeleteParams {
    /// `keep` its records or `delete` them (each a `deleted` change in the feed).
    #[param(inline)]
    records: RecordsOnDelete,
}

/// The connection deleted.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Deleted {
    id: i64,
    provider: String,
    user_id: String,
    /// Records deleted with it; 0 when they were kept.
    records_deleted: u64,
}

/// Delete a connection created besides config.toml; its run history stays.
#[utoipa::path(
    delete,
    path = "/v1/connections/{id}",
    params(("id" = i64, Path, description = "The connection's id", minimum = 1), DeleteParams),
    security(("bearer" = ["connections:write"])),
    responses(
        (status = 200, description = "The connection is deleted", body = Deleted),
        (status = 400, description = "The id or `records` is wrong", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks connections:write", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No connection has this id", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "config.toml lists the connection", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn delete_connection(
    _caller: Authorized<ConnectionsWrite>,
    State(state): State<ApiState>,
    Path(id): Path<String>,
    Query(params): Query<DeleteParams>,
) -> Result<axum::Json<Deleted>, Problem> {
    let id = path_id(&id)?;
    let target = ops::target_of(state.db.main(), id).await?;
    let delete_records = matches!(params.records, RecordsOnDelete::Delete);
    let removed = ops::remove(state.db.main(), &state.settings, &target, delete_records).await?;
    Ok(axum::Json(Deleted {
        id,
        provider: target.provider,
        user_id: target.user_id,
        records_deleted: removed.records_deleted,
    }))
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
