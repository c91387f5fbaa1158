//! Storing the objects a webhook delivery carried, in the page's transaction: each is
//! written only over an older stored version (`records.source_version`), and the
//! comparison is the `WHERE` of the write itself. A lookup read before another writer
//! committed may be stale (PostgreSQL's page lookup reads its snapshot from before the
//! lock it waited on); the write's own condition is evaluated on the row as committed, so
//! two instances applying deliveries of one object cannot put the older over the newer.
//! A deletion of a key never stored leaves a row marked deleted with its version (a
//! tombstone), so that a late, older delivery cannot store the object live.
//! (docs/decisions/webhook-versions.md)

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Condition, Expr, ExprTrait, OnConflict, UpdateStatement};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseTransaction, DbErr, EntityTrait, QueryFilter,
    QuerySelect, QueryTrait, Set, TransactionTrait,
};
use tributary_providers::record::sha256_hex;
use tributary_providers::{DeletedRecord, Record, RejectedRecord};

use super::backend::{update_statement, Existing, StoreBackend};
use super::context::PageContext;
use super::run_errors::persist_failure;
use super::writes::{insert_carefully, PageChanges};
use crate::entities::change::ChangeKind;
use crate::entities::record;
use crate::pipeline::changes;
use crate::pipeline::ground::row;
use crate::pipeline::ground::PageStoreCounts;

/// A versioned page's writes in its transaction.
pub(super) struct VersionedWrite<'a> {
    pub backend: &'a dyn StoreBackend,
    pub txn: &'a DatabaseTransaction,
    pub context: &'a PageContext<'a>,
    /// The page's objects' version.
    pub version: &'a str,
    pub now: DateTime<Utc>,
}

impl VersionedWrite<'_> {
    /// Writes `records` and `deleted` each only over an older stored version, adding to
    /// `counts`: an object older than (or as old as) the stored one counts as unchanged.
    /// Records the database refuses go to `failed`.
    pub(super) async fn write(
        &self,
        existing: &Existing,
        records: &[Record],
        deleted: &[DeletedRecord],
        counts: &mut PageStoreCounts,
        changes: &mut PageChanges,
        failed: &mut Vec<RejectedRecord>,
    ) -> Result<(), DbErr> {
        for record in records {
            match existing.get(&record.external_id) {
                None => self.insert(record, counts, changes, failed).await?,
                Some(stored) if !stored.deleted && stored.content_hash == record.content_hash => {
                    // Same content, perhaps a newer version of it: older deliveries
                    // compare with the newest.
                    self.advance(&record.external_id).await?;
                    counts.unchanged += 1;
                }
                Some(stored) => {
                    let kind = match stored.deleted {
                        true => ChangeKind::Restored,
                        false => ChangeKind::Updated,
                    };
                    match self.rewrite(stored.id, record, kind, changes).await {
                        Ok(true) if kind == ChangeKind::Restored => counts.restored += 1,
                        Ok(true) => counts.updated += 1,
                        Ok(false) => counts.unchanged += 1,
                        Err(error) => failed.push(persist_failure(record.clone(), &error.into())),
                    }
                }
            }
        }
        for gone in deleted {
            if self.mark_deleted(&gone.external_id, changes).await? {
                counts.deleted += 1;
                continue;
            }
            if !self.stored(&gone.external_id).await? {
                self.tombstone(gone).await?;
            }
            self.advance(&gone.external_id).await?;
        }
        Ok(())
    }

    /// Inserts a record the lookup did not find, then stamps its version. A key another
    /// writer inserted meanwhile is a duplicate skip, as on any page; the caller stores
    /// the page again to compare with it.
    async fn insert(
        &self,
        record: &Record,
        counts: &mut PageStoreCounts,
        changes: &mut PageChanges,
        failed: &mut Vec<RejectedRecord>,
    ) -> Result<(), DbErr> {
        let (backend, txn, context, now) = (self.backend, self.txn, self.context, self.now);
        let inserted = insert_carefully(backend, txn, context, &[record], now, changes).await?;
        counts.inserted += inserted.inserted;
        counts.duplicate += inserted.duplicate;
        changes.recorded += inserted.inserted;
        failed.extend(inserted.failed);
        if inserted.inserted == 1 {
            self.advance(&record.external_id).await?;
        }
        Ok(())
    }

    /// Rewrites stored row `id` with `record` if its stored version is older, recording a
    /// change of `kind`; in a savepoint, so a refused row costs this record only.
    async fn rewrite(
        &self,
        id: i64,
        record: &Record,
        kind: ChangeKind,
        changes: &mut PageChanges,
    ) -> Result<bool, DbErr> {
        let savepoint = self.txn.begin().await?;
        let mut update = update_statement(self.context.row_page(self.now), &[(id, record)]);
        update
            .value(record::Column::SourceVersion, self.version)
            .cond_where(self.older());
        let written = match savepoint.execute(&update).await {
            Ok(result) => result.rows_affected() == 1,
            Err(error) => {
                savepoint.rollback().await?;
                return Err(error);
            }
        };
        savepoint.commit().await?;
        if written {
            self.record_change(&record.external_id, kind, changes)
                .await?;
        }
        Ok(written)
    }

    /// Marks the live record `external_id` deleted by the page's run if its stored
    /// version is older; whether it did.
    async fn mark_deleted(
        &self,
        external_id: &str,
        changes: &mut PageChanges,
    ) -> Result<bool, DbErr> {
        let update = record::Entity::update_many()
            .col_expr(record::Column::DeletedAt, Expr::value(self.now))
            .col_expr(
                record::Column::DeletedByRunId,
                Expr::value(self.context.run_id),
            )
            .col_expr(record::Column::UpdatedAt, Expr::value(self.now))
            .col_expr(record::Column::SourceVersion, Expr::value(self.version))
            .filter(self.key(external_id))
            .filter(record::Column::DeletedAt.is_null())
            .filter(self.older());
        let written = update.exec(self.txn).await?.rows_affected == 1;
        if written {
            self.record_change(external_id, ChangeKind::Deleted, changes)
                .await?;
        }
        Ok(written)
    }

    /// Whether a row of `external_id` is stored, live or deleted.
    async fn stored(&self, external_id: &str) -> Result<bool, DbErr> {
        let found = record::Entity::find()
            .select_only()
            .column(record::Column::Id)
            .filter(self.key(external_id))
            .into_tuple::<i64>()
            .one(self.txn)
            .await?;
        Ok(found.is_some())
    }

    /// Keeps the deletion of a key never stored as a row marked deleted with the page's
    /// version, so that an older delivery of the object compares with it and stores
    /// nothing, while a listing that returns the object restores it as any deleted
    /// record. No change: the app never saw the record, and a run would not have either.
    async fn tombstone(&self, gone: &DeletedRecord) -> Result<(), DbErr> {
        let (run_id, now) = (self.context.run_id, self.now);
        let row = record::ActiveModel {
            user_id: Set(self.context.connection.user_id.clone()),
            provider: Set(self.context.stream.namespace().to_string()),
            external_id: Set(gone.external_id.clone()),
            payload: Set(gone.payload.clone()),
            content_hash: Set(sha256_hex(gone.payload.as_bytes())),
            first_seen_run_id: Set(run_id),
            last_seen_run_id: Set(run_id),
            created_at: Set(now),
            updated_at: Set(now),
            deleted_at: Set(Some(now)),
            deleted_by_run_id: Set(Some(run_id)),
            source_version: Set(Some(self.version.to_string())),
            ..Default::default()
        };
        // MySQL has no `DO NOTHING` (see `backend::insert_statement`).
        let on_conflict = OnConflict::columns(record::KEY_COLUMNS)
            .do_nothing_on([record::Column::Id])
            .to_owned();
        record::Entity::insert(row)
            .on_conflict(on_conflict)
            .exec_without_returning(self.txn)
            .await
            .map(|_| ())
    }

    /// Stamps the page's version on the stored `external_id` if its own is older.
    async fn advance(&self, external_id: &str) -> Result<(), DbErr> {
        let update: UpdateStatement = record::Entity::update_many()
            .col_expr(record::Column::SourceVersion, Expr::value(self.version))
            .filter(self.key(external_id))
            .filter(self.older())
            .into_query();
        self.txn.execute(&update).await.map(|_| ())
    }

    async fn record_change(
        &self,
        external_id: &str,
        kind: ChangeKind,
        changes: &mut PageChanges,
    ) -> Result<(), DbErr> {
        let slot = changes.slot(self.txn, self.context, 1).await?;
        changes.recorded += changes::record_changes(self.txn, slot, kind, [external_id]).await?;
        Ok(())
    }

    /// The stored row of `external_id` under the page's user and namespace.
    fn key(&self, external_id: &str) -> Condition {
        row::key_condition(
            &self.context.connection.user_id,
            self.context.stream.namespace(),
            [external_id],
        )
    }

    /// The stored version is older than the page's: none yet, or less.
    fn older(&self) -> Condition {
        let column = Expr::col((record::Entity, record::Column::SourceVersion));
        Condition::any()
            .add(column.clone().is_null())
            .add(column.lt(self.version))
    }
}
