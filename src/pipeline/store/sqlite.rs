//! SQLite's store strategy: lookups with the keys as one JSON array, unchanged pages
//! counted on the file's read-only pool, and an all-new page in one batch.
//!
//! sqlx runs SQLite on a worker thread, and every statement is a hand-off there and back,
//! so an all-new page is built in full before the writing connection is taken from the
//! pool and sent as one batch: `BEGIN IMMEDIATE`, the run's counters, the checkpoint, the
//! change clock's tick and the stamped change batch, plain `INSERT`s without `ON
//! CONFLICT`, as many as SQLite's limit on bound parameters needs (an existing key or a
//! refused row fails one before `COMMIT`, and the batch is rolled back), the records'
//! changes, and `COMMIT`. Every write is conditioned on the
//! run's, the connection's and the clock's rows existing, so the batch writes the whole
//! page or nothing, and its row counts, read back, say which. The batch runs in a task of
//! its own, so a caller dropped halfway cannot leave the connection inside a transaction.
//! (SQLite has one writer at a time, so where the tick sits in the batch makes no other
//! writer wait longer.)

use std::sync::{Arc, LazyLock};

use chrono::{DateTime, SecondsFormat, Utc};
use futures::TryStreamExt;
use sea_orm::sea_query::{Expr, SqliteQueryBuilder};
use sea_orm::sqlx::error::DatabaseError;
use sea_orm::sqlx::sqlite::{SqliteArguments, SqliteConnection, SqlitePool};
use sea_orm::sqlx::{self, Arguments, Either, Executor, IntoArguments, Sqlite};
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, RuntimeErr, Statement};
use sea_query_sqlx::SqlxValues;
use tributary_providers::Record;

use super::backend::{
    insert_statement, Existing, NewPageWriter, PageBookkeeping, Refusal, StoreBackend, StoreError,
    Stored,
};
use super::context::PageContext;
use crate::db::parameters::Binds;
use crate::db::DatabasePools;
use crate::entities::change_clock::CLOCK_ROW;
use crate::pipeline::changes::{self, BatchOwner, ChangeBatch, ChangeSlot, CLOCK_SEQ, TICK};
use crate::pipeline::checkpoint::CheckpointMove;
use crate::pipeline::ground::names;
use crate::pipeline::ground::row::{self, Source};

/// How many of a page's (external id, content hash) pairs, given as one JSON array, are
/// stored with that hash. `CROSS JOIN` keeps the page's pairs the outer loop: each is one
/// probe of the unique index, whatever the planner thinks of the table's size.
static COUNT_UNCHANGED: LazyLock<String> = LazyLock::new(|| {
    let key = row::key_match("r.", |source| match source {
        Source::User => "= ?2".into(),
        Source::Provider => "= ?3".into(),
        Source::Record(_) | Source::Run | Source::Now => "= page.value ->> 0".into(),
    });
    names::sql(&format!(
        "SELECT count(*) FROM json_each(?1) AS page CROSS JOIN {{records}} AS r \
         WHERE {key} AND r.{{record::ContentHash}} = page.value ->> 1 \
         AND r.{{record::DeletedAt}} IS NULL",
    ))
});

/// The stored rows (their [`row::STORED`] columns) of user `?1` and provider `?2` among a
/// page's external ids `?3`, given as one JSON array, as one JSON array of arrays, and the
/// `FROM` and `WHERE` that find them: sqlx hands each result row from its SQLite thread to
/// ours separately, and one row costs one hand-off.
static STORED_AS_JSON: LazyLock<(String, String)> = LazyLock::new(|| {
    let stored = row::column_list("", row::STORED);
    let key = row::key_match("", |source| match source {
        Source::User => "= ?1".into(),
        Source::Provider => "= ?2".into(),
        Source::Record(_) | Source::Run | Source::Now => {
            "IN (SELECT value FROM json_each(?3))".into()
        }
    });
    (
        format!("json_group_array(json_array({stored}))"),
        names::sql(&format!("FROM {{records}} WHERE {key}")),
    )
});

/// The stored rows of a page's external ids ([`STORED_AS_JSON`]) as `found`.
static LOOKUP: LazyLock<String> = LazyLock::new(|| {
    let (found, from) = &*STORED_AS_JSON;
    format!("SELECT {found} AS found {from}")
});

/// A page's first statement: `held` counts the page's run row (`?4`, while `running`) and
/// connection's row (`?5`, while it holds the lease `?6`/`?7` when given), which is 1 when
/// the page may write, beside [`LOOKUP`]'s result. `BEGIN IMMEDIATE` took the database's
/// one write lock already, so no claim of the lease can commit before the page does.
static LOCK_AND_LOOKUP: LazyLock<String> = LazyLock::new(|| {
    let (found, from) = &*STORED_AS_JSON;
    names::sql(&format!(
        "SELECT (SELECT count(*) FROM {{sync_runs}} r, {{connections}} c \
         WHERE r.{{sync_run::Id}} = ?4 AND r.{{sync_run::Status}} = {{status::Running}} \
         AND c.{{connection::Id}} = ?5 AND (?6 IS NULL OR (c.{{connection::LeaseHolder}} = ?6 \
         AND c.{{connection::LeaseGeneration}} = ?7))) AS held, \
         (SELECT {found} {from}) AS found",
    ))
});

/// The head of an all-new page's insert; one [`NEW_RECORD_VALUES`] follows per record,
/// then `) WHERE` and [`PAGE_ROWS_EXIST`]. It has no conflict clause. A page takes as
/// many of them as [`NEW_RECORDS`] says.
static INSERT_NEW_RECORDS: LazyLock<String> = LazyLock::new(|| {
    let columns = row::new_row_columns();
    names::sql(&format!(
        "INSERT INTO {{records}} ({columns}) SELECT * FROM (VALUES "
    ))
});

/// The condition on every write of an all-new page's batch: the run's row (`?1`) exists
/// and is `running`, the connection's (`?2`) exists and holds the page's lease (holder `?3`,
/// again `?4`, and generation `?5`; no lease: `NULL`s), and the change clock's row exists
/// ([`page_rows_values`]). The batch commits in the same round trip, so it must write the
/// whole page or, when a row is gone or not held, nothing.
static PAGE_ROWS_EXIST: LazyLock<String> = LazyLock::new(|| {
    names::sql(&format!(
        "EXISTS (SELECT 1 FROM {{sync_runs}} WHERE {{sync_run::Id}} = ? \
         AND {{sync_run::Status}} = {{status::Running}}) \
         AND EXISTS (SELECT 1 FROM {{connections}} WHERE {{connection::Id}} = ? \
         AND (? IS NULL OR ({{connection::LeaseHolder}} = ? \
         AND {{connection::LeaseGeneration}} = ?))) \
         AND EXISTS (SELECT 1 FROM {{change_clock}} WHERE {{change_clock::Id}} = {CLOCK_ROW})"
    ))
});

/// How many values one [`PAGE_ROWS_EXIST`] binds.
const PAGE_ROWS_BINDS: usize = 5;

/// The values of one [`PAGE_ROWS_EXIST`], in order.
fn page_rows_values(page: &PageBookkeeping<'_>) -> [sea_orm::Value; PAGE_ROWS_BINDS] {
    let holder = page.lease.map(|fence| fence.holder.clone());
    let generation = page.lease.map(|fence| fence.generation);
    [
        page.run_id.into(),
        page.connection_id.into(),
        holder.clone().into(),
        holder.into(),
        generation.into(),
    ]
}

/// Adds the values of one [`PAGE_ROWS_EXIST`] to `arguments`: the [`PAGE_ROWS_BINDS`] of
/// [`page_rows_values`], typed as sqlx binds them.
fn add_page_rows(
    arguments: &mut SqliteArguments,
    page: &PageBookkeeping<'_>,
) -> Result<(), sqlx::error::BoxDynError> {
    let holder = page.lease.map(|fence| fence.holder.clone());
    arguments.add(page.run_id)?;
    arguments.add(page.connection_id)?;
    arguments.add(holder.clone())?;
    arguments.add(holder)?;
    arguments.add(page.lease.map(|fence| fence.generation))
}

/// An all-new page's change batch, inserted stamped: the clock has just ticked, and the
/// write lock is the batch's, so the clock's seq is this batch's. Run, user, provider and
/// time, then [`PAGE_ROWS_EXIST`].
static INSERT_STAMPED_BATCH: LazyLock<String> = LazyLock::new(|| {
    names::sql(&format!(
        "INSERT INTO {{change_batches}} ({{change_batch::Seq}}, {{change_batch::RunId}}, \
         {{change_batch::UserId}}, {{change_batch::Provider}}, {{change_batch::CommittedAt}}) \
         SELECT {{change_clock::Seq}}, ?, ?, ?, ? FROM {{change_clock}} \
         WHERE {{change_clock::Id}} = {CLOCK_ROW} AND {}",
        *PAGE_ROWS_EXIST
    ))
});

/// An all-new page's changes: one `inserted` change per external id of the JSON array
/// given, at its place in the array, in the batch stamped with the clock's seq, then
/// [`PAGE_ROWS_EXIST`].
static INSERT_NEW_CHANGES: LazyLock<String> = LazyLock::new(|| {
    names::sql(&format!(
        "INSERT INTO {{changes}} ({{change::BatchId}}, {{change::Ordinal}}, \
         {{change::ExternalId}}, {{change::Kind}}) \
         SELECT (SELECT {{change_batch::Id}} FROM {{change_batches}} \
         WHERE {{change_batch::Seq}} = {clock_seq}), key, value, {{kind::Inserted}} \
         FROM json_each(?) WHERE {rows_exist}",
        clock_seq = *CLOCK_SEQ,
        rows_exist = *PAGE_ROWS_EXIST,
    ))
});

/// The `inserted` changes of an insert of the keys `?6` (a JSON array) that the lookup
/// found missing: the rows of run `?5` among them are the rows it took. Batch `?1`,
/// ordinals from `?2` in key order; user `?3`, provider `?4`.
static INSERTED_CHANGES: LazyLock<String> = LazyLock::new(|| {
    let key = row::key_match("", |source| match source {
        Source::User => "= ?3".into(),
        Source::Provider => "= ?4".into(),
        Source::Record(_) | Source::Run | Source::Now => {
            "IN (SELECT value FROM json_each(?6))".into()
        }
    });
    names::sql(&format!(
        "INSERT INTO {{changes}} ({{change::BatchId}}, {{change::Ordinal}}, \
         {{change::ExternalId}}, {{change::Kind}}) \
         SELECT ?1, ?2 + row_number() OVER (ORDER BY {{record::ExternalId}}) - 1, \
         {{record::ExternalId}}, {{kind::Inserted}} FROM {{records}} \
         WHERE {key} AND {{record::FirstSeenRunId}} = ?5",
    ))
});

/// [`changes::stamp_batch`] in one round trip: the tick, then the stamp of batch `?2` at
/// time `?1`.
static STAMP: LazyLock<String> = LazyLock::new(|| {
    names::sql(&format!(
        "{tick}; UPDATE {{change_batches}} SET {{change_batch::Seq}} = {clock_seq}, \
         {{change_batch::CommittedAt}} = ? WHERE {{change_batch::Id}} = ?",
        tick = *TICK,
        clock_seq = *CLOCK_SEQ,
    ))
});

/// One new record's values in [`INSERT_NEW_RECORDS`]: a `?` for each of [`row::NEW_ROW`].
static NEW_RECORD_VALUES: LazyLock<String> =
    LazyLock::new(|| format!("({})", vec!["?"; row::NEW_ROW.len()].join(", ")));

/// What one [`INSERT_NEW_RECORDS`] binds: [`NEW_RECORD_VALUES`] a row, and the values of
/// [`PAGE_ROWS_EXIST`]. The batch is one hand-off however many inserts it holds, so each
/// takes as many rows as SQLite's limit allows.
const NEW_RECORDS: Binds = Binds::new(row::NEW_ROW.len(), PAGE_ROWS_BINDS);

/// SQLite's primary result codes a page's write can be refused with.
const SQLITE_BUSY: i32 = 5;
const SQLITE_LOCKED: i32 = 6;
const SQLITE_TOOBIG: i32 = 18;
const SQLITE_CONSTRAINT: i32 = 19;
const SQLITE_MISMATCH: i32 = 20;

/// The store on a SQLite database.
pub(crate) struct SqliteStore<'a> {
    db: &'a DatabasePools,
}

impl<'a> SqliteStore<'a> {
    pub(crate) fn new(db: &'a DatabasePools) -> SqliteStore<'a> {
        SqliteStore { db }
    }
}

#[async_trait::async_trait]
impl StoreBackend for SqliteStore<'_> {
    fn new_pages(&self) -> Option<&dyn NewPageWriter> {
        Some(self)
    }

    /// Asked on a read-only reader of the file where there is one (see `db/readers.rs`),
    /// else on the main pool.
    async fn count_unchanged(
        &self,
        context: &PageContext<'_>,
        records: &[Record],
    ) -> Result<u64, StoreError> {
        let pairs: Vec<[&str; 2]> = records
            .iter()
            .map(|record| [record.external_id.as_str(), record.content_hash.as_str()])
            .collect();
        let pairs = serde_json::to_string(&pairs).map_err(|source| StoreError::Json {
            what: "writing the lookup's keys",
            source,
        })?;
        let query = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(COUNT_UNCHANGED.as_str()))
            .bind(pairs)
            .bind(context.connection.user_id.as_str())
            .bind(context.stream.namespace());
        let count = match self.db.sqlite_readers() {
            Some(readers) => {
                let mut reader = readers.acquire().await.map_err(query_error)?;
                let count = query
                    .fetch_one(reader.connection())
                    .await
                    .map_err(query_error)?;
                reader.give_back();
                count
            }
            None => query
                .fetch_one(self.db.get_sqlite_connection_pool())
                .await
                .map_err(query_error)?,
        };
        Ok(u64::try_from(count).unwrap_or(0))
    }

    async fn lookup(
        &self,
        txn: &DatabaseTransaction,
        context: &PageContext<'_>,
        records: &[Record],
    ) -> Result<Existing, StoreError> {
        let ids = external_ids_json(records)?;
        let statement = Statement::from_sql_and_values(
            DbBackend::Sqlite,
            LOOKUP.as_str(),
            [
                context.connection.user_id.as_str().into(),
                context.stream.namespace().into(),
                ids.into(),
            ],
        );
        let Some(row) = txn.query_one_raw(statement).await? else {
            return Ok(Existing::new());
        };
        let found: String = row.try_get("", "found")?;
        existing_of(&found)
    }

    /// `BEGIN IMMEDIATE` took the database's one write lock already, which is all the
    /// locking a page needs on SQLite: the lookup checks the page's fence beside
    /// ([`LOCK_AND_LOOKUP`]).
    async fn lock_and_lookup(
        &self,
        txn: &DatabaseTransaction,
        context: &PageContext<'_>,
        records: &[Record],
    ) -> Result<Existing, StoreError> {
        let ids = external_ids_json(records)?;
        let statement = Statement::from_sql_and_values(
            DbBackend::Sqlite,
            LOCK_AND_LOOKUP.as_str(),
            [
                context.connection.user_id.as_str().into(),
                context.stream.namespace().into(),
                ids.into(),
                context.run_id.into(),
                context.connection.id.into(),
                context.lease.map(|fence| fence.holder.clone()).into(),
                context.lease.map(|fence| fence.generation).into(),
            ],
        );
        let Some(row) = txn.query_one_raw(statement).await? else {
            return Err(StoreError::RowGone);
        };
        let held: i64 = row.try_get("", "held")?;
        if held != 1 {
            return Err(StoreError::RowGone);
        }
        let found: String = row.try_get("", "found")?;
        existing_of(&found)
    }

    /// The insert, then its changes selected from the rows of this run among the page's
    /// keys (which the lookup found missing): two statements, and no row sent back.
    async fn insert(
        &self,
        txn: &DatabaseTransaction,
        context: &PageContext<'_>,
        records: &[&Record],
        now: DateTime<Utc>,
        slot: ChangeSlot,
    ) -> Result<u64, StoreError> {
        let insert = insert_statement(context, records, now)?;
        let inserted = txn.execute(&insert).await?.rows_affected();
        if inserted == 0 {
            return Ok(0);
        }
        let keys = external_ids_json(records.iter().copied())?;
        let changes = Statement::from_sql_and_values(
            DbBackend::Sqlite,
            INSERTED_CHANGES.as_str(),
            [
                slot.batch_id.into(),
                slot.first.into(),
                context.connection.user_id.as_str().into(),
                context.stream.namespace().into(),
                context.run_id.into(),
                keys.into(),
            ],
        );
        let recorded = txn.execute_raw(changes).await?.rows_affected();
        if recorded != inserted {
            return Err(StoreError::ChangesMissing { inserted, recorded });
        }
        Ok(inserted)
    }

    /// Both updates sent at once; sqlx runs statements joined by `;` in turn and adds up
    /// their row counts.
    async fn save_bookkeeping(
        &self,
        txn: &DatabaseTransaction,
        page: &PageBookkeeping<'_>,
    ) -> Result<(), StoreError> {
        let (statements, values) = bookkeeping_statements(page)?;
        let expected = statements.len() as u64;
        let statement =
            Statement::from_sql_and_values(DbBackend::Sqlite, statements.join("; "), values);
        if txn.execute_raw(statement).await?.rows_affected() != expected {
            return Err(StoreError::RowGone);
        }
        Ok(())
    }

    /// Both statements sent at once, their row counts added up: 1 for the tick and 1 for
    /// the stamp.
    async fn stamp_batch(
        &self,
        txn: &DatabaseTransaction,
        batch: &ChangeBatch,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let statement = Statement::from_sql_and_values(
            DbBackend::Sqlite,
            STAMP.as_str(),
            [now.into(), batch.id.into()],
        );
        if txn.execute_raw(statement).await?.rows_affected() != 2 {
            return Err(changes::clock_missing().into());
        }
        Ok(())
    }

    fn refusal(&self, error: &dyn DatabaseError) -> Option<Refusal> {
        let code: i32 = error.code()?.parse().ok()?;
        match code & 0xff {
            SQLITE_CONSTRAINT | SQLITE_TOOBIG | SQLITE_MISMATCH => Some(Refusal::RefusedRow),
            SQLITE_BUSY | SQLITE_LOCKED => Some(Refusal::Contention),
            _ => None,
        }
    }

    /// The background checkpoints copy what was committed into the database file.
    fn committed(&self) {
        self.db.wal_written();
    }
}

#[async_trait::async_trait]
impl NewPageWriter for SqliteStore<'_> {
    async fn write_new_page(
        &self,
        context: &PageContext<'_>,
        records: &[Record],
        bookkeeping: &PageBookkeeping<'_>,
    ) -> Result<(), StoreError> {
        let batch = NewPageBatch::new(context, records, bookkeeping)?;
        batch
            .write(self.db.get_sqlite_connection_pool().clone())
            .await
    }
}

/// The external ids of `records` as one JSON array, as the statements that take a page's
/// keys through `json_each` bind them.
fn external_ids_json<'r>(
    records: impl IntoIterator<Item = &'r Record>,
) -> Result<String, StoreError> {
    let ids: Vec<&str> = records
        .into_iter()
        .map(|record| record.external_id.as_str())
        .collect();
    serde_json::to_string(&ids).map_err(|source| StoreError::Json {
        what: "writing the page's external ids",
        source,
    })
}

/// The stored keys of a lookup's JSON array of [`row::STORED`] (id, external id, hash,
/// deleting run).
fn existing_of(found: &str) -> Result<Existing, StoreError> {
    let rows: Vec<(i64, String, String, Option<i64>)> =
        serde_json::from_str(found).map_err(|source| StoreError::Json {
            what: "reading the lookup's rows",
            source,
        })?;
    Ok(rows
        .into_iter()
        .map(|(id, external_id, hash, deleted_by)| {
            (external_id, Stored::from_row(id, hash, deleted_by))
        })
        .collect())
}

/// A page's bookkeeping as `UPDATE` statements that must each change one row (the run's,
/// and the connection's when the checkpoint moves), and their values in order.
fn bookkeeping_statements(
    page: &PageBookkeeping<'_>,
) -> Result<(Vec<String>, sea_orm::sea_query::Values), DbErr> {
    let (run_sql, mut values) = page.counts_update().build(SqliteQueryBuilder);
    let mut statements = vec![run_sql];
    if let CheckpointMove::Write(checkpoint) = page.checkpoint {
        let (next_sql, next_values) = page
            .checkpoint_update(checkpoint)?
            .build(SqliteQueryBuilder);
        statements.push(next_sql);
        values.0.extend(next_values.0);
    }
    Ok((statements, values))
}

/// [`bookkeeping_statements`] for an all-new page's batch: each update written only
/// while both of the page's rows exist ([`PAGE_ROWS_EXIST`]).
fn guarded_bookkeeping_statements(
    page: &PageBookkeeping<'_>,
) -> Result<(Vec<String>, sea_orm::sea_query::Values), DbErr> {
    let rows_exist = || Expr::cust_with_values(&*PAGE_ROWS_EXIST, page_rows_values(page));
    let (run_sql, mut values) = page
        .counts_update()
        .and_where(rows_exist())
        .build(SqliteQueryBuilder);
    let mut statements = vec![run_sql];
    if let CheckpointMove::Write(checkpoint) = page.checkpoint {
        let (next_sql, next_values) = page
            .checkpoint_update(checkpoint)?
            .and_where(rows_exist())
            .build(SqliteQueryBuilder);
        statements.push(next_sql);
        values.0.extend(next_values.0);
    }
    Ok((statements, values))
}

/// An all-new page's whole write, ready to send as one batch: `BEGIN IMMEDIATE`, the
/// bookkeeping's updates, the insert and `COMMIT`, every write conditioned on the page's
/// rows. Its row counts, read back, say whether the page went in whole.
struct NewPageBatch {
    sql: String,
    arguments: SqliteArguments,
    /// The row count each statement after `BEGIN` must report for the page to commit.
    expected: Vec<u64>,
}

impl NewPageBatch {
    fn new(
        context: &PageContext<'_>,
        records: &[Record],
        bookkeeping: &PageBookkeeping<'_>,
    ) -> Result<NewPageBatch, StoreError> {
        let (updates, values) = guarded_bookkeeping_statements(bookkeeping)?;
        let mut expected = vec![1; updates.len()];
        let mut sql = "BEGIN IMMEDIATE".to_string();
        for update in &updates {
            sql.push_str("; ");
            sql.push_str(update);
        }
        // The values are converted here, before the connection is taken, so the one
        // writing connection waits only for SQLite.
        let mut arguments: SqliteArguments =
            IntoArguments::<Sqlite>::into_arguments(SqlxValues(values));
        // The change batch and the inserts come last, so their values follow the
        // bookkeeping's. An empty page (the end of a listing paged until empty) writes
        // its bookkeeping only, and takes no seq.
        if !records.is_empty() {
            push_stamped_batch(&mut sql, &mut arguments, context, bookkeeping)?;
            expected.extend([1, 1]);
            let owner = context.batch_owner();
            for chunk in records.chunks(NEW_RECORDS.rows_within_limit(DbBackend::Sqlite)) {
                sql.push_str("; ");
                push_records_insert(&mut sql, &mut arguments, owner, chunk, bookkeeping)?;
                expected.push(chunk.len() as u64);
            }
            push_changes_insert(&mut sql, &mut arguments, records, bookkeeping)?;
            expected.push(records.len() as u64);
        }
        sql.push_str("; COMMIT");
        Ok(NewPageBatch {
            sql,
            arguments,
            expected,
        })
    }

    /// Sends the batch. When a statement failed it stopped before `COMMIT` and is rolled
    /// back with nothing written; when it committed with a row count short, a row of the
    /// page was gone and nothing was written either.
    async fn write(self, pool: SqlitePool) -> Result<(), StoreError> {
        tokio::spawn(async move {
            let mut connection = pool
                .acquire()
                .await
                .map_err(|error| StoreError::Db(connection_error(error)))?;
            let outcome = match statement_changes(&mut connection, self.sql, self.arguments).await {
                // The first count is `BEGIN`'s, which reports no rows of its own, and the
                // last `COMMIT`'s.
                Ok(changes) if changes.get(1..=self.expected.len()) == Some(&self.expected[..]) => {
                    return Ok(());
                }
                Ok(changes) => {
                    if changes.iter().any(|&rows| rows > 0) {
                        // Only a trigger that ignores rows can make the insert come up
                        // short while both rows exist; the careful path writes the page
                        // again over what went in, and its counters are absolute.
                        tracing::warn!(
                            changes = ?changes,
                            expected = ?self.expected,
                            "An all-new page went in short of its records; writing it again with savepoints."
                        );
                    }
                    return Err(StoreError::RowGone);
                }
                Err(error) => Err(query_error(error).into()),
            };
            // This fails when no transaction is open (`BEGIN` itself failed), or when the
            // connection is broken, which is then closed rather than given back.
            if sqlx::query("ROLLBACK")
                .execute(&mut *connection)
                .await
                .is_err()
            {
                connection.close_on_drop();
            }
            outcome
        })
        .await?
    }
}

/// Runs the statements of `sql` in turn and returns each one's row count. Several
/// statements in one query: only sqlx's SQLite driver runs them, and it is what lets the
/// page go in one hand-off.
async fn statement_changes(
    connection: &mut SqliteConnection,
    sql: String,
    arguments: SqliteArguments,
) -> Result<Vec<u64>, sqlx::Error> {
    let query = sqlx::query_with(sqlx::AssertSqlSafe(sql), arguments);
    let mut results = connection.fetch_many(query);
    let mut changes = Vec::with_capacity(4);
    while let Some(step) = results.try_next().await? {
        if let Either::Left(done) = step {
            changes.push(done.rows_affected());
        }
    }
    Ok(changes)
}

/// [`INSERT_NEW_RECORDS`] with one row per record (at most [`NEW_RECORDS`]' rows), first
/// seen by `owner`'s run at the page's time, written only while the page's rows exist,
/// and its values added to `arguments`. Written here rather than through sea-query, which
/// copied every payload three times and formatted the time twice a row: here a payload
/// is copied once, and what every row shares (the user, the provider, the run and the
/// time) is one value referenced by each row.
fn push_records_insert(
    sql: &mut String,
    arguments: &mut SqliteArguments,
    owner: BatchOwner<'_>,
    records: &[Record],
    page: &PageBookkeeping<'_>,
) -> Result<(), StoreError> {
    sql.push_str(&INSERT_NEW_RECORDS);
    let now: Arc<str> = sqlite_time(page.now).into();
    let user: Arc<str> = owner.user_id.into();
    let provider: Arc<str> = owner.provider.into();
    arguments.reserve(NEW_RECORDS.values(records.len()), 0);
    for (index, record) in records.iter().enumerate() {
        if index > 0 {
            sql.push_str(", ");
        }
        sql.push_str(&NEW_RECORD_VALUES);
        let added = row::NEW_ROW
            .iter()
            .try_for_each(|(_, source)| match source {
                Source::User => arguments.add(user.clone()),
                Source::Provider => arguments.add(provider.clone()),
                Source::Run => arguments.add(owner.run_id),
                Source::Now => arguments.add(now.clone()),
                Source::Record(field) => arguments.add(Arc::<str>::from(field.of(record))),
            });
        added.map_err(|error| StoreError::build("the page's insert", error))?;
    }
    sql.push_str(") WHERE ");
    sql.push_str(&PAGE_ROWS_EXIST);
    let guard = add_page_rows(arguments, page);
    guard.map_err(|error| StoreError::build("the page's insert", error))
}

/// The tick and the stamped batch of an all-new page ([`INSERT_STAMPED_BATCH`]), each
/// written only while the page's rows exist, and their values added to `arguments`.
fn push_stamped_batch(
    sql: &mut String,
    arguments: &mut SqliteArguments,
    context: &PageContext<'_>,
    page: &PageBookkeeping<'_>,
) -> Result<(), StoreError> {
    sql.push_str("; ");
    sql.push_str(&TICK);
    sql.push_str(" AND ");
    sql.push_str(&PAGE_ROWS_EXIST);
    sql.push_str("; ");
    sql.push_str(&INSERT_STAMPED_BATCH);
    let added = (|| {
        add_page_rows(arguments, page)?;
        arguments.add(page.run_id)?;
        arguments.add(context.connection.user_id.clone())?;
        arguments.add(context.stream.namespace().to_string())?;
        arguments.add(sqlite_time(page.now))?;
        add_page_rows(arguments, page)
    })();
    added.map_err(|error| StoreError::build("the page's change batch", error))
}

/// [`INSERT_NEW_CHANGES`] for `records`, and its values added to `arguments`.
fn push_changes_insert(
    sql: &mut String,
    arguments: &mut SqliteArguments,
    records: &[Record],
    page: &PageBookkeeping<'_>,
) -> Result<(), StoreError> {
    let ids = external_ids_json(records)?;
    sql.push_str("; ");
    sql.push_str(&INSERT_NEW_CHANGES);
    let added = arguments
        .add(ids)
        .and_then(|()| add_page_rows(arguments, page));
    added.map_err(|error| StoreError::build("the page's changes", error))
}

/// The text sqlx itself writes for a `DateTime` on SQLite, so rows written in a batch
/// read back exactly as rows written through sea-orm do.
fn sqlite_time(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::AutoSi, false)
}

fn query_error(error: sqlx::Error) -> DbErr {
    DbErr::Query(RuntimeErr::SqlxError(error.into()))
}

fn connection_error(error: sqlx::Error) -> DbErr {
    DbErr::Conn(RuntimeErr::SqlxError(error.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_names_its_tables_and_columns() {
        for sql in [
            &*COUNT_UNCHANGED,
            &*LOOKUP,
            &*LOCK_AND_LOOKUP,
            &*PAGE_ROWS_EXIST,
            &*INSERT_NEW_RECORDS,
            &*INSERT_STAMPED_BATCH,
            &*INSERT_NEW_CHANGES,
            &*INSERTED_CHANGES,
            &*STAMP,
        ] {
            assert!(!sql.contains('{'), "{sql}");
        }
    }

    /// The inserts of a page at `max_records_per_page`'s default, and past it: each
    /// statement binds at most SQLite's limit, and they hold every record once.
    #[test]
    fn an_all_new_pages_inserts_each_bind_at_most_sqlites_limit() {
        use crate::db::parameters::max_parameters;
        use crate::pipeline::checkpoint::CheckpointMove;
        use crate::pipeline::ground::RunCounts;

        let owner = BatchOwner {
            run_id: 1,
            user_id: "alice",
            provider: "acme",
        };
        let page = PageBookkeeping {
            run_id: 1,
            counts: &RunCounts::default(),
            connection_id: 1,
            stream_id: 1,
            checkpoint: CheckpointMove::Keep,
            now: Utc::now(),
            lease: None,
        };
        let limit = max_parameters(DbBackend::Sqlite);
        for count in [1, 3_640, 3_641, 10_000, 25_000] {
            let records: Vec<Record> = (0..count)
                .map(|i| Record {
                    external_id: format!("r{i}"),
                    payload: "{}".into(),
                    content_hash: "0".repeat(64),
                })
                .collect();
            let mut sql = String::new();
            let mut arguments = SqliteArguments::default();
            let mut rows = 0;
            for chunk in records.chunks(NEW_RECORDS.rows_within_limit(DbBackend::Sqlite)) {
                let start = sql.len();
                push_records_insert(&mut sql, &mut arguments, owner, chunk, &page).unwrap();
                let placeholders = sql[start..].matches('?').count();
                assert_eq!(placeholders, NEW_RECORDS.values(chunk.len()));
                assert!(placeholders <= limit, "{count} records: {placeholders}");
                rows += sql[start..].matches(NEW_RECORD_VALUES.as_str()).count();
                sql.push_str("; ");
            }
            assert_eq!(rows, count);
        }
    }
}
