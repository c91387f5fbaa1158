//! Storing one page: the policy. It drops repeated keys, picks the page's write path
//! (see [`PageExpectation`]), and counts what each record came to; the statements are
//! written by the database's [`StoreBackend`] (`sqlite.rs`, `postgres.rs`, `mysql.rs`).
//!
//! A page is one transaction: one lookup, one insert of the new records with `ON
//! CONFLICT DO NOTHING`, one update of the changed ones, the error report and the
//! bookkeeping. It is written without savepoints first; if a record write fails for a
//! reason the careful path handles ([`Refusal`]), that transaction is rolled back and the
//! page is written again with savepoints, where a failing multi-row write is retried
//! record by record, so one record that cannot be written costs that record only.

mod append;
mod backend;
pub(super) mod context;
mod deleted;
mod mysql;
mod postgres;
mod run_errors;
mod sightings;
mod sqlite;
mod versioned;
mod writes;

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, TransactionTrait,
};
use tracing::Instrument;
use tributary_providers::{DeletedRecord, PageItem, Record, RecordStage, RejectedRecord};

use crate::config::WriteMode;
use crate::db::DatabasePools;
use crate::entities::change::ChangeKind;
use crate::pipeline::ground::begin_page_transaction;
use crate::pipeline::ground::{PageStoreCounts, RunCounts};

pub(crate) use crate::pipeline::checkpoint::CheckpointMove;
pub(crate) use append::sweep_expired_keys;
pub(crate) use backend::{
    ChangedRecord, NewPageWriter, PageBookkeeping, Refusal, StoreBackend, StoreError,
};
pub(crate) use context::{PageContext, PageExpectation};
pub(crate) use run_errors::{record_page_error, ErrorScope};

use backend::{explain_unheld, KEY_LOOKUP, RECORD_UPDATE};
use run_errors::{insert_run_errors, persist_failure};
use writes::{insert_carefully, insert_fast, PageChanges};

/// The store strategy of the database `db` is on.
pub(crate) fn backend_for(db: &DatabasePools) -> Box<dyn StoreBackend + '_> {
    match db.get_database_backend() {
        DbBackend::Sqlite => Box::new(sqlite::SqliteStore::new(db)),
        DbBackend::Postgres => Box::new(postgres::PostgresStore::new(db)),
        _ => Box::new(mysql::MySqlStore::new(db)),
    }
}

/// Stores one page in one transaction and adds its counts to `totals` (which are saved to
/// the run's row in the same transaction).
///
/// The write paths, in the order they are tried:
/// 1. [`PageExpectation::Unchanged`]: every record stored with the same hash, found
///    outside any transaction, and nothing is written.
/// 2. [`PageExpectation::New`]: the page and its bookkeeping in the backend's fewest
///    round trips, without a lookup ([`NewPageWriter::write_new_page`]), on a backend
///    that has the shortcut ([`StoreBackend::new_pages`]).
/// 3. The usual way: lookup, insert, update, error rows and bookkeeping in one
///    transaction without savepoints ([`Mode::Fast`]);
/// 4. and if a record write of it fails, again with savepoints ([`Mode::Careful`]).
///
/// A shortcut that fails goes on to the usual way only when it failed for a reason the
/// usual way handles ([`Refusal`]); any other error fails the page, logged and counted.
pub(crate) async fn store_page(
    db: &DatabasePools,
    context: &PageContext<'_>,
    items: Vec<PageItem>,
    totals: &mut RunCounts,
) -> Result<PageStoreCounts, DbErr> {
    let backend = backend_for(db);
    let backend = backend.as_ref();
    let mut counts = PageStoreCounts::default();
    let fetched = items.len() as u64;
    let mut rejected: Vec<RejectedRecord> = Vec::new();
    let items = keep_last_of_each_key(items, &mut counts);
    let mut records: Vec<Record> = Vec::with_capacity(items.len());
    let mut deleted: Vec<DeletedRecord> = Vec::new();
    for item in items {
        match item {
            PageItem::Record(record) => records.push(record),
            PageItem::Rejected(reject) => rejected.push(reject),
            PageItem::Deleted(gone) => match context.mode {
                WriteMode::Upsert => deleted.push(gone),
                WriteMode::Append { .. } => rejected.push(not_appendable(gone)),
            },
        }
    }
    // One order for every writer makes lock waits between concurrent inserts less likely.
    records.sort_by(|a, b| a.external_id.cmp(&b.external_id));
    let shortcut = rejected.is_empty()
        && deleted.is_empty()
        && context.mode == WriteMode::Upsert
        && context.version.is_none();
    if shortcut
        && context.expect == PageExpectation::Unchanged
        && all_stored_unchanged(backend, db.get_database_backend(), context, &records).await?
    {
        if context.sightings {
            sightings::record_alone(db, context, &sightings::page_keys(&records, &[])).await?;
        }
        counts.unchanged += records.len() as u64;
        counts.deferred = true;
        totals.fetched += fetched;
        totals.unchanged += counts.unchanged;
        totals.duplicate += counts.duplicate;
        return Ok(counts);
    }
    let page = PageWrite {
        backend,
        context,
        records: &records,
        rejected: &rejected,
        deleted: &deleted,
        fetched,
        counts,
    };
    if let (true, PageExpectation::New, Some(new_pages)) =
        (shortcut, context.expect, backend.new_pages())
    {
        let span = transaction_span("all_new");
        if let Some(counts) = page
            .write_all_new(new_pages, totals)
            .instrument(span)
            .await?
        {
            backend.committed();
            return Ok(counts);
        }
    }
    let span = transaction_span("usual");
    let counts = match page
        .write(db, totals, Mode::Fast)
        .instrument(span.clone())
        .await
    {
        Ok(counts) => counts,
        Err(PageFailure::Record(error)) => {
            failed_on(&span, &error);
            let reason = careful_path_handles(backend, "usual", error)?;
            tracing::warn!(
                reason = reason.as_str(),
                "Writing a record failed; writing the page again record by record where needed."
            );
            let careful = transaction_span("careful");
            match page
                .write(db, totals, Mode::Careful)
                .instrument(careful.clone())
                .await
            {
                Ok(counts) => counts,
                Err(PageFailure::Record(error) | PageFailure::Database(error)) => {
                    failed_on(&careful, &error);
                    return Err(error.into());
                }
            }
        }
        Err(PageFailure::Database(error)) => {
            failed_on(&span, &error);
            return Err(error.into());
        }
    };
    backend.committed();
    Ok(counts)
}

/// The span of one of a page's transactions; `path` is the way it is written (`all_new`,
/// `usual`, `careful`).
fn transaction_span(path: &'static str) -> tracing::Span {
    tracing::debug_span!(
        "store.transaction",
        path,
        "otel.status_code" = tracing::field::Empty,
        "otel.status_description" = tracing::field::Empty,
    )
}

/// Marks a transaction's span failed, rolled back for `error`.
fn failed_on(span: &tracing::Span, error: &StoreError) {
    span.record("otel.status_code", "ERROR")
        .record("otel.status_description", error.to_string());
}

/// The reason a fast path failed with `error`, if the careful path handles it; counted
/// either way. Anything else is logged with the path's name and returned.
fn careful_path_handles(
    backend: &dyn StoreBackend,
    path: &'static str,
    error: StoreError,
) -> Result<Refusal, DbErr> {
    match Refusal::of(backend, &error) {
        Some(reason) => {
            crate::telemetry::record_fast_path_fallback(path, reason.as_str());
            Ok(reason)
        }
        None => {
            crate::telemetry::record_fast_path_fallback(path, "unexpected");
            tracing::warn!(path, %error, "A page's write failed unexpectedly; it is not written again another way.");
            Err(error.into())
        }
    }
}

/// Whether every one of `records` is stored already with the same content hash. Read
/// outside any transaction: if so, the page writes no record, which is exactly what its
/// transaction would have done at the moment of this read.
async fn all_stored_unchanged(
    backend: &dyn StoreBackend,
    database: DbBackend,
    context: &PageContext<'_>,
    records: &[Record],
) -> Result<bool, DbErr> {
    let mut unchanged = 0;
    for chunk in records.chunks(KEY_LOOKUP.rows(database)) {
        unchanged += backend.count_unchanged(context, chunk).await?;
    }
    // The page's keys are distinct and the key is unique, so each counts at most once.
    Ok(unchanged == records.len() as u64)
}

/// How a page's records are written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// No savepoints; a failed record write fails the attempt.
    Fast,
    /// Savepoints around each write, so a failed record is set aside and the rest commit.
    Careful,
}

enum PageFailure {
    /// Writing a record failed (in [`Mode::Fast`]): perhaps worth a careful attempt.
    Record(StoreError),
    /// Anything else: the page could not be stored.
    Database(StoreError),
}

impl From<StoreError> for PageFailure {
    fn from(error: StoreError) -> Self {
        PageFailure::Database(error)
    }
}

impl From<DbErr> for PageFailure {
    fn from(error: DbErr) -> Self {
        PageFailure::Database(error.into())
    }
}

/// One page, ready to be written (perhaps twice).
struct PageWrite<'a> {
    backend: &'a dyn StoreBackend,
    context: &'a PageContext<'a>,
    /// The page's records, one per key, sorted by external id.
    records: &'a [Record],
    /// Records set aside before any write.
    rejected: &'a [RejectedRecord],
    /// Records the API reported deleted, one per key (none in append mode).
    deleted: &'a [DeletedRecord],
    fetched: u64,
    /// Counts known before any write (repeated keys).
    counts: PageStoreCounts,
}

impl PageWrite<'_> {
    /// Writes the page in one transaction; `totals` changes only when it commits.
    async fn write(
        &self,
        db: &DatabaseConnection,
        totals: &mut RunCounts,
        mode: Mode,
    ) -> Result<PageStoreCounts, PageFailure> {
        let context = self.context;
        let backend = self.backend;
        let mut counts = self.counts;
        // Records the database refuses; those set aside before any write are in `self`.
        let mut failed = Vec::new();
        let txn = begin_page_transaction(db).await?;
        let now = crate::db::now();
        let mut chunks = self
            .records
            .chunks(KEY_LOOKUP.rows(txn.get_database_backend()));
        // Append mode looks its keys up elsewhere, so its first statement only locks.
        let first = match context.mode {
            WriteMode::Upsert => chunks.next().unwrap_or_default(),
            WriteMode::Append { .. } => &[],
        };
        let mut existing = match backend.lock_and_lookup(&txn, context, first).await {
            Ok(existing) => existing,
            Err(error) => {
                let error = explain_unheld(&txn, context, error).await;
                return Err(PageFailure::Database(error));
            }
        };
        let mut changes = PageChanges::default();
        if let WriteMode::Append { retention } = context.mode {
            // Events are never updated: keys seen within the retention are duplicates.
            let records = self.records.to_vec();
            let write = append::NewKeys {
                backend,
                txn: &txn,
                context,
                retention,
                now,
            };
            let written = write.write(records, &mut changes).await?;
            counts.inserted += written.inserted;
            counts.duplicate += written.duplicate;
            failed.extend(written.failed);
            return self.finish(txn, counts, failed, changes, totals, now).await;
        }
        for chunk in chunks {
            existing.extend(backend.lookup(&txn, context, chunk).await?);
        }
        if let Some(version) = context.version {
            let write = versioned::VersionedWrite {
                backend,
                txn: &txn,
                context,
                version,
                now,
            };
            let (records, deleted) = (self.records, self.deleted);
            write
                .write(
                    &existing,
                    records,
                    deleted,
                    &mut counts,
                    &mut changes,
                    &mut failed,
                )
                .await?;
            return self.finish(txn, counts, failed, changes, totals, now).await;
        }
        let mut new_records = Vec::new();
        let mut changed_records: Vec<ChangedRecord> = Vec::new();
        let mut restored_records: Vec<ChangedRecord> = Vec::new();
        for record in self.records {
            match existing.get(&record.external_id) {
                None => new_records.push(record),
                // A restore is a write, whatever the content: the deletion is cleared.
                Some(stored) if stored.deleted => restored_records.push((stored.id, record)),
                Some(stored) if stored.content_hash == record.content_hash => counts.unchanged += 1,
                Some(stored) => changed_records.push((stored.id, record)),
            }
        }

        counts.deleted += deleted::mark(&txn, context, self.deleted, now, &mut changes).await?;
        if new_records.is_empty() && changed_records.is_empty() && restored_records.is_empty() {
            return self.finish(txn, counts, failed, changes, totals, now).await;
        }
        let insert = match mode {
            Mode::Fast => insert_fast(backend, &txn, context, &new_records, now, &mut changes)
                .await
                .map_err(PageFailure::Record)?,
            Mode::Careful => {
                insert_carefully(backend, &txn, context, &new_records, now, &mut changes).await?
            }
        };
        counts.inserted += insert.inserted;
        counts.duplicate += insert.duplicate;
        changes.recorded += insert.inserted;
        failed.extend(insert.failed);

        for (rewritten, kind) in [
            (changed_records, ChangeKind::Updated),
            (restored_records, ChangeKind::Restored),
        ] {
            let write = Rewrite {
                backend,
                txn: &txn,
                context,
                now,
                kind,
            };
            let written = write
                .run(&rewritten, mode, &mut changes, &mut failed)
                .await?;
            match kind {
                ChangeKind::Restored => counts.restored += written,
                _ => counts.updated += written,
            }
        }

        self.finish(txn, counts, failed, changes, totals, now).await
    }

    /// The page as all new: its records and bookkeeping without a lookup, by
    /// [`NewPageWriter::write_new_page`]. `None`, with nothing written, when that failed
    /// for a reason the usual way handles (a key existed, a row was refused, the run's
    /// row or the connection is gone): the caller then writes the page the usual way,
    /// which decides and counts each record exactly as if this had not been tried.
    async fn write_all_new(
        &self,
        new_pages: &dyn NewPageWriter,
        totals: &mut RunCounts,
    ) -> Result<Option<PageStoreCounts>, DbErr> {
        let mut counts = self.counts;
        counts.inserted += self.records.len() as u64;
        let after = self.totals_after(totals, &counts);
        let bookkeeping = self.bookkeeping(&after, crate::db::now());
        match new_pages
            .write_new_page(self.context, self.records, &bookkeeping)
            .await
        {
            Ok(()) => {
                *totals = after;
                Ok(Some(counts))
            }
            Err(error) => {
                let reason = careful_path_handles(self.backend, "all_new", error)?;
                tracing::debug!(
                    reason = reason.as_str(),
                    "A page guessed new was not; writing it the usual way."
                );
                Ok(None)
            }
        }
    }

    /// The end of every page: its error rows (the records set aside before any write,
    /// then those in `failed` the database refused), the run's counters and the
    /// checkpoint, the change batch's stamp, then the commit.
    async fn finish(
        &self,
        txn: DatabaseTransaction,
        mut counts: PageStoreCounts,
        failed: Vec<RejectedRecord>,
        changes: PageChanges,
        totals: &mut RunCounts,
        now: DateTime<Utc>,
    ) -> Result<PageStoreCounts, PageFailure> {
        let context = self.context;
        counts.failed = (self.rejected.len() + failed.len()) as u64;
        for rejected in [self.rejected, &failed] {
            insert_run_errors(&txn, context, rejected, ErrorScope::Record, now).await?;
        }
        if context.sightings {
            let keys = sightings::page_keys(self.records, self.rejected);
            sightings::record(&txn, context.run_id, &keys).await?;
        }

        let after = self.totals_after(totals, &counts);
        let bookkeeping = self.bookkeeping(&after, now);
        self.backend.save_bookkeeping(&txn, &bookkeeping).await?;
        changes.close(self.backend, &txn, now).await?;
        txn.commit().await?;
        *totals = after;
        Ok(counts)
    }

    /// The run's counters once this page commits with `counts`.
    fn totals_after(&self, totals: &RunCounts, counts: &PageStoreCounts) -> RunCounts {
        let mut after = *totals;
        after.fetched += self.fetched;
        after.inserted += counts.inserted;
        after.updated += counts.updated;
        after.unchanged += counts.unchanged;
        after.duplicate += counts.duplicate;
        after.failed += counts.failed;
        after.restored += counts.restored;
        after.deleted += counts.deleted;
        after
    }

    /// The page's bookkeeping: the run's counters `after` it, and its checkpoint.
    fn bookkeeping<'b>(&'b self, after: &'b RunCounts, now: DateTime<Utc>) -> PageBookkeeping<'b> {
        PageBookkeeping {
            run_id: self.context.run_id,
            counts: after,
            connection_id: self.context.connection.id,
            stream_id: self.context.stream.state.id,
            checkpoint: match self.context.leave_checkpoint {
                true => CheckpointMove::Keep,
                false => CheckpointMove::Write(self.context.next_checkpoint),
            },
            now,
            lease: self.context.lease,
        }
    }
}

/// Rewriting stored records in a page's transaction: new content (`updated`), or records
/// marked deleted seen again (`restored`).
struct Rewrite<'a> {
    backend: &'a dyn StoreBackend,
    txn: &'a DatabaseTransaction,
    context: &'a PageContext<'a>,
    now: DateTime<Utc>,
    kind: ChangeKind,
}

impl Rewrite<'_> {
    /// Rewrites `records` and returns how many it rewrote. Fast: in multi-row statements,
    /// any failure failing the attempt; careful: one savepoint per record, those the
    /// database refuses pushed to `failed`.
    async fn run(
        &self,
        records: &[ChangedRecord<'_>],
        mode: Mode,
        changes: &mut PageChanges,
        failed: &mut Vec<RejectedRecord>,
    ) -> Result<u64, PageFailure> {
        let (backend, txn, context, now, kind) =
            (self.backend, self.txn, self.context, self.now, self.kind);
        let mut written = 0;
        match mode {
            Mode::Fast => {
                for chunk in records.chunks(RECORD_UPDATE.rows(txn.get_database_backend())) {
                    let slot = changes.slot(txn, context, chunk.len()).await?;
                    let updated = backend
                        .update(txn, context, chunk, now, slot, kind)
                        .await
                        .map_err(PageFailure::Record)?;
                    written += updated;
                    changes.recorded += updated;
                }
            }
            Mode::Careful => {
                for changed in records {
                    let slot = changes.slot(txn, context, 1).await?;
                    let savepoint = txn.begin().await?;
                    let one = std::slice::from_ref(changed);
                    match backend
                        .update(&savepoint, context, one, now, slot, kind)
                        .await
                    {
                        Ok(_) => {
                            savepoint.commit().await?;
                            written += 1;
                            changes.recorded += 1;
                        }
                        Err(error) => {
                            savepoint.rollback().await?;
                            failed.push(persist_failure(changed.1.clone(), &error));
                        }
                    }
                }
            }
        }
        Ok(written)
    }
}

/// When a page repeats a key, the last copy wins; the earlier ones count as duplicates.
fn keep_last_of_each_key(items: Vec<PageItem>, counts: &mut PageStoreCounts) -> Vec<PageItem> {
    let mut last_index: HashMap<&str, usize> = HashMap::with_capacity(items.len());
    let mut keyed = 0;
    for (index, item) in items.iter().enumerate() {
        if let Some(key) = key_of(item) {
            last_index.insert(key, index);
            keyed += 1;
        }
    }
    if last_index.len() == keyed {
        return items;
    }
    let keep: Vec<bool> = items
        .iter()
        .enumerate()
        .map(|(index, item)| key_of(item).is_none_or(|key| last_index.get(key) == Some(&index)))
        .collect();
    counts.duplicate += keep.iter().filter(|kept| !**kept).count() as u64;
    items
        .into_iter()
        .zip(keep)
        .filter_map(|(item, kept)| kept.then_some(item))
        .collect()
}

/// The key an item writes: a record's, or a deletion's. A rejected record writes none.
fn key_of(item: &PageItem) -> Option<&str> {
    match item {
        PageItem::Record(record) => Some(&record.external_id),
        PageItem::Deleted(gone) => Some(&gone.external_id),
        PageItem::Rejected(_) => None,
    }
}

/// A deletion in append mode, where records are events that are never marked: set aside
/// with its payload, so it is not lost and says why.
fn not_appendable(gone: DeletedRecord) -> RejectedRecord {
    RejectedRecord {
        external_id: Some(gone.external_id),
        stage: RecordStage::Validate,
        message: "the API reported the record deleted, and mode = \"append\" keeps events, \
                  which are never marked deleted"
            .into(),
        payload: gone.payload,
    }
}

#[cfg(test)]
mod tests;
