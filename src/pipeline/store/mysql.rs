//! MySQL and MariaDB's store strategy: every statement built by sea-query, and no
//! all-new shortcut ([`StoreBackend::new_pages`] is `None`).
//!
//! MySQL has no `DO NOTHING`: the conflict clause is `ON DUPLICATE KEY UPDATE id = id`,
//! and with the found-rows flag sqlx sets, a skipped row counts as affected too. So the
//! rows an insert took are read back by a query of their own, which names their changes,
//! and the all-new shortcut, which trusts an insert's row count, is not taken.

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Alias, Condition, Expr, ExprTrait, LockType, Query, SelectStatement};
use sea_orm::sqlx::error::DatabaseError;
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseTransaction, DbErr, EntityTrait, QueryFilter, QuerySelect,
};
use tributary_providers::Record;

use super::backend::{
    insert_statement, locked_stored_keys, refusal_by_sqlstate, save_counts_of, Existing,
    NewPageWriter, PageBookkeeping, Refusal, StoreBackend, StoreError, Stored,
};
use super::context::PageContext;
use crate::db::DatabasePools;
use crate::entities::change::ChangeKind;
use crate::entities::sync_run::RunStatus;
use crate::entities::{connection, record, sync_run};
use crate::pipeline::changes::{record_changes, ChangeSlot};
use crate::pipeline::checkpoint::CheckpointMove;
use crate::pipeline::ground::row;

/// MySQL's refusals that its SQLSTATE leaves general (`HY000`) or puts elsewhere: a
/// `SIGNAL` in a trigger, an incorrect string value, a failed check constraint, a lock
/// wait timeout.
const SIGNAL_SQLSTATE: &str = "45000";
const ER_TRUNCATED_WRONG_VALUE_FOR_FIELD: u16 = 1366;
const ER_CHECK_CONSTRAINT_VIOLATED: u16 = 3819;
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;

/// The store on a MySQL or MariaDB database.
pub(crate) struct MySqlStore<'a> {
    db: &'a DatabasePools,
}

impl<'a> MySqlStore<'a> {
    pub(crate) fn new(db: &'a DatabasePools) -> MySqlStore<'a> {
        MySqlStore { db }
    }
}

/// The stored rows of `records`' keys.
async fn stored_keys(
    db: &impl ConnectionTrait,
    context: &PageContext<'_>,
    records: &[Record],
) -> Result<Existing, DbErr> {
    let rows: Vec<(i64, String, String, Option<i64>)> = record::Entity::find()
        .select_only()
        .columns(row::STORED)
        .filter(page_keys(context, records.iter()))
        .into_tuple()
        .all(db)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(id, external_id, hash, deleted_by)| {
            (external_id, Stored::from_row(id, hash, deleted_by))
        })
        .collect())
}

/// The condition that a row's key is one of `records`' ([`row::key_condition`]).
fn page_keys<'r>(
    context: &PageContext<'_>,
    records: impl Iterator<Item = &'r Record>,
) -> Condition {
    row::key_condition(
        &context.connection.user_id,
        context.stream.namespace(),
        records.map(|record| record.external_id.as_str()),
    )
}

/// `SELECT page_rows.found, records.id, records.external_id, records.content_hash,
/// records.deleted_by_run_id FROM
/// (SELECT COUNT(*) AS found FROM (SELECT 1 FROM sync_runs, connections WHERE sync_runs.id
/// = ? AND connections.id = ? AND <the page's lease> FOR UPDATE) AS locked) AS page_rows
/// LEFT JOIN records ON <the key is one of the page's>` (`found` counting the locked rows
/// whose run is `running`): the page's two rows locked and counted, only while the run is
/// `running` and the connection's row holds the page's lease (its fence), and the stored
/// keys beside them. The outer read is not a locking one, so no record's row is locked; the `LEFT
/// JOIN` returns the count even when no key is stored.
fn lock_and_lookup_statement(context: &PageContext<'_>, records: &[Record]) -> SelectStatement {
    // The status is read, not filtered on: a condition on it lets MariaDB lock gaps of
    // `sync_runs`' status index, which the closing update of another run inserts into.
    let mut locked = Query::select()
        .expr_as(
            Expr::col((sync_run::Entity, sync_run::Column::Status))
                .eq(sea_orm::ActiveEnum::to_value(&RunStatus::Running)),
            Alias::new("running"),
        )
        .from(sync_run::Entity)
        .from(connection::Entity)
        .and_where(Expr::col((sync_run::Entity, sync_run::Column::Id)).eq(context.run_id))
        .and_where(
            Expr::col((connection::Entity, connection::Column::Id)).eq(context.connection.id),
        )
        .lock(LockType::Update)
        .to_owned();
    if let Some(fence) = context.lease {
        locked
            .and_where(
                Expr::col((connection::Entity, connection::Column::LeaseHolder))
                    .eq(fence.holder.as_str()),
            )
            .and_where(
                Expr::col((connection::Entity, connection::Column::LeaseGeneration))
                    .eq(fence.generation),
            );
    }
    let page_rows = Query::select()
        .expr_as(
            Expr::cust("CAST(COALESCE(SUM(`locked`.`running`), 0) AS SIGNED)"),
            Alias::new("found"),
        )
        .from_subquery(locked, Alias::new("locked"))
        .to_owned();
    Query::select()
        .column((Alias::new("page_rows"), Alias::new("found")))
        .columns(row::STORED.map(|column| (record::Entity, column)))
        .from_subquery(page_rows, Alias::new("page_rows"))
        .left_join(record::Entity, page_keys(context, records.iter()))
        .to_owned()
}

#[async_trait::async_trait]
impl StoreBackend for MySqlStore<'_> {
    /// None: an insert's row count counts skipped rows too (see the module's header).
    fn new_pages(&self) -> Option<&dyn NewPageWriter> {
        None
    }

    async fn count_unchanged(
        &self,
        context: &PageContext<'_>,
        records: &[Record],
    ) -> Result<u64, StoreError> {
        let existing = stored_keys(self.db, context, records).await?;
        let unchanged = records.iter().filter(|record| {
            existing
                .get(&record.external_id)
                .is_some_and(|stored| !stored.deleted && stored.content_hash == record.content_hash)
        });
        Ok(unchanged.count() as u64)
    }

    async fn lookup(
        &self,
        txn: &DatabaseTransaction,
        context: &PageContext<'_>,
        records: &[Record],
    ) -> Result<Existing, StoreError> {
        Ok(stored_keys(txn, context, records).await?)
    }

    async fn lock_and_lookup(
        &self,
        txn: &DatabaseTransaction,
        context: &PageContext<'_>,
        records: &[Record],
    ) -> Result<Existing, StoreError> {
        let statement = lock_and_lookup_statement(context, records);
        locked_stored_keys(txn.query_all(&statement).await?)
    }

    /// The keys were all missing at the lookup, so the rows of this run among them are
    /// the ones this insert took: read back (a plain read, which locks nothing, unlike
    /// `INSERT ... SELECT`, whose next-key locks on `records` would hold off concurrent
    /// inserts of neighbouring keys), they are the changes recorded and the row count.
    async fn insert(
        &self,
        txn: &DatabaseTransaction,
        context: &PageContext<'_>,
        records: &[&Record],
        now: DateTime<Utc>,
        slot: ChangeSlot,
    ) -> Result<u64, StoreError> {
        txn.execute(&insert_statement(context, records, now)?)
            .await?;
        let inserted: Vec<String> = record::Entity::find()
            .select_only()
            .column(record::Column::ExternalId)
            .filter(page_keys(context, records.iter().copied()))
            .filter(record::Column::FirstSeenRunId.eq(context.run_id))
            .into_tuple()
            .all(txn)
            .await?;
        let keys = inserted.iter().map(String::as_str);
        Ok(record_changes(txn, slot, ChangeKind::Inserted, keys).await?)
    }

    /// Two statements: MySQL's prepared statements take neither a `WITH` that writes nor
    /// several statements at once.
    async fn save_bookkeeping(
        &self,
        txn: &DatabaseTransaction,
        page: &PageBookkeeping<'_>,
    ) -> Result<(), StoreError> {
        let CheckpointMove::Write(checkpoint) = page.checkpoint else {
            return save_counts_of(txn, page).await;
        };
        for statement in [page.counts_update(), page.checkpoint_update(checkpoint)?] {
            if txn.execute(&statement).await?.rows_affected() == 0 {
                return Err(StoreError::RowGone);
            }
        }
        Ok(())
    }

    fn refusal(&self, error: &dyn DatabaseError) -> Option<Refusal> {
        let number = error
            .try_downcast_ref::<sea_orm::sqlx::mysql::MySqlDatabaseError>()
            .map(|error| error.number());
        match number {
            Some(ER_TRUNCATED_WRONG_VALUE_FOR_FIELD | ER_CHECK_CONSTRAINT_VIOLATED) => {
                return Some(Refusal::RefusedRow)
            }
            Some(ER_LOCK_WAIT_TIMEOUT) => return Some(Refusal::Contention),
            _ => {}
        }
        match &*error.code()? {
            SIGNAL_SQLSTATE => Some(Refusal::RefusedRow),
            code => refusal_by_sqlstate(code),
        }
    }
}
