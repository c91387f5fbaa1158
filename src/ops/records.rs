//! The synced records as an app reads them: one stream of one provider, in the order they
//! last changed, paged by (change time, row id), with tombstones for the records deleted
//! at the provider when asked (docs/decisions/records-api.md).

use std::ops::ControlFlow;

use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use sea_orm::sea_query::{Condition, Expr, ExprTrait, Query};
use sea_orm::{
    ColumnTrait, DatabaseConnection, DbErr, EntityTrait, FromQueryResult, QueryFilter, QueryOrder,
    QuerySelect,
};
use serde::Serialize;

use super::changes::Payload;
use super::{check_limit, OpsError};
use crate::config::{Settings, StreamSettings};
use crate::entities::sync_run::RunStatus;
use crate::entities::{connection, record, sync_run};

/// The largest page of records.
pub const MAX_LIMIT: u64 = 1_000;
// A page and the row that tells a next page exists fit in SQLite's row hand-over buffer.
const _: () = assert!(crate::db::ROW_BUFFER as u64 > MAX_LIMIT);

/// The most external ids one query may name.
pub const MAX_IDS: usize = 100;

/// What last happened to a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LastAction {
    /// Stored once and not changed since.
    Added,
    /// Rewritten with new content, or restored, since it was first stored.
    Updated,
    /// Deleted at the provider: a tombstone.
    Deleted,
}

/// Which records to read. The stream is resolved through config.toml: `provider` (or the
/// provider of `connection_id`) must be one it has.
#[derive(Clone, Debug, Default)]
pub struct RecordsQuery {
    /// The provider's name; may be left out when `connection_id` is given.
    pub provider: Option<String>,
    /// The stream; the provider's primary stream when `None`.
    pub stream: Option<String>,
    pub user_id: Option<String>,
    /// Only this connection's records (its provider and user).
    pub connection_id: Option<i64>,
    /// Only records that changed after this instant.
    pub modified_after: Option<DateTime<Utc>>,
    /// Also the records marked deleted, as tombstones (no payload).
    pub include_deleted: bool,
    /// Only the records with these external ids (at most [`MAX_IDS`]); all when empty.
    pub external_ids: Vec<String>,
    /// Only the records whose last action is one of these (tombstones too when
    /// [`LastAction::Deleted`] is), whatever `include_deleted` says; all when empty.
    pub last_actions: Vec<LastAction>,
    /// Only records after this position (the `next` of the page before).
    pub after: Option<RecordPosition>,
    /// At most this many records (1 to [`MAX_LIMIT`]).
    pub limit: u64,
}

/// A record's place in the list: when it last changed, then its row id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RecordPosition {
    pub changed_at: DateTime<Utc>,
    pub id: i64,
}

/// One record, or the tombstone of one deleted at the provider.
#[derive(Debug, Serialize)]
pub struct RecordItem {
    /// Its place in the list.
    #[serde(skip)]
    pub position: RecordPosition,
    /// The provider's name.
    pub provider: String,
    pub stream: String,
    pub user_id: String,
    /// The connection of `user_id` at `provider`; `None` once it was removed.
    pub connection_id: Option<i64>,
    pub external_id: String,
    pub last_action: LastAction,
    /// The record's JSON as the API sent it; `None` for a tombstone.
    pub payload: Option<Payload>,
    /// When tributary first stored it.
    pub first_seen_at: DateTime<Utc>,
    /// When it last changed: stored, rewritten, marked deleted or restored.
    pub changed_at: DateTime<Utc>,
    pub deleted: bool,
    pub deleted_at: Option<DateTime<Utc>>,
}

/// The columns a page reads.
#[derive(Debug, FromQueryResult)]
struct Row {
    id: i64,
    user_id: String,
    external_id: String,
    payload: String,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    deleted_at: Option<DateTime<Utc>>,
    connection_id: Option<i64>,
}

/// What a query reads, resolved: the provider and stream, the namespace its records are
/// stored under, and the user.
struct Scope {
    provider: String,
    stream: StreamSettings,
    user_id: Option<String>,
}

/// A page of records checked, resolved and bounded, ready to be read by [`Listing::each`].
pub(crate) struct Listing {
    scope: Scope,
    select: sea_orm::Select<record::Entity>,
    limit: u64,
}

/// Checks `query` and fixes what its page reads, the settled bound included; every
/// mistake in the query is found here, before a record is read.
pub(crate) async fn prepare(
    db: &DatabaseConnection,
    settings: &Settings,
    query: &RecordsQuery,
) -> Result<Listing, OpsError> {
    let limit = check_limit(query.limit, MAX_LIMIT)?;
    let scope = resolve(db, settings, query).await?;
    let mut select = record::Entity::find()
        .select_only()
        .columns([
            record::Column::Id,
            record::Column::UserId,
            record::Column::ExternalId,
            record::Column::Payload,
            record::Column::CreatedAt,
            record::Column::UpdatedAt,
            record::Column::DeletedAt,
        ])
        // The user's connection, in the same statement: a probe of its unique key.
        .expr_as(
            Expr::SubQuery(None, Box::new(connection_of_row(&scope.provider).into())),
            "connection_id",
        )
        .filter(record::Column::Provider.eq(scope.stream.namespace.as_str()));
    if let Some(user_id) = &scope.user_id {
        select = select.filter(record::Column::UserId.eq(user_id.as_str()));
    }
    if let Some(ids) = external_ids(query)? {
        select = select.filter(record::Column::ExternalId.is_in(ids));
    }
    if !query.last_actions.is_empty() {
        select = select.filter(
            query
                .last_actions
                .iter()
                .fold(Condition::any(), |any, action| any.add(last_was(*action))),
        );
    } else if !query.include_deleted {
        select = select.filter(record::Column::DeletedAt.is_null());
    }
    if let Some(instant) = query.modified_after {
        select = select.filter(record::Column::UpdatedAt.gt(instant));
    }
    // Only what no transaction can still commit below: a page stamped before the last row
    // returned but committed after it would be behind the reader's cursor for good.
    select = select.filter(record::Column::UpdatedAt.lt(settled_before(db, &scope).await?));
    if let Some(after) = query.after {
        // The first bound alone starts the index range at the position; the second
        // leaves out the rows of that instant up to and including its id.
        select = select.filter(
            Condition::all()
                .add(record::Column::UpdatedAt.gte(after.changed_at))
                .add(
                    Condition::any()
                        .add(record::Column::UpdatedAt.gt(after.changed_at))
                        .add(record::Column::Id.gt(after.id)),
                ),
        );
    }
    let select = select
        .order_by_asc(record::Column::UpdatedAt)
        .order_by_asc(record::Column::Id)
        .limit(limit.saturating_add(1));
    Ok(Listing {
        scope,
        select,
        limit,
    })
}

impl Listing {
    /// Hands the page's records to `take` in order, each as soon as the database returns
    /// it (a writer can send the first while the rest are read), until `take` breaks.
    /// Returns where the next page starts: `None` on the last page.
    pub(crate) async fn each(
        self,
        db: &DatabaseConnection,
        mut take: impl FnMut(RecordItem) -> ControlFlow<()>,
    ) -> Result<Option<RecordPosition>, DbErr> {
        let mut rows = self.select.into_model::<Row>().stream(db).await?;
        let mut taken: u64 = 0;
        let mut last = None;
        while let Some(row) = rows.try_next().await? {
            // The row after the limit only tells that a next page exists.
            if taken == self.limit {
                return Ok(last);
            }
            taken = taken.saturating_add(1);
            let item = item(&self.scope, row);
            last = Some(item.position);
            if take(item).is_break() {
                return Ok(None);
            }
        }
        Ok(None)
    }
}

/// The change time below which every record of `scope` that will ever be stamped is
/// committed: now, or the earliest a running run of its provider (and user) can still
/// stamp, if earlier. A run's pages are stamped after its previous page committed, which
/// recorded its time as the run's `stamps_from`; a stalled run's late commit is refused
/// by its fence once another process marked it ended.
async fn settled_before(db: &DatabaseConnection, scope: &Scope) -> Result<DateTime<Utc>, DbErr> {
    let mut running = sync_run::Entity::find()
        .select_only()
        .columns([sync_run::Column::StampsFrom, sync_run::Column::StartedAt])
        .filter(sync_run::Column::Status.eq(RunStatus::Running))
        .filter(sync_run::Column::Provider.eq(scope.provider.as_str()));
    if let Some(user_id) = &scope.user_id {
        running = running.filter(sync_run::Column::UserId.eq(user_id.as_str()));
    }
    let runs: Vec<(Option<DateTime<Utc>>, DateTime<Utc>)> = running.into_tuple().all(db).await?;
    Ok(runs
        .into_iter()
        // A run of an older release does not say: its start is earlier still.
        .map(|(stamps_from, started_at)| stamps_from.unwrap_or(started_at))
        .fold(crate::db::now(), Ord::min))
}

/// The ids `query` names, checked; `None` when it names none.
fn external_ids(query: &RecordsQuery) -> Result<Option<&[String]>, OpsError> {
    let invalid = |message: String| OpsError::Invalid {
        field: "external_id",
        message,
    };
    if query.external_ids.len() > MAX_IDS {
        return Err(invalid(format!(
            "at most {MAX_IDS} external ids at once, got {}",
            query.external_ids.len()
        )));
    }
    if query.external_ids.iter().any(String::is_empty) {
        return Err(invalid("an external id must not be empty".into()));
    }
    Ok((!query.external_ids.is_empty()).then_some(query.external_ids.as_slice()))
}

/// The rows whose last action was `action`. A record is stored with the same change
/// time as its creation; any later change moves only the change time.
fn last_was(action: LastAction) -> Condition {
    let live = record::Column::DeletedAt.is_null();
    let (created, changed) = (
        Expr::col((record::Entity, record::Column::CreatedAt)),
        Expr::col((record::Entity, record::Column::UpdatedAt)),
    );
    match action {
        LastAction::Added => Condition::all().add(live).add(changed.eq(created)),
        LastAction::Updated => Condition::all().add(live).add(changed.ne(created)),
        LastAction::Deleted => Condition::all().add(record::Column::DeletedAt.is_not_null()),
    }
}

/// This database's id, to bind the list's cursors to it.
pub async fn database_id(db: &DatabaseConnection) -> Result<String, OpsError> {
    Ok(crate::pipeline::changes::database_id(db).await?.to_string())
}

/// The provider, stream and user `query` names; a provider config.toml does not have, a
/// stream it does not sync or a connection that does not match is [`OpsError::Invalid`].
async fn resolve(
    db: &DatabaseConnection,
    settings: &Settings,
    query: &RecordsQuery,
) -> Result<Scope, OpsError> {
    let invalid = |field: &'static str, message: String| OpsError::Invalid { field, message };
    let (provider, user_id) = match query.connection_id {
        Some(id) => {
            let row = connection::Entity::find_by_id(id)
                .one(db)
                .await?
                .ok_or_else(|| invalid("connection_id", format!("there is no connection {id}")))?;
            if query.provider.as_ref().is_some_and(|p| *p != row.provider)
                || query.user_id.as_ref().is_some_and(|u| *u != row.user_id)
            {
                return Err(invalid(
                    "connection_id",
                    format!("connection {id} is not of the provider and user_id given"),
                ));
            }
            (row.provider, Some(row.user_id))
        }
        None => {
            let provider = query.provider.clone().ok_or_else(|| {
                invalid(
                    "provider",
                    "give the provider whose records to read (or a connection_id)".into(),
                )
            })?;
            (provider, query.user_id.clone())
        }
    };
    let quoted = |text: &str| tributary_providers::quote::truncated(text, 64);
    let settings = settings.providers.get(&provider).ok_or_else(|| {
        invalid(
            "provider",
            format!("config.toml has no provider {:?}", quoted(&provider)),
        )
    })?;
    let primary = settings.primary_stream();
    let stream = match &query.stream {
        None => primary,
        Some(name) if *name == primary.name => primary,
        Some(name) => settings.stream(name).cloned().ok_or_else(|| {
            let known: Vec<&str> = settings.streams.iter().map(|s| s.name.as_str()).collect();
            invalid(
                "stream",
                format!(
                    "provider {provider:?} syncs no stream {:?}; it syncs {}",
                    quoted(name),
                    known.join(", ")
                ),
            )
        })?,
    };
    Ok(Scope {
        provider,
        stream,
        user_id,
    })
}

/// The id of the connection of the outer row's user at `provider`.
fn connection_of_row(provider: &str) -> sea_orm::sea_query::SelectStatement {
    Query::select()
        .column((connection::Entity, connection::Column::Id))
        .from(connection::Entity)
        .and_where(
            Expr::col((connection::Entity, connection::Column::UserId))
                .equals((record::Entity, record::Column::UserId)),
        )
        .and_where(Expr::col((connection::Entity, connection::Column::Provider)).eq(provider))
        .to_owned()
}

fn item(scope: &Scope, row: Row) -> RecordItem {
    let deleted = row.deleted_at.is_some();
    let payload = (!deleted).then(|| Payload::stored(row.payload));
    let last_action = match (deleted, row.updated_at == row.created_at) {
        (true, _) => LastAction::Deleted,
        (false, true) => LastAction::Added,
        (false, false) => LastAction::Updated,
    };
    RecordItem {
        last_action,
        position: RecordPosition {
            changed_at: row.updated_at,
            id: row.id,
        },
        provider: scope.provider.clone(),
        stream: scope.stream.name.clone(),
        connection_id: row.connection_id,
        user_id: row.user_id,
        external_id: row.external_id,
        payload,
        first_seen_at: row.created_at,
        changed_at: row.updated_at,
        deleted,
        deleted_at: row.deleted_at,
    }
}
