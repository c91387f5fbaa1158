//! PostgreSQL's store strategy: keys as arrays (`unnest`), one probe of the unique index
//! per key, and an all-new page as one statement.
//!
//! A statement outside a transaction is a transaction of its own, so an all-new page
//! whose checkpoint moves is one statement ([`NEW_PAGE`]): it locks the run's row and the
//! connection's, and writes the records, their changes and both bookkeeping rows only if
//! it found them, in data-modifying `WITH` queries. The insert has no conflict clause, so
//! an existing key or a refused row fails the whole statement with nothing written. The
//! statement returns whether the rows were found; if not, nothing was written either.
//! An insert's changes ride in its statement too (`RETURNING` names the rows that went
//! in). Batches are stamped with their transaction's id, which waits for no other
//! writer (`changes/order.rs`).

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{
    Alias, CommonTableExpression, Expr, PostgresQueryBuilder, Query, WithClause,
};
use sea_orm::sqlx::error::DatabaseError;
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, IdenStatic, Statement, Value};
use tributary_providers::Record;

use super::backend::{
    locked_stored_keys, refusal_by_sqlstate, save_counts_of, stored_keys_of,
    write_new_page_in_transaction, Existing, NewPageWriter, PageBookkeeping, Refusal, StoreBackend,
    StoreError,
};
use super::context::PageContext;
use crate::db::DatabasePools;
use crate::entities::change_clock::CLOCK_ROW;
use crate::entities::sync_run;
use crate::lease::Fence;
use crate::pipeline::changes::{ChangeSlot, TRANSACTION_SEQ};
use crate::pipeline::checkpoint::{checkpoint_column, CheckpointMove};
use crate::pipeline::ground::names;
use crate::pipeline::ground::row::{self, Field, RowPage, Source};
use crate::pipeline::ground::RunCounts;

/// The stored (id, external id, content hash) of the keys `$3` of user `$1` and provider
/// `$2`. `external_id IN (...)` lets the planner scan every record of the (user_id,
/// provider) prefix and filter, which it does while the table's statistics are young (and
/// a prepared statement's generic plan keeps doing it); `LIMIT 1` in the lateral subquery
/// keeps it from being flattened into such a join, so each id is one unique-index probe.
static LOOKUP: LazyLock<String> = LazyLock::new(|| {
    names::sql(&format!(
        "SELECT {outer} FROM unnest($3::text[]) AS k(external_id) \
         CROSS JOIN LATERAL (SELECT {inner} FROM {{records}} WHERE {key} LIMIT 1) AS r",
        outer = row::column_list("r.", row::STORED),
        inner = row::column_list("", row::STORED),
        key = key_probe(),
    ))
});

/// The key of user `$1` and provider `$2` whose external id is `k.external_id`.
fn key_probe() -> String {
    row::key_match("", |source| match source {
        Source::User => "= $1".into(),
        Source::Provider => "= $2".into(),
        Source::Record(_) | Source::Run | Source::Now => "= k.external_id".into(),
    })
}

/// A page's first statement: the run's row `$4` and the connection's `$5` locked and
/// counted as `found`, with [`LOOKUP`]'s rows beside the count, only while the run is
/// `running` and the connection's row holds the page's lease (holder `$6`, generation
/// `$7`; `NULL` for a run without one): the page's fence. `FOR NO KEY UPDATE` is the lock
/// the page's own updates of those rows take anyway, and the one a claim's `UPDATE` waits
/// for. The `LEFT JOIN` returns the count even when no key is stored.
static LOCK_AND_LOOKUP: LazyLock<String> = LazyLock::new(|| {
    names::sql(&format!(
        "WITH page_rows AS (SELECT count(*) AS found FROM (SELECT 1 FROM {{sync_runs}} r, \
         {{connections}} c WHERE r.{{sync_run::Id}} = $4 AND c.{{connection::Id}} = $5 \
         AND {held} FOR NO KEY UPDATE) AS locked) \
         SELECT p.found, {stored} FROM page_rows AS p LEFT JOIN ({lookup}) AS l ON true",
        stored = row::column_list("l.", row::STORED),
        lookup = *LOOKUP,
        held = held_by("$6", "$7"),
    ))
});

/// The fence on the run's row `r` and the connection's row `c`: the run is `running`, and
/// the connection's row holds the lease given as `holder` and `generation` (both `NULL`
/// for a run without a lease).
fn held_by(holder: &str, generation: &str) -> String {
    names::sql(&format!(
        "r.{{sync_run::Status}} = {{status::Running}} AND ({holder}::text IS NULL \
         OR (c.{{connection::LeaseHolder}} = {holder}::text \
         AND c.{{connection::LeaseGeneration}} = {generation}::bigint))"
    ))
}

/// The page's lease as the values of [`held_by`]'s holder and generation.
fn lease_values(lease: Option<&Fence>) -> [Value; 2] {
    [
        lease.map(|fence| fence.holder.clone()).into(),
        lease.map(|fence| fence.generation).into(),
    ]
}

/// How many of the pairs (`$3`, `$4`) are stored live with that hash, each id one probe as in
/// [`LOOKUP`].
static COUNT_UNCHANGED: LazyLock<String> = LazyLock::new(|| {
    names::sql(&format!(
        "SELECT count(*) AS unchanged \
         FROM unnest($3::text[], $4::text[]) AS k(external_id, content_hash) \
         CROSS JOIN LATERAL (SELECT {{record::ContentHash}}, {{record::DeletedAt}} FROM {{records}} \
         WHERE {key} LIMIT 1) AS r \
         WHERE r.{{record::ContentHash}} = k.content_hash AND r.{{record::DeletedAt}} IS NULL",
        key = key_probe(),
    ))
});

/// The new records as rows ([`row::NEW_ROW`]): first the values every row shares (user
/// `$1`, provider `$2`, run `$3`, time `$4`), then each field of the records as an array
/// (ids, payloads and hashes, `$5` to `$7`), so the statement has the same parameters
/// whatever the page size and is prepared and planned once.
struct NewRows {
    sql: String,
    shared: Vec<Source>,
    fields: Vec<Field>,
}

impl NewRows {
    fn new() -> NewRows {
        let shared = row::shared_sources(&row::NEW_ROW);
        let fields = row::record_fields(&row::NEW_ROW);
        let mut rows = NewRows {
            sql: String::new(),
            shared,
            fields,
        };
        let values: Vec<String> = row::NEW_ROW
            .iter()
            .map(|(_, source)| match source {
                Source::Record(field) => format!("r.{}", field.name()),
                shared => rows.param(*shared),
            })
            .collect();
        let arrays: Vec<String> = (rows.shared.len()..rows.parameters())
            .map(|index| format!("${}::text[]", index + 1))
            .collect();
        let names: Vec<&str> = rows.fields.iter().map(|field| field.name()).collect();
        rows.sql = names::sql(&format!(
            "INSERT INTO {{records}} ({columns}) SELECT {values} \
             FROM unnest({arrays}) AS r({names})",
            columns = row::new_row_columns(),
            values = values.join(", "),
            arrays = arrays.join(", "),
            names = names.join(", "),
        ));
        rows
    }

    /// The parameter (`$n`) of a value every row shares.
    fn param(&self, source: Source) -> String {
        let index = self.shared.iter().position(|shared| *shared == source);
        index.map_or_else(String::new, |index| format!("${}", index + 1))
    }

    /// How many parameters the rows take; a statement's own follow them.
    fn parameters(&self) -> usize {
        self.shared.len() + self.fields.len()
    }

    /// The rows' values, in parameter order, for `records` of `page`.
    fn values(&self, page: &RowPage<'_>, records: &[&Record]) -> Vec<Value> {
        let shared = self.shared.iter().map(|source| page.shared(*source));
        let arrays = self.fields.iter().map(|field| {
            let column: Vec<String> = records
                .iter()
                .map(|record| field.of(record).to_owned())
                .collect();
            Value::from(column)
        });
        shared.chain(arrays).collect()
    }
}

static NEW_ROWS: LazyLock<NewRows> = LazyLock::new(NewRows::new);

/// [`NEW_ROWS`], a key that exists skipped, and an `inserted` change in the batch and at
/// the ordinals given after the rows' values, for each row that went in (those
/// `RETURNING` gives back). Its row count is the changes', which is the rows inserted.
static INSERT: LazyLock<String> = LazyLock::new(|| {
    let batch = NEW_ROWS.parameters() + 1;
    names::sql(&format!(
        "WITH inserted AS ({new_rows} \
         ON CONFLICT ({key}) DO NOTHING RETURNING {{record::ExternalId}}) \
         INSERT INTO {{changes}} ({{change::BatchId}}, {{change::Ordinal}}, \
         {{change::ExternalId}}, {{change::Kind}}) \
         SELECT ${batch}, ${ordinal} + row_number() OVER () - 1, {{record::ExternalId}}, \
         {{kind::Inserted}} FROM inserted",
        new_rows = NEW_ROWS.sql,
        key = row::key_columns(),
        ordinal = batch + 1,
    ))
});

/// Where the run's counters start among [`NEW_PAGE`]'s parameters: after the rows'.
fn first_counter() -> usize {
    NEW_ROWS.parameters() + 1
}

/// An all-new page in one statement: [`NEW_ROWS`] (no conflict clause), the run's
/// counters (after the rows' values, in [`PageBookkeeping::counter_values`] order), and the
/// checkpoint, connection id and stream id that follow them (the checkpoint saved on the
/// stream's row), written only while the run's row and the connection's (which it locks
/// first) and the change clock's exist, and the rows hold the page's lease (its holder and
/// generation follow the stream id: [`held_by`]). Once any row is
/// in, a batch stamped with the transaction's seq (which needs the clock's offset)
/// records an `inserted` change per row. Returns how many of the page's rows it found (1
/// when all three exist).
static NEW_PAGE: LazyLock<String> = LazyLock::new(|| {
    let page = PageBookkeeping {
        run_id: 0,
        counts: &RunCounts::default(),
        connection_id: 0,
        stream_id: 0,
        checkpoint: CheckpointMove::Keep,
        now: DateTime::<Utc>::UNIX_EPOCH,
        lease: None,
    };
    let counters = page.counter_values();
    let set_counters = counters
        .iter()
        .enumerate()
        .map(|(offset, (column, _))| format!("{} = ${}", column.as_str(), first_counter() + offset))
        .collect::<Vec<_>>()
        .join(", ");
    let checkpoint = first_counter() + counters.len();
    let connection_id = checkpoint + 1;
    let stream_id = connection_id + 1;
    let held = held_by(
        &format!("${}", stream_id + 1),
        &format!("${}", stream_id + 2),
    );
    let [user, provider, run, now] = [Source::User, Source::Provider, Source::Run, Source::Now]
        .map(|source| NEW_ROWS.param(source));
    names::sql(&format!(
        "WITH page_rows AS (SELECT 1 FROM {{sync_runs}} r, {{connections}} c, {{change_clock}} k \
         WHERE r.{{sync_run::Id}} = {run} AND c.{{connection::Id}} = ${connection_id} \
         AND k.{{change_clock::Id}} = {CLOCK_ROW} AND {held} FOR NO KEY UPDATE OF r, c), \
         inserted AS ({new_rows} WHERE EXISTS (SELECT 1 FROM page_rows) \
         RETURNING {{record::ExternalId}}), \
         saved_run AS (UPDATE {{sync_runs}} SET {set_counters} \
         WHERE {{sync_run::Id}} = {run} AND EXISTS (SELECT 1 FROM page_rows)), \
         saved_stream AS (UPDATE {{connection_streams}} \
         SET {{connection_stream::Checkpoint}} = ${checkpoint}, \
         {{connection_stream::UpdatedAt}} = {now} \
         WHERE {{connection_stream::Id}} = ${stream_id} AND EXISTS (SELECT 1 FROM page_rows)), \
         batch AS (INSERT INTO {{change_batches}} ({{change_batch::Seq}}, {{change_batch::RunId}}, \
         {{change_batch::UserId}}, {{change_batch::Provider}}, {{change_batch::CommittedAt}}) \
         SELECT {seq}, {run}, {user}, {provider}, {now} WHERE EXISTS (SELECT 1 FROM inserted) \
         RETURNING {{change_batch::Id}}), \
         logged AS (INSERT INTO {{changes}} ({{change::BatchId}}, {{change::Ordinal}}, \
         {{change::ExternalId}}, {{change::Kind}}) SELECT batch.{{change_batch::Id}}, \
         row_number() OVER () - 1, inserted.{{record::ExternalId}}, {{kind::Inserted}} \
         FROM batch CROSS JOIN inserted) \
         SELECT count(*) AS found FROM page_rows",
        new_rows = NEW_ROWS.sql,
        seq = *TRANSACTION_SEQ,
    ))
});

/// PostgreSQL's own refusals outside the standard classes: `RAISE EXCEPTION` in a trigger,
/// and a lock not available at once.
const RAISE_EXCEPTION: &str = "P0001";
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// The store on a PostgreSQL database.
pub(crate) struct PostgresStore<'a> {
    db: &'a DatabasePools,
}

impl<'a> PostgresStore<'a> {
    pub(crate) fn new(db: &'a DatabasePools) -> PostgresStore<'a> {
        PostgresStore { db }
    }
}

/// One field of every record, as a `text[]` value.
fn text_array<'r>(records: impl Iterator<Item = &'r Record>, field: Field) -> Value {
    let column: Vec<String> = records.map(|record| field.of(record).to_owned()).collect();
    column.into()
}

#[async_trait::async_trait]
impl StoreBackend for PostgresStore<'_> {
    fn new_pages(&self) -> Option<&dyn NewPageWriter> {
        Some(self)
    }

    async fn count_unchanged(
        &self,
        context: &PageContext<'_>,
        records: &[Record],
    ) -> Result<u64, StoreError> {
        let values = vec![
            context.connection.user_id.as_str().into(),
            context.stream.namespace().into(),
            text_array(records.iter(), Field::ExternalId),
            text_array(records.iter(), Field::ContentHash),
        ];
        let statement =
            Statement::from_sql_and_values(DbBackend::Postgres, COUNT_UNCHANGED.as_str(), values);
        let count: i64 = match self.db.query_one_raw(statement).await? {
            Some(row) => row.try_get("", "unchanged")?,
            None => 0,
        };
        Ok(u64::try_from(count).unwrap_or(0))
    }

    async fn lookup(
        &self,
        txn: &DatabaseTransaction,
        context: &PageContext<'_>,
        records: &[Record],
    ) -> Result<Existing, StoreError> {
        let values = vec![
            context.connection.user_id.as_str().into(),
            context.stream.namespace().into(),
            text_array(records.iter(), Field::ExternalId),
        ];
        let statement =
            Statement::from_sql_and_values(DbBackend::Postgres, LOOKUP.as_str(), values);
        Ok(stored_keys_of(txn.query_all_raw(statement).await?)?)
    }

    async fn lock_and_lookup(
        &self,
        txn: &DatabaseTransaction,
        context: &PageContext<'_>,
        records: &[Record],
    ) -> Result<Existing, StoreError> {
        let values: Vec<Value> = [
            context.connection.user_id.as_str().into(),
            context.stream.namespace().into(),
            text_array(records.iter(), Field::ExternalId),
            context.run_id.into(),
            context.connection.id.into(),
        ]
        .into_iter()
        .chain(lease_values(context.lease))
        .collect();
        let statement =
            Statement::from_sql_and_values(DbBackend::Postgres, LOCK_AND_LOOKUP.as_str(), values);
        locked_stored_keys(txn.query_all_raw(statement).await?)
    }

    async fn insert(
        &self,
        txn: &DatabaseTransaction,
        context: &PageContext<'_>,
        records: &[&Record],
        now: DateTime<Utc>,
        slot: ChangeSlot,
    ) -> Result<u64, StoreError> {
        let mut values = NEW_ROWS.values(&context.row_page(now), records);
        values.push(slot.batch_id.into());
        values.push(slot.first.into());
        let statement =
            Statement::from_sql_and_values(DbBackend::Postgres, INSERT.as_str(), values);
        Ok(txn.execute_raw(statement).await?.rows_affected())
    }

    /// One statement: the run's update in a `WITH`, and the connection updated only if
    /// the run's row was, so one row changed means both.
    async fn save_bookkeeping(
        &self,
        txn: &DatabaseTransaction,
        page: &PageBookkeeping<'_>,
    ) -> Result<(), StoreError> {
        let CheckpointMove::Write(checkpoint) = page.checkpoint else {
            return save_counts_of(txn, page).await;
        };
        let run = page
            .counts_update()
            .returning_col(sync_run::Column::Id)
            .to_owned();
        let saved = Alias::new("saved_run");
        let mut next = page.checkpoint_update(checkpoint)?;
        next.and_where(Expr::exists(
            Query::select()
                .expr(Expr::val(1))
                .from(saved.clone())
                .to_owned(),
        ));
        let cte = CommonTableExpression::new()
            .query(run)
            .table_name(saved)
            .to_owned();
        let (sql, values) = WithClause::new()
            .cte(cte)
            .to_owned()
            .query(next)
            .build(PostgresQueryBuilder);
        let statement = Statement::from_sql_and_values(DbBackend::Postgres, sql, values);
        if txn.execute_raw(statement).await?.rows_affected() != 1 {
            return Err(StoreError::RowGone);
        }
        Ok(())
    }

    fn refusal(&self, error: &dyn DatabaseError) -> Option<Refusal> {
        let code = error.code()?;
        match &*code {
            RAISE_EXCEPTION => Some(Refusal::RefusedRow),
            LOCK_NOT_AVAILABLE => Some(Refusal::Contention),
            code => refusal_by_sqlstate(code),
        }
    }
}

#[async_trait::async_trait]
impl NewPageWriter for PostgresStore<'_> {
    /// One statement ([`NEW_PAGE`]) when the page's checkpoint moves; a transaction
    /// otherwise (a replay).
    async fn write_new_page(
        &self,
        context: &PageContext<'_>,
        records: &[Record],
        bookkeeping: &PageBookkeeping<'_>,
    ) -> Result<(), StoreError> {
        let checkpoint = match bookkeeping.checkpoint {
            CheckpointMove::Write(checkpoint) => checkpoint,
            _ => {
                return write_new_page_in_transaction(self, self.db, context, records, bookkeeping)
                    .await
            }
        };
        let records: Vec<&Record> = records.iter().collect();
        let mut values = NEW_ROWS.values(&context.row_page(bookkeeping.now), &records);
        values.extend(
            bookkeeping
                .counter_values()
                .into_iter()
                .map(|(_, value)| value),
        );
        values.push(checkpoint_column(checkpoint)?.into());
        values.push(bookkeeping.connection_id.into());
        values.push(bookkeeping.stream_id.into());
        values.extend(lease_values(bookkeeping.lease));
        let statement =
            Statement::from_sql_and_values(DbBackend::Postgres, NEW_PAGE.as_str(), values);
        let found: i64 = match self.db.query_one_raw(statement).await? {
            Some(row) => row.try_get("", "found")?,
            None => 0,
        };
        if found != 1 {
            return Err(StoreError::RowGone);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::ground::counter_columns;

    #[test]
    fn every_statement_names_its_tables_and_columns() {
        for sql in [
            &*LOOKUP,
            &*LOCK_AND_LOOKUP,
            &*COUNT_UNCHANGED,
            &*INSERT,
            &*NEW_PAGE,
        ] {
            assert!(!sql.contains('{'), "{sql}");
        }
    }

    #[test]
    fn the_new_page_statement_sets_every_counter_and_the_heartbeat() {
        let counters = counter_columns(&RunCounts::default()).len();
        for column in counter_columns(&RunCounts::default()).map(|(column, _)| column) {
            assert!(NEW_PAGE.contains(&format!("{} = $", column.as_str())));
        }
        assert!(NEW_PAGE.contains(&format!(
            "{} = ${}",
            sync_run::Column::HeartbeatAt.as_str(),
            first_counter() + counters
        )));
    }
}
