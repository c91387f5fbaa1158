//! A page's record writes as the policy composes them: the change batch of its
//! transaction, and the inserts of its new records, in one go or, under savepoints,
//! record by record.

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr, TransactionTrait};
use tributary_providers::{Record, RejectedRecord};

use super::backend::{StoreBackend, StoreError, RECORD_INSERT};
use super::context::PageContext;
use super::run_errors::persist_failure;
use crate::pipeline::changes::{self, ChangeBatch, ChangeSlot};

/// The change batch of a page's transaction: opened with its first record write, and
/// stamped as its last statement, or removed if every write was refused.
#[derive(Default)]
pub(crate) struct PageChanges {
    batch: Option<ChangeBatch>,
    /// Changes recorded in it (by writes that were not rolled back).
    pub(super) recorded: u64,
}

impl PageChanges {
    /// Places for the `count` changes of one statement in the page's batch, which is
    /// opened in `txn` on the first call.
    pub(crate) async fn slot(
        &mut self,
        txn: &DatabaseTransaction,
        context: &PageContext<'_>,
        count: usize,
    ) -> Result<ChangeSlot, DbErr> {
        let batch = match self.batch.take() {
            Some(batch) => batch,
            None => changes::open_batch(txn, context.batch_owner()).await?,
        };
        self.batch.insert(batch).reserve(count)
    }

    /// The page's last statement: the batch stamped, or removed when it holds nothing,
    /// so that a page that changed no record takes no seq.
    pub(super) async fn close(
        self,
        backend: &dyn StoreBackend,
        txn: &DatabaseTransaction,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        match &self.batch {
            Some(batch) if self.recorded > 0 => backend.stamp_batch(txn, batch, now).await,
            Some(batch) => Ok(changes::discard_batch(txn, batch).await?),
            None => Ok(()),
        }
    }
}

/// What inserting a page's new records did.
#[derive(Default)]
pub(crate) struct InsertOutcome {
    pub inserted: u64,
    /// Rows the unique index turned away because another writer inserted the key first.
    pub duplicate: u64,
    pub failed: Vec<RejectedRecord>,
}

impl InsertOutcome {
    /// Counts one insert of `rows` records that the database says inserted `inserted`:
    /// the rest were turned away by the unique index. A count above `rows` is the
    /// database contradicting itself, and fails the page instead of wrapping.
    fn add(&mut self, rows: usize, inserted: u64) -> Result<(), StoreError> {
        let skipped = (rows as u64)
            .checked_sub(inserted)
            .ok_or(StoreError::InsertedTooMany { inserted, rows })?;
        self.inserted += inserted;
        self.duplicate += skipped;
        Ok(())
    }
}

/// Inserts records not found by the lookup, without savepoints: the first failing
/// statement fails the whole insert (and, on PostgreSQL, the transaction).
pub(super) async fn insert_fast(
    backend: &dyn StoreBackend,
    txn: &DatabaseTransaction,
    context: &PageContext<'_>,
    records: &[&Record],
    now: DateTime<Utc>,
    changes: &mut PageChanges,
) -> Result<InsertOutcome, StoreError> {
    let mut outcome = InsertOutcome::default();
    for chunk in records.chunks(RECORD_INSERT.rows(txn.get_database_backend())) {
        let slot = changes.slot(txn, context, chunk.len()).await?;
        let inserted = backend.insert(txn, context, chunk, now, slot).await?;
        outcome.add(chunk.len(), inserted)?;
    }
    Ok(outcome)
}

/// Inserts records not found by the lookup, in key order. The unique index is the
/// backstop: a key a concurrent writer inserted in the meantime is skipped and counted
/// as a duplicate, never an error and never a second row. Each multi-row insert runs in
/// a savepoint; if it fails, its records are inserted one by one, each in its own
/// savepoint, and those the database refuses are returned as failed. Each insert's
/// changes go in with it, in its savepoint.
pub(crate) async fn insert_carefully(
    backend: &dyn StoreBackend,
    txn: &DatabaseTransaction,
    context: &PageContext<'_>,
    records: &[&Record],
    now: DateTime<Utc>,
    changes: &mut PageChanges,
) -> Result<InsertOutcome, StoreError> {
    let mut outcome = InsertOutcome::default();
    for chunk in records.chunks(RECORD_INSERT.rows(txn.get_database_backend())) {
        let slot = changes.slot(txn, context, chunk.len()).await?;
        let savepoint = txn.begin().await?;
        match backend.insert(&savepoint, context, chunk, now, slot).await {
            Ok(inserted) => {
                savepoint.commit().await?;
                outcome.add(chunk.len(), inserted)?;
            }
            Err(batch_error) => {
                savepoint.rollback().await?;
                tracing::warn!(error = %batch_error, rows = chunk.len(), "A multi-row insert failed; writing its records one by one.");
                for (index, record) in chunk.iter().enumerate() {
                    let savepoint = txn.begin().await?;
                    let one = std::slice::from_ref(record);
                    match backend
                        .insert(&savepoint, context, one, now, slot.at(index)?)
                        .await
                    {
                        Ok(inserted) => {
                            savepoint.commit().await?;
                            outcome.add(1, inserted)?;
                        }
                        Err(error) => {
                            savepoint.rollback().await?;
                            outcome
                                .failed
                                .push(persist_failure((*record).clone(), &error));
                        }
                    }
                }
            }
        }
    }
    Ok(outcome)
}

#[cfg(test)]
mod insert_outcome_tests {
    use super::InsertOutcome;

    #[test]
    fn rows_not_inserted_count_as_duplicates() {
        let mut outcome = InsertOutcome::default();
        outcome.add(100, 98).unwrap();
        outcome.add(1, 1).unwrap();
        assert_eq!((outcome.inserted, outcome.duplicate), (99, 2));
    }

    #[test]
    fn a_count_above_the_rows_sent_is_an_error_not_a_wrap() {
        let mut outcome = InsertOutcome::default();
        let error = outcome.add(1, 2).unwrap_err().to_string();
        assert!(
            error.contains("reported 2 rows inserted by an insert of 1"),
            "{error}"
        );
        assert_eq!((outcome.inserted, outcome.duplicate), (0, 0));
    }
}
