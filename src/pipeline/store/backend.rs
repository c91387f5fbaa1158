//! The seam between the store's policy (`mod.rs`) and a database: [`StoreBackend`], the
//! few statements each backend writes its own way, and the types they share.
//!
//! Every method is one statement (or one round trip) the policy composes; none decides
//! what a page is or retries anything. The statements the backends share, built with
//! sea-query, are here too.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{
    CaseStatement, Expr, InsertStatement, OnConflict, Query, UpdateStatement,
};
use sea_orm::sqlx::error::DatabaseError;
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr, EntityTrait,
    IdenStatic, QueryFilter, QueryResult, QueryTrait, RuntimeErr, Value,
};
use tributary_providers::Record;

use super::context::PageContext;
use crate::db::parameters::Binds;
use crate::entities::change::ChangeKind;
use crate::entities::{connection_stream, record, sync_run};
use crate::lease::Fence;
use crate::pipeline::changes::{self, ChangeBatch, ChangeSlot};
use crate::pipeline::checkpoint::{checkpoint_column, Checkpoint, CheckpointMove};
use crate::pipeline::fence::{why_unheld, Unheld};
use crate::pipeline::ground::row::{value_of, RowPage, Source, DELETION, NEW_ROW, REWRITE, STORED};
use crate::pipeline::ground::{begin_page_transaction, counter_columns, update_counts, RunCounts};

/// What the lookup found: each stored key's row, by external id.
pub type Existing = HashMap<String, Stored>;

/// A stored key as the lookup sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub id: i64,
    pub content_hash: String,
    /// Marked deleted by a complete listing (`deleted_by_run_id` is set, which it is
    /// exactly while `deleted_at` is): seeing it again restores it.
    pub deleted: bool,
}

impl Stored {
    /// A looked-up row: its id, hash and `deleted_by_run_id`.
    pub(crate) fn from_row(id: i64, content_hash: String, deleted_by: Option<i64>) -> Stored {
        Stored {
            id,
            content_hash,
            deleted: deleted_by.is_some(),
        }
    }
}

/// A stored record (its row id) and its new content.
pub type ChangedRecord<'r> = (i64, &'r Record);

/// One backend's way of writing the statements of the store path. The policy in
/// [`super::store_page`] decides which of them a page takes and in which transaction;
/// an implementation only writes each statement as its database wants it.
#[async_trait::async_trait]
pub trait StoreBackend: Send + Sync {
    /// The backend's way of writing an all-new page in the fewest round trips, if it has
    /// one. The shortcut trusts an insert's row count to tell inserted rows from skipped
    /// ones, which MySQL's does not (it counts skipped rows too), so MySQL has none.
    fn new_pages(&self) -> Option<&dyn NewPageWriter>;

    /// How many of `records` (at most one lookup's worth) are stored with the same
    /// content hash, read outside any transaction.
    async fn count_unchanged(
        &self,
        context: &PageContext<'_>,
        records: &[Record],
    ) -> Result<u64, StoreError>;

    /// The stored row id and hash of those of `records` (at most one lookup's worth)
    /// whose key exists.
    async fn lookup(
        &self,
        txn: &DatabaseTransaction,
        context: &PageContext<'_>,
        records: &[Record],
    ) -> Result<Existing, StoreError>;

    /// The first statement of every page's transaction: locks the page's run row and its
    /// connection's row, and looks up `records` (at most one lookup's worth, perhaps none)
    /// as [`StoreBackend::lookup`] does. Every writer of a connection takes these two locks
    /// before any other, so writers of one connection take turns and cannot deadlock. The
    /// lock is the page's fence: it is taken only while the run is `running` and the
    /// connection's row holds the page's lease ([`PageContext::lease`]). Fails with
    /// [`StoreError::RowGone`] when either row is gone or not held so (the caller asks
    /// [`explain_unheld`] why).
    async fn lock_and_lookup(
        &self,
        txn: &DatabaseTransaction,
        context: &PageContext<'_>,
        records: &[Record],
    ) -> Result<Existing, StoreError>;

    /// Inserts `records`, first seen by the page's run at `now`, and records an
    /// `inserted` change at `slot` (a place for each of `records`) for each row that
    /// went in; a key that exists is skipped, not an error, and gets no change. Returns
    /// how many rows went in.
    async fn insert(
        &self,
        txn: &DatabaseTransaction,
        context: &PageContext<'_>,
        records: &[&Record],
        now: DateTime<Utc>,
        slot: ChangeSlot,
    ) -> Result<u64, StoreError>;

    /// Rewrites `changed` (clearing a deletion mark) and records a change of `kind`
    /// (`updated`, or `restored` for records marked deleted) for each at `slot`. Returns
    /// how many records it rewrote.
    async fn update(
        &self,
        txn: &DatabaseTransaction,
        context: &PageContext<'_>,
        changed: &[ChangedRecord<'_>],
        now: DateTime<Utc>,
        slot: ChangeSlot,
        kind: ChangeKind,
    ) -> Result<u64, StoreError> {
        txn.execute(&update_statement(context.row_page(now), changed))
            .await?;
        let keys = changed
            .iter()
            .map(|(_, record)| record.external_id.as_str());
        Ok(changes::record_changes(txn, slot, kind, keys).await?)
    }

    /// Stamps the page's `batch` with the clock's next seq: the page's last statement
    /// before `COMMIT` ([`changes::stamp_batch`]).
    async fn stamp_batch(
        &self,
        txn: &DatabaseTransaction,
        batch: &ChangeBatch,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        Ok(changes::stamp_batch(txn, batch, now).await?)
    }

    /// Saves the run's counters and the connection's checkpoint. Fails with
    /// [`StoreError::RowGone`] when the run's row or the connection is gone.
    async fn save_bookkeeping(
        &self,
        txn: &DatabaseTransaction,
        page: &PageBookkeeping<'_>,
    ) -> Result<(), StoreError>;

    /// Why the database refused a statement of a page, if that is a refusal the careful
    /// path can narrow down to records (see [`Refusal`]); `None` for anything else.
    fn refusal(&self, error: &dyn DatabaseError) -> Option<Refusal>;

    /// A page committed.
    fn committed(&self) {}
}

/// The all-new shortcut of a backend that has one ([`StoreBackend::new_pages`]).
#[async_trait::async_trait]
pub trait NewPageWriter: Send + Sync {
    /// Stores `records`, all new, with the page's bookkeeping, in the fewest round trips
    /// the backend allows. On any error nothing is written: [`StoreError::RowGone`]
    /// when the run's row or the connection is gone, [`StoreError::KeyExisted`] when a
    /// key existed, else the database's own error.
    async fn write_new_page(
        &self,
        context: &PageContext<'_>,
        records: &[Record],
        bookkeeping: &PageBookkeeping<'_>,
    ) -> Result<(), StoreError>;
}

/// Why a statement of the store failed: the signals the policy acts on, the store's own
/// failures, and the database's errors. At the store's public entry points it becomes a
/// [`DbErr`] ([`From`]).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The page's run row or connection row is gone, or not held by the page's fence.
    #[error("the run's row or the connection's is gone or no longer held")]
    RowGone,
    /// A key of a page written as all new existed, and nothing was written.
    #[error("a key of a page written as all new existed")]
    KeyExisted,
    /// A statement could not be built from the page's values.
    #[error("building {what}: {message}")]
    Build { what: &'static str, message: String },
    /// The database reported more rows inserted than an insert sent.
    #[error("the database reported {inserted} rows inserted by an insert of {rows}")]
    InsertedTooMany { inserted: u64, rows: usize },
    /// An insert's rows were not all found again for their changes.
    #[error("an insert took {inserted} rows but {recorded} of them were found for their changes")]
    ChangesMissing { inserted: u64, recorded: u64 },
    /// The page's values could not be written as JSON, or a lookup's rows read from it.
    #[error("{what}: {source}")]
    Json {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// The task that wrote a page failed (it panicked or was cancelled).
    #[error("the page's write task failed: {0}")]
    WriteTask(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Db(#[from] DbErr),
}

impl From<StoreError> for DbErr {
    /// A row gone stays [`DbErr::RecordNotUpdated`], as callers have always seen it.
    fn from(error: StoreError) -> DbErr {
        match error {
            StoreError::RowGone => DbErr::RecordNotUpdated,
            StoreError::KeyExisted => DbErr::RecordNotInserted,
            StoreError::Db(error) => error,
            other => DbErr::Custom(other.to_string()),
        }
    }
}

impl StoreError {
    /// A statement that could not be built from the page's values.
    pub(crate) fn build(what: &'static str, error: impl std::fmt::Display) -> StoreError {
        StoreError::Build {
            what,
            message: error.to_string(),
        }
    }
}

/// An error of a page's write that the careful path handles, by its cause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A key existed (another writer inserted it, or a page guessed new was not).
    KeyConflict,
    /// The database refused a row: a constraint, a trigger, a value it cannot hold.
    RefusedRow,
    /// The run's row or the connection is gone.
    RowGone,
    /// Another transaction held what the page needed (a deadlock, a lock timeout).
    Contention,
}

impl Refusal {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::KeyConflict => "key_conflict",
            Refusal::RefusedRow => "refused_row",
            Refusal::RowGone => "row_gone",
            Refusal::Contention => "contention",
        }
    }

    /// The refusal `error` stands for on `backend`, if it is one.
    pub fn of(backend: &dyn StoreBackend, error: &StoreError) -> Option<Refusal> {
        match error {
            StoreError::RowGone => Some(Refusal::RowGone),
            StoreError::KeyExisted => Some(Refusal::KeyConflict),
            StoreError::Db(error) => {
                let database = database_error(error)?;
                if database.is_unique_violation() {
                    return Some(Refusal::KeyConflict);
                }
                backend.refusal(database)
            }
            _ => None,
        }
    }
}

/// The database's own error inside `error`, if the database answered with one.
fn database_error(error: &DbErr) -> Option<&dyn DatabaseError> {
    let runtime = match error {
        DbErr::Exec(runtime) | DbErr::Query(runtime) | DbErr::Conn(runtime) => runtime,
        _ => return None,
    };
    match runtime {
        RuntimeErr::SqlxError(sqlx) => sqlx.as_database_error(),
        _ => None,
    }
}

/// The SQL standard's refusals by SQLSTATE class: a data exception (`22`), an integrity
/// constraint (`23`), and a serialization failure or deadlock (`40`).
pub(crate) fn refusal_by_sqlstate(code: &str) -> Option<Refusal> {
    match code.get(..2)? {
        "22" | "23" => Some(Refusal::RefusedRow),
        "40" => Some(Refusal::Contention),
        _ => None,
    }
}

/// The stored keys among `rows` of [`STORED`]'s columns; a row without an id (the lone
/// row of a lock beside no stored key) is skipped.
pub(crate) fn stored_keys_of(rows: Vec<QueryResult>) -> Result<Existing, DbErr> {
    let [id_column, external_id_column, hash_column, deleted_by_column] =
        STORED.map(|column| column.as_str());
    let mut existing = Existing::with_capacity(rows.len());
    for row in rows {
        let id: Option<i64> = row.try_get("", id_column)?;
        let Some(id) = id else { continue };
        let external_id: String = row.try_get("", external_id_column)?;
        let hash: String = row.try_get("", hash_column)?;
        let deleted_by: Option<i64> = row.try_get("", deleted_by_column)?;
        existing.insert(external_id, Stored::from_row(id, hash, deleted_by));
    }
    Ok(existing)
}

/// The stored keys among the rows of a [`StoreBackend::lock_and_lookup`] statement that
/// counts the page's locked rows as `found` beside each stored key; fails with
/// [`StoreError::RowGone`] unless it found both (one pair).
pub(crate) fn locked_stored_keys(rows: Vec<QueryResult>) -> Result<Existing, StoreError> {
    let found: i64 = match rows.first() {
        Some(row) => row.try_get("", "found")?,
        None => 0,
    };
    if found != 1 {
        return Err(StoreError::RowGone);
    }
    Ok(stored_keys_of(rows)?)
}

/// [`StoreBackend::write_new_page`] as a transaction: the inserts without savepoints, then
/// the bookkeeping, committed only if every row went in.
pub(crate) async fn write_new_page_in_transaction(
    backend: &dyn StoreBackend,
    db: &DatabaseConnection,
    context: &PageContext<'_>,
    records: &[Record],
    bookkeeping: &PageBookkeeping<'_>,
) -> Result<(), StoreError> {
    let txn = begin_page_transaction(db).await?;
    if let Err(error) = backend.lock_and_lookup(&txn, context, &[]).await {
        return Err(explain_unheld(&txn, context, error).await);
    }
    let records: Vec<&Record> = records.iter().collect();
    let mut batch = match records.is_empty() {
        true => None,
        false => Some(changes::open_batch(&txn, context.batch_owner()).await?),
    };
    let mut inserted = 0;
    for chunk in records.chunks(RECORD_INSERT.rows(txn.get_database_backend())) {
        if let Some(batch) = batch.as_mut() {
            let slot = batch.reserve(chunk.len())?;
            inserted += backend
                .insert(&txn, context, chunk, bookkeeping.now, slot)
                .await?;
        }
    }
    if inserted != records.len() as u64 {
        txn.rollback().await?;
        return Err(StoreError::KeyExisted);
    }
    backend.save_bookkeeping(&txn, bookkeeping).await?;
    if let Some(batch) = &batch {
        backend.stamp_batch(&txn, batch, bookkeeping.now).await?;
    }
    Ok(txn.commit().await?)
}

/// Saves the run's counters of `page` alone (its checkpoint stays); fails with
/// [`StoreError::RowGone`] when the run's row is gone.
pub(crate) async fn save_counts_of(
    db: &impl ConnectionTrait,
    page: &PageBookkeeping<'_>,
) -> Result<(), StoreError> {
    match update_counts(db, page.run_id, page.counts).await? {
        true => Ok(()),
        false => Err(StoreError::RowGone),
    }
}

/// The error for a page whose first statement found its rows unheld
/// ([`StoreError::RowGone`]): why, read in the same transaction, as the run's callers see
/// it ([`Unheld::into_error`]). Other errors pass.
pub(crate) async fn explain_unheld(
    db: &impl ConnectionTrait,
    context: &PageContext<'_>,
    error: StoreError,
) -> StoreError {
    if !matches!(error, StoreError::RowGone) {
        return error;
    }
    let (run_id, fence) = (context.run_id, context.lease);
    match why_unheld(db, run_id, context.connection.id, fence).await {
        Ok(Unheld::RunGone | Unheld::ConnectionGone) => StoreError::RowGone,
        Ok(unheld) => StoreError::Db(unheld.into_error(run_id, fence)),
        Err(read) => StoreError::Db(read),
    }
}

/// What an insert of new records binds: each of [`NEW_ROW`]'s columns a row
/// ([`insert_statement`]; PostgreSQL's arrays bind fewer, and MySQL's read-back of the
/// rows one a row).
pub(crate) const RECORD_INSERT: Binds = Binds::new(NEW_ROW.len(), 0);

/// What a rewrite of stored records binds ([`update_statement`], [`rewrite_binds`]).
pub(crate) const RECORD_UPDATE: Binds = rewrite_binds();

/// What a lookup of stored keys binds: a key a row where the keys are a list (MySQL's
/// `IN`; SQLite sends them as one JSON array, PostgreSQL as one array), and the user,
/// the provider, the run and the connection.
pub(crate) const KEY_LOOKUP: Binds = Binds::new(1, 4);

/// What a page's transaction writes besides its records.
pub struct PageBookkeeping<'a> {
    pub run_id: i64,
    pub counts: &'a RunCounts,
    /// The connection whose row the page locks.
    pub connection_id: i64,
    /// The stream whose row holds the checkpoint.
    pub stream_id: i64,
    pub checkpoint: CheckpointMove<'a>,
    pub now: DateTime<Utc>,
    /// The lease the page is written under: nothing is written unless the connection's
    /// row still holds it (`None`: a run without a lease, fenced by its status only).
    pub lease: Option<&'a Fence>,
}

impl PageBookkeeping<'_> {
    /// `UPDATE sync_runs SET <counters>, heartbeat_at, stamps_from WHERE id = run_id`.
    pub(crate) fn counts_update(&self) -> UpdateStatement {
        Query::update()
            .table(sync_run::Entity)
            .values(
                self.counter_values()
                    .into_iter()
                    .map(|(column, value)| (column, Expr::val(value))),
            )
            .and_where(sync_run::Column::Id.eq(self.run_id))
            .to_owned()
    }

    /// `UPDATE connection_streams SET checkpoint, updated_at WHERE id = stream_id`.
    pub(crate) fn checkpoint_update(
        &self,
        checkpoint: Option<&Checkpoint>,
    ) -> Result<UpdateStatement, DbErr> {
        Ok(Query::update()
            .table(connection_stream::Entity)
            .value(
                connection_stream::Column::Checkpoint,
                checkpoint_column(checkpoint)?,
            )
            .value(connection_stream::Column::UpdatedAt, self.now)
            .and_where(connection_stream::Column::Id.eq(self.stream_id))
            .to_owned())
    }

    /// The run's columns a page sets, in [`counter_columns`] order: its counters, then
    /// its heartbeat and `stamps_from`.
    pub(crate) fn counter_values(&self) -> Vec<(sync_run::Column, Value)> {
        let mut values = counter_columns(self.counts).to_vec();
        values.push((sync_run::Column::HeartbeatAt, self.now.into()));
        // The run's next page is stamped after this one commits, so no later.
        values.push((sync_run::Column::StampsFrom, Some(self.now).into()));
        values
    }
}

/// `INSERT INTO records (<NEW_ROW>) VALUES (...), ... ON CONFLICT (<key>) DO NOTHING`,
/// one row per record, first seen by the page's run at `now`. On MySQL, which has no `DO
/// NOTHING`, sea-query writes `ON DUPLICATE KEY UPDATE id = id`.
pub(crate) fn insert_statement(
    context: &PageContext<'_>,
    records: &[&Record],
    now: DateTime<Utc>,
) -> Result<InsertStatement, StoreError> {
    records_insert(context.row_page(now), records)
}

/// [`insert_statement`] for the records of `page`'s run, user and provider.
fn records_insert(page: RowPage<'_>, records: &[&Record]) -> Result<InsertStatement, StoreError> {
    let mut insert = Query::insert();
    insert
        .into_table(record::Entity)
        .columns(NEW_ROW.map(|(column, _)| column));
    for record in records {
        insert
            .values(NEW_ROW.map(|(_, source)| value_of(source, &page, record).into()))
            .map_err(|error| StoreError::build("the page's insert", error))?;
    }
    insert.on_conflict(
        OnConflict::columns(record::KEY_COLUMNS)
            .do_nothing_on([record::Column::Id])
            .to_owned(),
    );
    Ok(insert)
}

/// `UPDATE records SET payload = CASE id WHEN ... END, content_hash = CASE ... END,
/// <the rest of REWRITE>, <DELETION> = NULL WHERE id IN (...)`: a record written again is
/// live, whether it was marked deleted or not.
pub(super) fn update_statement(
    page: RowPage<'_>,
    changed: &[ChangedRecord<'_>],
) -> UpdateStatement {
    let mut update = record::Entity::update_many();
    for (column, source) in REWRITE {
        let value: Expr = match source {
            Source::Record(field) => {
                let mut case = CaseStatement::new();
                for (id, record) in changed {
                    case = case.case(
                        record::Column::Id.eq(*id),
                        Expr::value(field.of(record).to_owned()),
                    );
                }
                // The `ELSE` never applies (the `WHERE` names the same ids); it keeps the
                // column as it is rather than NULL should it ever.
                case.finally(Expr::col(column)).into()
            }
            shared => Expr::value(page.shared(shared)),
        };
        update = update.col_expr(column, value);
    }
    for (column, null) in cleared_deletion() {
        update = update.col_expr(column, Expr::value(null));
    }
    update
        .filter(record::Column::Id.is_in(changed.iter().map(|(id, _)| *id)))
        .into_query()
}

/// Each of [`DELETION`]'s columns and its null, typed as the column is.
fn cleared_deletion() -> [(record::Column, Value); DELETION.len()] {
    DELETION.map(|column| {
        let null = match column {
            record::Column::DeletedByRunId => Value::BigInt(None),
            _ => Option::<DateTime<Utc>>::None.into(),
        };
        (column, null)
    })
}

/// What a rewrite binds a row and in all ([`Binds::new`]'s two numbers): a row's id
/// twice for each of its fields (once in the `CASE`, with the value) and once in `IN`; each
/// shared value of [`REWRITE`] and each cleared column once.
const fn rewrite_binds() -> Binds {
    let (mut per_row, mut fixed) = (1, DELETION.len());
    let mut index = 0;
    while index < REWRITE.len() {
        match REWRITE[index].1 {
            Source::Record(_) => per_row += 2,
            _ => fixed += 1,
        }
        index += 1;
    }
    Binds::new(per_row, fixed)
}

#[cfg(test)]
mod parameter_tests {
    use chrono::Utc;
    use sea_orm::{DbBackend, StatementBuilder};
    use tributary_providers::Record;

    use super::*;
    use crate::db::parameters::{max_parameters, BACKENDS};

    /// How many values `statement` binds on `backend`.
    pub(crate) fn bound(backend: DbBackend, statement: &impl StatementBuilder) -> usize {
        backend
            .build(statement)
            .values
            .map_or(0, |values| values.0.len())
    }

    pub(crate) fn records(count: usize) -> Vec<Record> {
        (0..count)
            .map(|i| Record {
                external_id: format!("r{i}"),
                payload: format!("{{\"id\":\"r{i}\"}}"),
                content_hash: "0".repeat(64),
            })
            .collect()
    }

    fn page() -> RowPage<'static> {
        RowPage {
            user_id: "alice",
            provider: "acme",
            run_id: 1,
            now: Utc::now(),
        }
    }

    #[test]
    fn an_insert_of_new_records_binds_what_its_chunk_allows_for() {
        for backend in BACKENDS {
            for rows in [
                RECORD_INSERT.rows(backend),
                RECORD_INSERT.rows_within_limit(backend),
            ] {
                let records = records(rows);
                let records: Vec<&Record> = records.iter().collect();
                let insert = records_insert(page(), &records).unwrap();
                let values = bound(backend, &insert);
                assert_eq!(values, RECORD_INSERT.values(rows), "{backend:?}");
                assert!(values <= max_parameters(backend), "{backend:?}: {values}");
            }
        }
    }

    #[test]
    fn an_update_of_stored_records_binds_what_its_chunk_allows_for() {
        for backend in BACKENDS {
            for rows in [
                RECORD_UPDATE.rows(backend),
                RECORD_UPDATE.rows_within_limit(backend),
            ] {
                let records = records(rows);
                let changed: Vec<ChangedRecord> = (0..).zip(&records).collect();
                let update = update_statement(page(), &changed);
                let values = bound(backend, &update);
                assert_eq!(values, RECORD_UPDATE.values(rows), "{backend:?}");
                assert!(values <= max_parameters(backend), "{backend:?}: {values}");
            }
        }
    }
}
