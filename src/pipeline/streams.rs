//! A connection's streams: the state row each keeps in `connection_streams`, opened (and
//! at its first run created) before a run of the stream starts.

use std::collections::HashMap;

use chrono::Utc;
use sea_orm::sea_query::{Expr, ExprTrait, OnConflict};
use sea_orm::{
    ActiveValue::NotSet, ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait,
    QueryFilter, QuerySelect, Set,
};

use super::ground::begin_page_transaction;
use crate::config::StreamSettings;
use crate::entities::{connection, connection_stream};

/// The stream a run belongs to: what it syncs and where, and its state as the run began.
#[derive(Clone, Debug)]
pub struct StreamScope {
    /// Its name, namespace and parent.
    pub settings: StreamSettings,
    /// Its row in `connection_streams` (cursor, checkpoint, last success).
    pub state: connection_stream::Model,
}

impl StreamScope {
    /// The stream's name.
    pub fn name(&self) -> &str {
        &self.settings.name
    }

    /// What the stream's records hold in their `provider` column.
    pub fn namespace(&self) -> &str {
        &self.settings.namespace
    }
}

/// Opens stream `settings` of `connection`, creating its state row at its first run. The
/// primary stream's row (the one whose namespace is the provider's name) takes over the
/// cursor, checkpoint and last success the connection kept before streams, in the same
/// transaction that clears them there, so that state is moved, never copied.
pub async fn open_stream(
    db: &DatabaseConnection,
    connection: &connection::Model,
    settings: &StreamSettings,
) -> Result<StreamScope, DbErr> {
    if let Some(state) = find(db, connection.id, &settings.name).await? {
        return Ok(StreamScope {
            settings: settings.clone(),
            state,
        });
    }
    // The write lock first on SQLite: the transaction reads the connection, then writes.
    let txn = begin_page_transaction(db).await?;
    let primary = settings.namespace == connection.provider;
    // Only state there is to move: clearing empty columns would lock the connection's
    // row, which another process's page may hold.
    let legacy = match primary {
        true => connection::Entity::find_by_id(connection.id)
            .one(&txn)
            .await?
            .filter(has_state),
        false => None,
    };
    let now = Utc::now();
    let row = connection_stream::ActiveModel {
        id: NotSet,
        connection_id: Set(connection.id),
        stream: Set(settings.name.clone()),
        cursor: Set(legacy.as_ref().and_then(|old| old.cursor.clone())),
        checkpoint: Set(legacy.as_ref().and_then(|old| old.checkpoint.clone())),
        last_success_run_id: Set(legacy.as_ref().and_then(|old| old.last_success_run_id)),
        last_success_at: Set(legacy.as_ref().and_then(|old| old.last_success_at)),
        // A stream's first run is a full pass anyway: it has no cursor.
        full_passes_owed: Set(0),
        paused_at: NotSet,
        created_at: Set(now),
        updated_at: Set(now),
    };
    // Another process opening the same stream at once inserts the same row: keep theirs.
    connection_stream::Entity::insert(row)
        .on_conflict(
            OnConflict::columns([
                connection_stream::Column::ConnectionId,
                connection_stream::Column::Stream,
            ])
            // A no-op update, since MySQL has no `DO NOTHING` for a named key.
            .update_column(connection_stream::Column::Stream)
            .to_owned(),
        )
        .exec_without_returning(&txn)
        .await?;
    if legacy.is_some() {
        connection::Entity::update_many()
            .col_expr(connection::Column::Cursor, Option::<String>::None.into())
            .col_expr(
                connection::Column::Checkpoint,
                Option::<String>::None.into(),
            )
            .col_expr(
                connection::Column::LastSuccessRunId,
                Option::<i64>::None.into(),
            )
            .col_expr(
                connection::Column::LastSuccessAt,
                Option::<chrono::DateTime<Utc>>::None.into(),
            )
            .filter(connection::Column::Id.eq(connection.id))
            .exec(&txn)
            .await?;
    }
    txn.commit().await?;
    // Read after the commit: on MySQL a transaction that lost the race to insert the row
    // still reads its older snapshot, where the other's row is not yet there.
    let state = find(db, connection.id, &settings.name)
        .await?
        .ok_or_else(|| DbErr::RecordNotFound(format!("stream {:?}", settings.name)))?;
    Ok(StreamScope {
        settings: settings.clone(),
        state,
    })
}

/// Notes that a `full_sync_schedule` firing owes every stream of `connection` a full
/// pass, before the firing tries to claim the connection: a connection busy with a long
/// run still gets its full pass at its next run, whichever instance makes it. A stream
/// without a row yet has no cursor, so its first run is a full pass without owing one.
pub(crate) async fn owe_full_pass(
    db: &DatabaseConnection,
    connection: &connection::Model,
) -> Result<u64, DbErr> {
    let txn = begin_page_transaction(db).await?;
    // The connection's row first, as every writer of the connection takes it.
    connection::Entity::update_many()
        .col_expr(connection::Column::UpdatedAt, Utc::now().into())
        .filter(connection::Column::Id.eq(connection.id))
        .exec(&txn)
        .await?;
    let owed = connection_stream::Entity::update_many()
        .col_expr(
            connection_stream::Column::FullPassesOwed,
            Expr::col(connection_stream::Column::FullPassesOwed).add(1),
        )
        .filter(connection_stream::Column::ConnectionId.eq(connection.id))
        .exec(&txn)
        .await?
        .rows_affected;
    txn.commit().await?;
    Ok(owed)
}

/// Whether the connection row holds sync state from before streams.
fn has_state(row: &connection::Model) -> bool {
    row.cursor.is_some()
        || row.checkpoint.is_some()
        || row.last_success_run_id.is_some()
        || row.last_success_at.is_some()
}

/// Stream `settings` of `connection` when its state row exists (it ran before), as
/// statements of `db`, which may be a caller's transaction.
pub(crate) async fn find_stream(
    db: &impl ConnectionTrait,
    connection: &connection::Model,
    settings: &StreamSettings,
) -> Result<Option<StreamScope>, DbErr> {
    Ok(find(db, connection.id, &settings.name)
        .await?
        .map(|state| StreamScope {
            settings: settings.clone(),
            state,
        }))
}

async fn find(
    db: &impl ConnectionTrait,
    connection_id: i64,
    stream: &str,
) -> Result<Option<connection_stream::Model>, DbErr> {
    connection_stream::Entity::find()
        .filter(connection_stream::Column::ConnectionId.eq(connection_id))
        .filter(connection_stream::Column::Stream.eq(stream))
        .one(db)
        .await
}

/// The paused streams of the connections `connections` selects (a subquery of their ids),
/// by connection.
pub(crate) async fn paused_streams(
    db: &impl ConnectionTrait,
    connections: sea_orm::sea_query::SelectStatement,
) -> Result<HashMap<i64, Vec<String>>, DbErr> {
    let rows: Vec<(i64, String)> = connection_stream::Entity::find()
        .select_only()
        .column(connection_stream::Column::ConnectionId)
        .column(connection_stream::Column::Stream)
        .filter(connection_stream::Column::PausedAt.is_not_null())
        .filter(connection_stream::Column::ConnectionId.in_subquery(connections))
        .into_tuple()
        .all(db)
        .await?;
    let mut paused: HashMap<i64, Vec<String>> = HashMap::new();
    for (connection_id, stream) in rows {
        paused.entry(connection_id).or_default().push(stream);
    }
    Ok(paused)
}

/// Pauses (`true`) or resumes stream `stream` of connection `connection_id`, keeping the
/// time a pause began. Returns whether its state changed; a stream without a state row
/// is not paused.
pub(crate) async fn set_stream_paused(
    db: &impl ConnectionTrait,
    connection_id: i64,
    stream: &str,
    paused: bool,
) -> Result<bool, DbErr> {
    let now = Utc::now();
    let was = match paused {
        true => connection_stream::Column::PausedAt.is_null(),
        false => connection_stream::Column::PausedAt.is_not_null(),
    };
    let changed = connection_stream::Entity::update_many()
        .col_expr(
            connection_stream::Column::PausedAt,
            Expr::value(paused.then_some(now)),
        )
        .col_expr(connection_stream::Column::UpdatedAt, Expr::value(now))
        .filter(connection_stream::Column::ConnectionId.eq(connection_id))
        .filter(connection_stream::Column::Stream.eq(stream))
        .filter(was)
        .exec(db)
        .await?
        .rows_affected;
    Ok(changed > 0)
}

/// Every stream state of the connections with ids `connection_ids` (`connections list`).
pub(crate) async fn states_of(
    db: &impl ConnectionTrait,
    connection_ids: Vec<i64>,
) -> Result<Vec<connection_stream::Model>, DbErr> {
    connection_stream::Entity::find()
        .filter(connection_stream::Column::ConnectionId.is_in(connection_ids))
        .all(db)
        .await
}
