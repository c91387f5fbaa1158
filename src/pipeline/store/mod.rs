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
mod deleted;
mod mysql;
mod postgres;
mod run_errors;
mod sightings;
mod sqlite;

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, TransactionTrait,
};
use tributary_providers::{DeletedRecord, PageItem, Record, RecordStage, RejectedRecord};

use crate::config::WriteMode;
use crate::db::DatabasePools;
use crate::entities::change::ChangeKind;
use crate::entities::connection;
use crate::lease::Fence;
use crate::pipeline::changes::{self, BatchOwner, ChangeBatch, ChangeSlot};
use crate::pipeline::checkpoint::Checkpoint;
use crate::pipeline::fence;
use crate::pipeline::ground::begin_page_transaction;
use crate::pipeline::ground::RunCounts;
use crate::pipeline::streams::StreamScope;

pub use append::sweep_expired_keys;
pub use backend::{ChangedRecord, Existing, PageBookkeeping, Refusal, StoreBackend, Stored};
// The bench and the tests name a page's checkpoint move through the store.
pub use crate::pipeline::checkpoint::CheckpointMove;
pub(crate) use run_errors::{record_page_error, ErrorScope};

use backend::{KEY_LOOKUP, RECORD_INSERT, RECORD_UPDATE};
use run_errors::{insert_run_errors, persist_failure};

/// What the store needs to know about the page being stored.
pub struct PageContext<'a> {
    pub run_id: i64,
    pub connection: &'a connection::Model,
    /// The stream whose page it is: its records' namespace and its checkpoint's row.
    pub stream: &'a StreamScope,
    /// Where the next page starts: committed as the connection's checkpoint with the page
    /// (`None` on the last page).
    pub next_checkpoint: Option<&'a Checkpoint>,
    /// How the provider's records are written.
    pub mode: WriteMode,
    /// Leave the connection's checkpoint as it is (replays store loose records, not a
    /// page of the listing).
    pub leave_checkpoint: bool,
    /// What the page most likely holds (from the page before), which picks a shortcut.
    pub expect: PageExpectation,
    /// Note the page's keys in `run_sightings` (a full pass of a provider that tracks
    /// deletions): the run's records that no page noted are its deletions.
    pub sightings: bool,
    /// The lease the run holds: the page commits only while the connection's row still
    /// holds it and the run's row is `running` (`None`: a run without a lease, such as
    /// `sync_connection` called directly, fenced by its run's status only).
    pub lease: Option<&'a Fence>,
}

impl PageContext<'_> {
    /// Whose records the page's changes are.
    pub fn batch_owner(&self) -> BatchOwner<'_> {
        BatchOwner {
            run_id: self.run_id,
            user_id: &self.connection.user_id,
            provider: self.stream.namespace(),
        }
    }
}

/// What a page most likely holds; a wrong guess costs one wasted statement, never a
/// different outcome (see ARCHITECTURE.md, "Shortcuts for unchanged and new pages").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PageExpectation {
    /// No guess: look up, then insert, update or skip.
    #[default]
    Unknown,
    /// Every record stored already with the same content: look it up outside any
    /// transaction, and if so write nothing; the page's counters and checkpoint ride
    /// with the run's next commit or its end.
    Unchanged,
    /// Every record new: insert first, and commit without a lookup if every row went in;
    /// otherwise roll back and take the usual way.
    New,
}

/// What one page did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageStoreCounts {
    pub inserted: u64,
    pub updated: u64,
    pub unchanged: u64,
    pub duplicate: u64,
    pub failed: u64,
    /// Records marked deleted that the page carried again.
    pub restored: u64,
    /// Stored records the page reported deleted, marked so.
    pub deleted: u64,
    /// Every record was unchanged and nothing was written (see
    /// [`PageExpectation::Unchanged`]).
    pub deferred: bool,
}

/// The store strategy of the database `db` is on.
pub fn backend_for(db: &DatabasePools) -> Box<dyn StoreBackend + '_> {
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
///    round trips, without a lookup ([`StoreBackend::write_new_page`]).
/// 3. The usual way: lookup, insert, update, error rows and bookkeeping in one
///    transaction without savepoints ([`Mode::Fast`]);
/// 4. and if a record write of it fails, again with savepoints ([`Mode::Careful`]).
///
/// A shortcut that fails goes on to the usual way only when it failed for a reason the
/// usual way handles ([`Refusal`]); any other error fails the page, logged and counted.
pub async fn store_page(
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
    let shortcut = rejected.is_empty() && deleted.is_empty() && context.mode == WriteMode::Upsert;
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
    if shortcut && context.expect == PageExpectation::New && backend.counts_inserted_rows() {
        if let Some(counts) = page.write_all_new(totals).await? {
            backend.committed();
            return Ok(counts);
        }
    }
    let counts = match page.write(db, totals, Mode::Fast).await {
        Ok(counts) => counts,
        Err(PageFailure::Record(error)) => {
            let reason = careful_path_handles(backend, "usual", error)?;
            tracing::warn!(
                reason = reason.as_str(),
                "Writing a record failed; writing the page again record by record where needed."
            );
            match page.write(db, totals, Mode::Careful).await {
                Ok(counts) => counts,
                Err(PageFailure::Record(error) | PageFailure::Database(error)) => {
                    return Err(error)
                }
            }
        }
        Err(PageFailure::Database(error)) => return Err(error),
    };
    backend.committed();
    Ok(counts)
}

/// The reason a fast path failed with `error`, if the careful path handles it; counted
/// either way. Anything else is logged with the path's name and returned.
fn careful_path_handles(
    backend: &dyn StoreBackend,
    path: &'static str,
    error: DbErr,
) -> Result<Refusal, DbErr> {
    match Refusal::of(backend, &error) {
        Some(reason) => {
            crate::telemetry::record_fast_path_fallback(path, reason.as_str());
            Ok(reason)
        }
        None => {
            crate::telemetry::record_fast_path_fallback(path, "unexpected");
            tracing::warn!(path, %error, "A page's write failed unexpectedly; it is not written again another way.");
            Err(error)
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
    Record(DbErr),
    /// Anything else: the page could not be stored.
    Database(DbErr),
}

impl From<DbErr> for PageFailure {
    fn from(error: DbErr) -> Self {
        PageFailure::Database(error)
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
        let now = Utc::now();
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
                let (run_id, connection_id) = (context.run_id, context.connection.id);
                let error = fence::explain(&txn, run_id, connection_id, context.lease, error).await;
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
    /// [`StoreBackend::write_new_page`]. `None`, with nothing written, when that failed
    /// for a reason the usual way handles (a key existed, a row was refused, the run's
    /// row or the connection is gone): the caller then writes the page the usual way,
    /// which decides and counts each record exactly as if this had not been tried.
    async fn write_all_new(
        &self,
        totals: &mut RunCounts,
    ) -> Result<Option<PageStoreCounts>, DbErr> {
        let mut counts = self.counts;
        counts.inserted += self.records.len() as u64;
        let after = self.totals_after(totals, &counts);
        let bookkeeping = self.bookkeeping(&after, Utc::now());
        match self
            .backend
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

/// The change batch of a page's transaction: opened with its first record write, and
/// stamped as its last statement, or removed if every write was refused.
#[derive(Default)]
pub(crate) struct PageChanges {
    batch: Option<ChangeBatch>,
    /// Changes recorded in it (by writes that were not rolled back).
    recorded: u64,
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
    async fn close(
        self,
        backend: &dyn StoreBackend,
        txn: &DatabaseTransaction,
        now: DateTime<Utc>,
    ) -> Result<(), DbErr> {
        match &self.batch {
            Some(batch) if self.recorded > 0 => backend.stamp_batch(txn, batch, now).await,
            Some(batch) => changes::discard_batch(txn, batch).await,
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
    fn add(&mut self, rows: usize, inserted: u64) -> Result<(), DbErr> {
        let skipped = (rows as u64).checked_sub(inserted).ok_or_else(|| {
            DbErr::Custom(format!(
                "the database reported {inserted} rows inserted by an insert of {rows}"
            ))
        })?;
        self.inserted += inserted;
        self.duplicate += skipped;
        Ok(())
    }
}

/// Inserts records not found by the lookup, without savepoints: the first failing
/// statement fails the whole insert (and, on PostgreSQL, the transaction).
async fn insert_fast(
    backend: &dyn StoreBackend,
    txn: &DatabaseTransaction,
    context: &PageContext<'_>,
    records: &[&Record],
    now: DateTime<Utc>,
    changes: &mut PageChanges,
) -> Result<InsertOutcome, DbErr> {
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
) -> Result<InsertOutcome, DbErr> {
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
