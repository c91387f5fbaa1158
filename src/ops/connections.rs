//! Connections: listing them with their streams' state, and managing those added besides
//! config.toml. Connections config.toml lists belong to the file (they are upserted at
//! every start), so adding, enabling, disabling and removing refuse them.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::Condition;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait,
    QueryFilter, QueryOrder, QuerySelect, Set, SqlErr, TransactionTrait,
};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use super::health::Health;
use super::stream_states::stream_states;
use super::{check_limit, OpsError, Page};
use crate::config::{ProviderSettings, Settings, StreamSettings};
use crate::credentials::StoredCredentials;
use crate::db::DatabasePools;
use crate::entities::{connection, connection_stream, stream_schedule};

/// The largest page of connections.
pub const MAX_LIMIT: u64 = 1_000;

/// The connections read at a time while filtering by health.
const HEALTH_BATCH: u64 = 100;

/// The longest user id.
const MAX_USER_ID_BYTES: usize = 255;

/// Which connection: a provider (a `[providers.NAME]` table) and a user id.
#[derive(Clone, Debug, Deserialize)]
pub struct Target {
    pub provider: String,
    pub user_id: String,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.user_id, self.provider)
    }
}

/// Which connections to list, ordered by provider and user id.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ConnectionsQuery {
    pub provider: Option<String>,
    pub user_id: Option<String>,
    /// Only enabled connections (`true`) or only disabled ones.
    pub enabled: Option<bool>,
    /// Only connections that sync this stream: those of the providers whose config.toml
    /// table lists it (a connection syncs every stream of its provider).
    pub stream: Option<String>,
    /// Only connections of this health, as their sync status shows it: the worst of their
    /// streams', or with `stream` that stream's.
    pub health: Option<Health>,
    /// Only connections after this connection's id in that order (the `next` of the page
    /// before).
    pub after: Option<i64>,
    /// At most this many connections (1 to [`MAX_LIMIT`]); each may show several streams.
    pub limit: u64,
}

/// One stream of one connection, with how its credentials are held (never the secrets).
#[derive(Clone, Debug, Serialize)]
pub struct ConnectionView {
    pub id: i64,
    pub provider: String,
    /// The stream (`None` for a connection whose provider config.toml no longer has and
    /// that never ran a stream).
    pub stream: Option<String>,
    pub user_id: String,
    pub enabled: bool,
    /// Since when the operator has paused it (its schedule leaves it out).
    pub paused_at: Option<DateTime<Utc>>,
    /// Its own schedule, replacing the provider's; `None`: the provider's.
    pub schedule: Option<String>,
    /// `config` when config.toml lists it, `removed` when it listed it and no longer does
    /// (disabled, credentials dropped), else `cli`.
    pub defined_in: connection::DefinedIn,
    pub credentials: String,
    /// The provider-side account (a GitHub user id, a Stripe account), when the Connect
    /// page learnt it.
    pub account_id: Option<String>,
    /// Since when the provider has refused its authorization (see
    /// [`crate::entities::connection::Model::needs_reconnect_since`]).
    pub needs_reconnect_since: Option<DateTime<Utc>>,
    pub cursor: Option<String>,
    pub unfinished_run: bool,
    pub last_success_run_id: Option<i64>,
    pub last_success_at: Option<DateTime<Utc>>,
    /// The stream's own schedule, replacing its connection's; `None`: the connection's.
    pub stream_schedule: Option<String>,
    /// Since when the operator has paused the stream (its schedules leave it out).
    pub stream_paused_at: Option<DateTime<Utc>>,
}

/// One page of connections, each as one view per stream. `next` is a connection id.
///
/// Health is summed up from each connection's runs as its sync status does, so a health
/// filter reads the connections in batches and keeps those that match until the page is
/// full (and one more is found) or none are left: a page is short only when it is the last.
pub async fn list(
    db: &DatabasePools,
    settings: &Settings,
    query: &ConnectionsQuery,
) -> Result<Page<ConnectionView>, OpsError> {
    let limit = check_limit(query.limit, MAX_LIMIT)?;
    let mut select = connection::Entity::find();
    if let Some(provider) = &query.provider {
        select = select.filter(connection::Column::Provider.eq(provider.as_str()));
    }
    if let Some(stream) = &query.stream {
        select = select.filter(connection::Column::Provider.is_in(providers_syncing(
            settings,
            query.provider.as_deref(),
            stream,
        )?));
    }
    if let Some(user_id) = &query.user_id {
        select = select.filter(connection::Column::UserId.eq(user_id.as_str()));
    }
    if let Some(enabled) = query.enabled {
        select = select.filter(connection::Column::Enabled.eq(enabled));
    }
    let mut after = match query.after {
        Some(after) => {
            let Some(last) = connection::Entity::find_by_id(after).one(db).await? else {
                return Err(OpsError::Invalid {
                    field: "after",
                    message: format!("no connection has id {after}"),
                });
            };
            Some((last.provider, last.user_id))
        }
        None => None,
    };
    // One more than the page, so that the extra one tells whether a next page exists.
    let wanted = limit.saturating_add(1);
    // A health filter may skip many rows: read more at a time than the page holds.
    let batch_size = match query.health {
        Some(_) => wanted.max(HEALTH_BATCH),
        None => wanted,
    };
    let wanted = usize::try_from(wanted).unwrap_or(usize::MAX);
    let mut rows = Vec::new();
    loop {
        let mut batch = select.clone();
        if let Some((provider, user_id)) = &after {
            batch = batch.filter(
                Condition::any()
                    .add(connection::Column::Provider.gt(provider.as_str()))
                    .add(
                        Condition::all()
                            .add(connection::Column::Provider.eq(provider.as_str()))
                            .add(connection::Column::UserId.gt(user_id.as_str())),
                    ),
            );
        }
        let batch = batch
            .order_by_asc(connection::Column::Provider)
            .order_by_asc(connection::Column::UserId)
            .limit(batch_size)
            .all(db)
            .await?;
        let read_all = u64::try_from(batch.len()).unwrap_or(u64::MAX) < batch_size;
        after = batch
            .last()
            .map(|row| (row.provider.clone(), row.user_id.clone()));
        match query.health {
            None => rows.extend(batch),
            Some(health) => {
                let room = wanted.saturating_sub(rows.len());
                let stream = query.stream.as_deref();
                rows.extend(of_health(db, settings, batch, health, stream, room).await?);
            }
        }
        if read_all || rows.len() >= wanted {
            break;
        }
    }
    let rows = Page::from_rows(rows, limit, |row| row.id);
    Ok(Page {
        items: views_of(db, settings, rows.items).await?,
        next: rows.next,
    })
}

/// The first `room` of `rows` whose health (or stream `stream`'s) is `health`.
async fn of_health(
    db: &DatabasePools,
    settings: &Settings,
    rows: Vec<connection::Model>,
    health: Health,
    stream: Option<&str>,
    room: usize,
) -> Result<Vec<connection::Model>, OpsError> {
    let ids = rows.iter().map(|row| row.id).collect();
    let mut states: HashMap<i64, Vec<connection_stream::Model>> = HashMap::new();
    for state in crate::pipeline::streams::states_of(db.main(), ids).await? {
        states.entry(state.connection_id).or_default().push(state);
    }
    let mut matching = Vec::new();
    for row in rows {
        if matching.len() == room {
            break;
        }
        let own = states.remove(&row.id).unwrap_or_default();
        if super::health::health(db.main(), settings, &row, own, stream).await? == health {
            matching.push(row);
        }
    }
    Ok(matching)
}

/// The providers, of `provider` alone when given, whose config.toml table lists stream
/// `stream`; none is [`OpsError::Invalid`] naming `stream` and listing what they sync.
fn providers_syncing(
    settings: &Settings,
    provider: Option<&str>,
    stream: &str,
) -> Result<Vec<String>, OpsError> {
    let covered: Vec<&ProviderSettings> = settings
        .providers
        .values()
        .filter(|settings| provider.is_none_or(|name| settings.name == name))
        .collect();
    let syncing: Vec<String> = covered
        .iter()
        .filter(|settings| settings.stream(stream).is_some())
        .map(|settings| settings.name.clone())
        .collect();
    if !syncing.is_empty() {
        return Ok(syncing);
    }
    let known: Vec<String> = covered
        .iter()
        .flat_map(|settings| {
            settings
                .streams
                .iter()
                .map(move |configured| format!("{}.{}", settings.name, configured.name))
        })
        .collect();
    Err(OpsError::Invalid {
        field: "stream",
        message: format!(
            "no provider {} syncs a stream named {:?}; configured: {}",
            match provider {
                Some(name) => format!(
                    "named {:?}",
                    tributary_providers::quote::truncated(name, 64)
                ),
                None => "in the config".to_string(),
            },
            tributary_providers::quote::truncated(stream, 64),
            known.join(", ")
        ),
    })
}

/// One connection, as one view per stream.
pub(crate) async fn get(
    db: &DatabasePools,
    settings: &Settings,
    id: i64,
) -> Result<Vec<ConnectionView>, OpsError> {
    let row = connection::Entity::find_by_id(id)
        .one(db)
        .await?
        .ok_or_else(|| OpsError::NotFound {
            what: format!("connection with id {id}"),
            hint: "; `tributary connections list` lists them",
        })?;
    views_of(db, settings, vec![row]).await
}

/// The id of connection `target`.
pub(crate) async fn id_of(db: &DatabaseConnection, target: &Target) -> Result<i64, OpsError> {
    find(db, target)
        .await?
        .map(|row| row.id)
        .ok_or_else(|| not_found(target))
}

/// Which connection has id `id`.
pub(crate) async fn target_of(db: &DatabaseConnection, id: i64) -> Result<Target, OpsError> {
    let row = connection::Entity::find_by_id(id)
        .one(db)
        .await?
        .ok_or_else(|| OpsError::NotFound {
            what: format!("connection with id {id}"),
            hint: "; `tributary connections list` lists them",
        })?;
    Ok(Target {
        provider: row.provider,
        user_id: row.user_id,
    })
}

/// `rows` as views, one per stream, in their order.
async fn views_of(
    db: &DatabasePools,
    settings: &Settings,
    rows: Vec<connection::Model>,
) -> Result<Vec<ConnectionView>, OpsError> {
    let ids = rows.iter().map(|row| row.id).collect();
    let mut states: HashMap<i64, Vec<connection_stream::Model>> = HashMap::new();
    for state in crate::pipeline::streams::states_of(db.main(), ids).await? {
        states.entry(state.connection_id).or_default().push(state);
    }
    let mut schedules: HashMap<(i64, String), String> = HashMap::new();
    let schedule_rows = stream_schedule::Entity::find()
        .filter(stream_schedule::Column::ConnectionId.is_in(rows.iter().map(|row| row.id)))
        .all(db)
        .await?;
    for row in schedule_rows {
        schedules.insert((row.connection_id, row.stream), row.schedule);
    }
    let mut views = Vec::new();
    for row in rows {
        let credentials =
            StoredCredentials::describe_column(db.secrets(), row.binding(), &row.credentials);
        let defined_in = defined_in(settings, &row);
        let own = states.remove(&row.id).unwrap_or_default();
        for stream in stream_states(settings, &row, own) {
            let stream_schedule = stream
                .name
                .as_ref()
                .and_then(|name| schedules.get(&(row.id, name.clone())).cloned());
            views.push(ConnectionView {
                id: row.id,
                provider: row.provider.clone(),
                stream: stream.name,
                user_id: row.user_id.clone(),
                enabled: row.enabled,
                paused_at: row.paused_at,
                schedule: row.schedule.clone(),
                defined_in,
                credentials: credentials.clone(),
                account_id: row.account_id.clone(),
                needs_reconnect_since: row.needs_reconnect_since,
                cursor: stream.cursor,
                unfinished_run: stream.checkpoint.is_some(),
                last_success_run_id: stream.last_success_run_id,
                last_success_at: stream.last_success_at,
                stream_schedule,
                stream_paused_at: stream.paused_at,
            });
        }
    }
    Ok(views)
}

/// A connection to add, with its secrets (sealed with the pools' key before they are
/// stored) or the environment variables that hold them.
#[derive(Debug)]
pub struct NewConnection {
    pub target: Target,
    pub token_env: Option<String>,
    pub token: Option<SecretString>,
    pub refresh_token_env: Option<String>,
    pub refresh_token: Option<SecretString>,
    /// OAuth2: when the access token expires, in seconds since the Unix epoch.
    pub expires_at: Option<i64>,
    pub enabled: bool,
    /// Its own schedule from the start (see [`set_schedule`]).
    pub schedule: Option<String>,
    /// Streams on schedules of their own from the start, as (stream, cron expression).
    pub stream_schedules: Vec<(String, String)>,
}

/// The connection's row as added (its credentials column is sealed; it is not returned).
#[derive(Clone, Debug, Serialize)]
pub struct Added {
    pub id: i64,
    pub provider: String,
    pub user_id: String,
    pub enabled: bool,
}

/// Adds a connection besides config.toml, with its schedules, in one transaction: a
/// refused connection writes nothing.
pub async fn add(
    db: &DatabasePools,
    settings: &Settings,
    new: NewConnection,
) -> Result<Added, OpsError> {
    let txn = db.begin().await?;
    let added = add_in(&txn, db, settings, new).await?;
    txn.commit().await?;
    Ok(added)
}

/// [`add`] within `txn`, which the caller commits with writes of its own (the Connect
/// page marks its session used in the same transaction).
pub(crate) async fn add_in(
    txn: &sea_orm::DatabaseTransaction,
    db: &DatabasePools,
    settings: &Settings,
    new: NewConnection,
) -> Result<Added, OpsError> {
    let target = &new.target;
    let provider = check_target(settings, target)?;
    if let Some(expression) = &new.schedule {
        check_schedule(expression)?;
    }
    for (stream, expression) in &new.stream_schedules {
        check_stream(settings, target, stream)?;
        check_schedule(expression)?;
    }
    // Read in the transaction: SQLite's one writing connection is the transaction's.
    if find(txn, target).await?.is_some() {
        return Err(already_exists(target));
    }
    let env_vars = [
        ("token_env", &new.token_env),
        ("refresh_token_env", &new.refresh_token_env),
    ];
    for (field, var) in env_vars {
        if let Some(var) = var {
            if std::env::var_os(var).is_none() {
                return Err(OpsError::Invalid {
                    field,
                    message: format!("environment variable {var} is not set"),
                });
            }
        }
    }
    if provider.adapter.needs_token() && new.token_env.is_none() && new.token.is_none() {
        return Err(OpsError::Invalid {
            field: "token",
            message: format!("provider {} needs a token", target.provider),
        });
    }
    let expose = |secret: &Option<SecretString>| {
        secret
            .as_ref()
            .map(|secret| secret.expose_secret().to_string())
    };
    let stored = StoredCredentials {
        token_env: new.token_env.clone(),
        token: expose(&new.token),
        refresh_token_env: new.refresh_token_env.clone(),
        refresh_token: expose(&new.refresh_token),
        expires_at: new.expires_at,
        oauth: None,
    };
    let binding = crate::secrets::Binding {
        user_id: &target.user_id,
        provider: &target.provider,
    };
    let column = stored.to_column_for(db.secrets(), binding)?;
    let mut row = connection::ActiveModel::new_connection(
        &target.user_id,
        &target.provider,
        new.enabled,
        column,
    );
    row.schedule = Set(new.schedule.clone());
    // Two adds of one connection at once: the unique index refuses the second.
    let row = row
        .insert(txn)
        .await
        .map_err(|error| match error.sql_err() {
            Some(SqlErr::UniqueConstraintViolation(_)) => already_exists(target),
            _ => OpsError::Database(error),
        })?;
    for (stream, expression) in &new.stream_schedules {
        write_stream_schedule(txn, row.id, stream, Some(expression)).await?;
    }
    Ok(Added {
        id: row.id,
        provider: row.provider,
        user_id: row.user_id,
        enabled: row.enabled,
    })
}

fn already_exists(target: &Target) -> OpsError {
    OpsError::Conflict(format!(
        "{target} already exists; remove it first or use enable/disable"
    ))
}

/// A schedule override: the connection's (or stream's) own cron expression, or back to
/// the one it inherits (its provider's, or for a stream its connection's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ScheduleOverride {
    Own(String),
    Inherited,
}

impl ScheduleOverride {
    fn expression(&self) -> Option<&str> {
        match self {
            ScheduleOverride::Own(expression) => Some(expression),
            ScheduleOverride::Inherited => None,
        }
    }
}

/// What to change in a connection; `None` (or nothing listed) leaves it as it is.
#[derive(Clone, Debug, Default)]
pub(crate) struct ConnectionChange {
    /// Enable or disable it (only a connection config.toml does not list).
    pub enabled: Option<bool>,
    /// Pause or resume it (see [`set_paused`]).
    pub paused: Option<bool>,
    pub schedule: Option<ScheduleOverride>,
    /// Streams' schedules, by stream name.
    pub stream_schedules: Vec<(String, ScheduleOverride)>,
    /// Streams to pause (`true`) or resume, by stream name (see [`set_stream_paused`]).
    pub stream_pauses: Vec<(String, bool)>,
}

/// Changes connection `id` as `change` asks, all or nothing: every field is checked
/// before the one transaction that writes them.
pub(crate) async fn change(
    db: &DatabaseConnection,
    settings: &Settings,
    id: i64,
    change: &ConnectionChange,
) -> Result<(), OpsError> {
    let target = target_of(db, id).await?;
    if change.enabled.is_some() {
        refuse_config_defined(settings, &target)?;
    }
    if let Some(expression) = change
        .schedule
        .as_ref()
        .and_then(ScheduleOverride::expression)
    {
        check_schedule(expression)?;
    }
    for (stream, schedule) in &change.stream_schedules {
        check_stream(settings, &target, stream)?;
        if let Some(expression) = schedule.expression() {
            check_schedule(expression)?;
        }
    }
    let mut to_open = Vec::new();
    for (stream, paused) in &change.stream_pauses {
        let stream = check_stream(settings, &target, stream)?;
        if *paused {
            to_open.push(stream);
        }
    }
    // Every field checked: the rows a pause is kept on, before the transaction (opening
    // one takes its own), as a first run would make them.
    if !to_open.is_empty() {
        let row = find(db, &target).await?.ok_or_else(|| not_found(&target))?;
        for stream in to_open {
            crate::pipeline::streams::open_stream(db, &row, stream).await?;
        }
    }
    let txn = db.begin().await?;
    let row = connection::Entity::find_by_id(id)
        .one(&txn)
        .await?
        .ok_or_else(|| not_found(&target))?;
    let paused_at = row.paused_at;
    let now = crate::db::now();
    let mut active: connection::ActiveModel = row.into();
    if let Some(enabled) = change.enabled {
        active.enabled = Set(enabled);
    }
    // A pause keeps the time it began.
    if let Some(paused) = change
        .paused
        .filter(|paused| *paused != paused_at.is_some())
    {
        active.paused_at = Set(paused.then_some(now));
    }
    if let Some(schedule) = &change.schedule {
        active.schedule = Set(schedule.expression().map(str::to_string));
    }
    active.updated_at = Set(now);
    active.update(&txn).await?;
    for (stream, schedule) in &change.stream_schedules {
        write_stream_schedule(&txn, id, stream, schedule.expression()).await?;
    }
    for (stream, paused) in &change.stream_pauses {
        crate::pipeline::streams::set_stream_paused(&txn, id, stream, *paused).await?;
    }
    txn.commit().await?;
    Ok(())
}

/// Enables or disables a connection added besides config.toml.
pub async fn set_enabled(
    db: &DatabaseConnection,
    settings: &Settings,
    target: &Target,
    enabled: bool,
) -> Result<(), OpsError> {
    refuse_config_defined(settings, target)?;
    let row = find(db, target).await?.ok_or_else(|| not_found(target))?;
    let mut active: connection::ActiveModel = row.into();
    active.enabled = Set(enabled);
    active.updated_at = Set(crate::db::now());
    active.update(db).await?;
    Ok(())
}

/// Pauses a connection (`true`) or resumes it: a paused connection is left out of its
/// schedule's firings until resumed, whether config.toml or `add` defined it; a `sync`
/// asked for still runs it. Returns whether its state changed.
pub async fn set_paused(
    db: &DatabaseConnection,
    target: &Target,
    paused: bool,
) -> Result<bool, OpsError> {
    let row = find(db, target).await?.ok_or_else(|| not_found(target))?;
    if row.paused_at.is_some() == paused {
        return Ok(false);
    }
    let now = crate::db::now();
    let mut active: connection::ActiveModel = row.into();
    active.paused_at = Set(paused.then_some(now));
    active.updated_at = Set(now);
    active.update(db).await?;
    Ok(true)
}

/// Pauses one stream of a connection (`true`) or resumes it: a paused stream is left out
/// of its schedules' firings and of every job of its connection but a `sync` asked for,
/// which still runs it; the connection's other streams go on, and the full passes that
/// fall due stay owed, as for a paused connection. Returns whether its state changed.
pub(crate) async fn set_stream_paused(
    db: &DatabaseConnection,
    settings: &Settings,
    target: &Target,
    stream: &str,
    paused: bool,
) -> Result<bool, OpsError> {
    let row = find(db, target).await?.ok_or_else(|| not_found(target))?;
    let stream_settings = check_stream(settings, target, stream)?;
    if paused {
        // The row a pause is kept on, as the stream's first run would make it.
        crate::pipeline::streams::open_stream(db, &row, stream_settings).await?;
    }
    Ok(crate::pipeline::streams::set_stream_paused(db, row.id, stream, paused).await?)
}

/// The longest schedule override.
const MAX_SCHEDULE_BYTES: usize = 128;

/// Gives a connection a schedule of its own (a cron expression with seconds, as a
/// provider's `schedule`), or with `None` puts it back on its provider's. Every daemon
/// follows the change within a second.
pub async fn set_schedule(
    db: &DatabaseConnection,
    target: &Target,
    schedule: Option<&str>,
) -> Result<(), OpsError> {
    if let Some(expression) = schedule {
        check_schedule(expression)?;
    }
    let row = find(db, target).await?.ok_or_else(|| not_found(target))?;
    let mut active: connection::ActiveModel = row.into();
    active.schedule = Set(schedule.map(str::to_string));
    active.updated_at = Set(crate::db::now());
    active.update(db).await?;
    Ok(())
}

/// Gives one stream of a connection a schedule of its own (as [`set_schedule`] does for
/// the connection), or with `None` puts it back on its connection's. The connection's
/// other streams keep theirs. The stream must be one its provider syncs.
pub(crate) async fn set_stream_schedule(
    db: &DatabaseConnection,
    settings: &Settings,
    target: &Target,
    stream: &str,
    schedule: Option<&str>,
) -> Result<(), OpsError> {
    if let Some(expression) = schedule {
        check_schedule(expression)?;
    }
    check_stream(settings, target, stream)?;
    let row = find(db, target).await?.ok_or_else(|| not_found(target))?;
    write_stream_schedule(db, row.id, stream, schedule).await?;
    Ok(())
}

/// Refuses a stream that `target`'s provider does not sync; returns the stream's settings.
fn check_stream<'s>(
    settings: &'s Settings,
    target: &Target,
    stream: &str,
) -> Result<&'s StreamSettings, OpsError> {
    let provider = settings
        .providers
        .get(&target.provider)
        .ok_or_else(|| not_found(target))?;
    let Some(found) = provider.stream(stream) else {
        let known: Vec<&str> = provider.streams.iter().map(|s| s.name.as_str()).collect();
        return Err(OpsError::Invalid {
            field: "stream",
            message: format!(
                "provider {:?} syncs no stream named {:?}; it syncs {}",
                target.provider,
                tributary_providers::quote::truncated(stream, 64),
                known.join(", ")
            ),
        });
    };
    Ok(found)
}

/// Stores stream `stream`'s own schedule of connection `connection_id`, or with `None`
/// removes it.
async fn write_stream_schedule(
    db: &impl ConnectionTrait,
    connection_id: i64,
    stream: &str,
    schedule: Option<&str>,
) -> Result<(), DbErr> {
    use sea_orm::sea_query::OnConflict;
    match schedule {
        Some(expression) => {
            let now = crate::db::now();
            stream_schedule::Entity::insert(stream_schedule::ActiveModel {
                connection_id: Set(connection_id),
                stream: Set(stream.to_string()),
                schedule: Set(expression.to_string()),
                updated_at: Set(now),
                ..Default::default()
            })
            .on_conflict(
                OnConflict::columns([
                    stream_schedule::Column::ConnectionId,
                    stream_schedule::Column::Stream,
                ])
                .update_columns([
                    stream_schedule::Column::Schedule,
                    stream_schedule::Column::UpdatedAt,
                ])
                .to_owned(),
            )
            .exec_without_returning(db)
            .await?;
        }
        None => {
            stream_schedule::Entity::delete_many()
                .filter(stream_schedule::Column::ConnectionId.eq(connection_id))
                .filter(stream_schedule::Column::Stream.eq(stream))
                .exec(db)
                .await?;
        }
    }
    Ok(())
}

/// Refuses a schedule that is too long or not a cron expression with seconds.
fn check_schedule(expression: &str) -> Result<(), OpsError> {
    let invalid = |message: String| OpsError::Invalid {
        field: "schedule",
        message,
    };
    if expression.len() > MAX_SCHEDULE_BYTES {
        return Err(invalid(format!(
            "at most {MAX_SCHEDULE_BYTES} bytes, got {}",
            expression.len()
        )));
    }
    crate::config::parse_cron(expression).map_err(|message| {
        invalid(format!(
            "{expression:?} is not a cron expression with seconds: {message}"
        ))
    })?;
    Ok(())
}

/// What removing a connection did.
#[derive(Clone, Debug, Serialize)]
pub struct Removed {
    /// Records deleted with it (each a `deleted` change in the feed); 0 when they were kept.
    pub records_deleted: u64,
}

/// Removes a connection added besides config.toml; its records stay unless
/// `delete_records`, and its run history stays.
pub async fn remove(
    db: &DatabaseConnection,
    settings: &Settings,
    target: &Target,
    delete_records: bool,
) -> Result<Removed, OpsError> {
    refuse_config_defined(settings, target)?;
    let row = find(db, target).await?.ok_or_else(|| not_found(target))?;
    let removed = crate::pipeline::records::remove_connection(
        db,
        row.id,
        &row.user_id,
        &row.provider,
        delete_records,
    )
    .await?;
    match removed {
        Some(records_deleted) => Ok(Removed { records_deleted }),
        None => Err(not_found(target)),
    }
}

fn not_found(target: &Target) -> OpsError {
    OpsError::NotFound {
        what: format!("connection {target}"),
        hint: "; `tributary connections list` lists them",
    }
}

async fn find(
    db: &impl ConnectionTrait,
    target: &Target,
) -> Result<Option<connection::Model>, OpsError> {
    Ok(connection::Entity::find()
        .filter(connection::Column::Provider.eq(target.provider.as_str()))
        .filter(connection::Column::UserId.eq(target.user_id.as_str()))
        .one(db)
        .await?)
}

/// The provider's settings, when the target names a configured provider and a valid user.
fn check_target<'a>(
    settings: &'a Settings,
    target: &Target,
) -> Result<&'a ProviderSettings, OpsError> {
    let provider = settings
        .providers
        .get(&target.provider)
        .ok_or_else(|| OpsError::Invalid {
            field: "provider",
            message: format!(
                "no provider named {:?} in {}",
                target.provider,
                settings.path.display()
            ),
        })?;
    check_user_id(&target.user_id)?;
    refuse_config_defined(settings, target)?;
    Ok(provider)
}

/// Refuses a user id that is empty, too long or holds control characters.
pub(crate) fn check_user_id(user_id: &str) -> Result<(), OpsError> {
    // PostgreSQL's text refuses NUL, and no id of a provider holds control characters.
    if user_id.trim().is_empty()
        || user_id.len() > MAX_USER_ID_BYTES
        || user_id.chars().any(char::is_control)
    {
        return Err(OpsError::Invalid {
            field: "user_id",
            message: format!(
                "must be a non-empty user id of at most {MAX_USER_ID_BYTES} bytes without control characters"
            ),
        });
    }
    Ok(())
}

fn defined_in(settings: &Settings, row: &connection::Model) -> connection::DefinedIn {
    use connection::DefinedIn;
    if settings.lists_connection(&row.provider, &row.user_id) {
        DefinedIn::Config
    } else if row.defined_in != DefinedIn::Cli {
        // Retired by the next command that syncs, if it has not been already.
        DefinedIn::Removed
    } else {
        DefinedIn::Cli
    }
}

pub(crate) fn refuse_config_defined(settings: &Settings, target: &Target) -> Result<(), OpsError> {
    if settings.lists_connection(&target.provider, &target.user_id) {
        return Err(OpsError::Conflict(format!(
            "{target} is defined in {} (providers.{}.connections); change it there",
            settings.path.display(),
            target.provider
        )));
    }
    Ok(())
}
