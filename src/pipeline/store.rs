//! Storing one page: the triple lookup, insert / update / skip, the error report, the
//! run's counters and the connection's checkpoint, all in one transaction.
//!
//! Per page there is one lookup (`lookup.rs`), one insert of the new records with `ON
//! CONFLICT (user_id, provider, external_id) DO NOTHING` (`insert.rs`), one update of the
//! changed ones (`update.rs`), one multi-row insert into `run_errors`, and the bookkeeping
//! (`bookkeeping.rs`); with TLS to a server, the writes are split below one TLS record.
//! Pages like the one before take a shortcut (`PageExpectation`). The page is written
//! without savepoints first; if a record write fails, that transaction is rolled back and
//! the page is written again with savepoints, where a failing multi-row write is retried
//! record by record, so one record that cannot be written costs that record only.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr,
    SqliteTransactionMode, TransactionOptions, TransactionTrait,
};
use tributary_providers::{PageItem, Record, RejectedRecord};

use crate::db::DatabasePools;
use crate::entities::connection;
use crate::pipeline::bookkeeping::{save_page_bookkeeping, PageBookkeeping};
use crate::pipeline::checkpoint::Checkpoint;
use crate::pipeline::insert::{insert_fast, insert_sorted, StatementLimits};
use crate::pipeline::lookup::{all_stored_unchanged, lookup_existing};
use crate::pipeline::postgres_batch;
use crate::pipeline::run::RunCounts;
use crate::pipeline::run_errors::{insert_run_errors, persist_failure, ErrorScope};
use crate::pipeline::sqlite_batch::NewPageBatch;
use crate::pipeline::update::{update_batch, ChangedRecord};

/// What the store needs to know about the page being stored.
pub struct PageContext<'a> {
    pub run_id: i64,
    pub connection: &'a connection::Model,
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

/// How a provider's records are written (`mode` in its config).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WriteMode {
    /// Insert new keys, update changed content, skip unchanged records.
    #[default]
    Upsert,
    /// An event log: records are never updated in place. A key written within
    /// `retention` (tracked in `processed_keys`) is a duplicate, whatever its content.
    Append { retention: std::time::Duration },
}

/// What one page did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageStoreCounts {
    pub inserted: u64,
    pub updated: u64,
    pub unchanged: u64,
    pub duplicate: u64,
    pub failed: u64,
    /// Every record was unchanged and nothing was written (see
    /// [`PageExpectation::Unchanged`]).
    pub deferred: bool,
}

/// Stores one page in one transaction and adds its counts to `totals` (which are saved to
/// the run's row in the same transaction).
///
/// The page is first written without savepoints, which on a server costs two round trips
/// per statement less. If a record write fails there, that transaction is rolled back
/// and the page is written again with a savepoint around each multi-row insert and each
/// update, so only the records the database refuses are set aside. A page like the one
/// before may first take a shortcut (see [`PageExpectation`]).
pub async fn store_page(
    db: &DatabasePools,
    context: &PageContext<'_>,
    items: Vec<PageItem>,
    totals: &mut RunCounts,
) -> Result<PageStoreCounts, DbErr> {
    let mut counts = PageStoreCounts::default();
    let fetched = items.len() as u64;
    let mut rejected: Vec<RejectedRecord> = Vec::new();
    let mut records: Vec<Record> = Vec::with_capacity(items.len());
    for item in items {
        match item {
            PageItem::Record(record) => records.push(record),
            PageItem::Rejected(reject) => rejected.push(reject),
        }
    }
    let mut records = keep_last_of_each_key(records, &mut counts);
    // One order for every writer makes lock waits between concurrent inserts less likely.
    records.sort_by(|a, b| a.external_id.cmp(&b.external_id));
    let shortcut = rejected.is_empty() && context.mode == WriteMode::Upsert;
    if shortcut
        && context.expect == PageExpectation::Unchanged
        && all_stored_unchanged(db, context.connection, &records).await?
    {
        counts.unchanged += records.len() as u64;
        counts.deferred = true;
        totals.fetched += fetched;
        totals.unchanged += counts.unchanged;
        totals.duplicate += counts.duplicate;
        return Ok(counts);
    }
    let page = PageWrite {
        context,
        limits: StatementLimits::for_database(db),
        records: &records,
        rejected: &rejected,
        fetched,
        counts,
    };
    // MySQL cannot tell a row it inserted from one it skipped, so it has no shortcut.
    if shortcut
        && context.expect == PageExpectation::New
        && db.get_database_backend() != DbBackend::MySql
    {
        if let Some(counts) = page.write_all_new(db, totals).await? {
            db.wal_written();
            return Ok(counts);
        }
    }
    let stored = match page.write(db, totals, Mode::Fast).await {
        Ok(counts) => Ok(counts),
        Err(PageFailure::Record(error)) => {
            tracing::warn!(%error, "Writing a record failed; writing the page again record by record where needed.");
            match page.write(db, totals, Mode::Careful).await {
                Ok(counts) => Ok(counts),
                Err(PageFailure::Record(error) | PageFailure::Database(error)) => Err(error),
            }
        }
        Err(PageFailure::Database(error)) => Err(error),
    };
    if stored.is_ok() {
        db.wal_written();
    }
    stored
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
    /// Writing a record failed (in [`Mode::Fast`]): worth another, careful attempt.
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
    context: &'a PageContext<'a>,
    /// How large each write statement may be.
    limits: StatementLimits,
    /// The page's records, one per key, sorted by external id.
    records: &'a [Record],
    /// Records set aside before any write.
    rejected: &'a [RejectedRecord],
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
        let mut counts = self.counts;
        // Records the database refuses; those set aside before any write are in `self`.
        let mut failed = Vec::new();
        let txn = begin_page_transaction(db).await?;
        let now = Utc::now();
        if let WriteMode::Append { retention } = context.mode {
            // Events are never updated: keys seen within the retention are duplicates.
            let records = self.records.to_vec();
            let written =
                super::append::write_new_keys(&txn, context, records, retention, now, self.limits)
                    .await?;
            counts.inserted += written.inserted;
            counts.duplicate += written.duplicate;
            failed.extend(written.failed);
            return self.finish(txn, counts, failed, totals, now).await;
        }
        let existing = lookup_existing(&txn, context.connection, self.records).await?;
        let mut new_records = Vec::new();
        let mut changed_records: Vec<ChangedRecord> = Vec::new();
        for record in self.records {
            match existing.get(&record.external_id) {
                None => new_records.push(record),
                Some((_, hash)) if *hash == record.content_hash => counts.unchanged += 1,
                Some((id, _)) => changed_records.push((*id, record)),
            }
        }

        let insert = match mode {
            Mode::Fast => insert_fast(&txn, context, &new_records, now, self.limits)
                .await
                .map_err(PageFailure::Record)?,
            Mode::Careful => insert_sorted(&txn, context, &new_records, now, self.limits).await?,
        };
        counts.inserted += insert.inserted;
        counts.duplicate += insert.duplicate;
        failed.extend(insert.failed);

        match mode {
            Mode::Fast => {
                counts.updated +=
                    update_batch(&txn, context.run_id, &changed_records, now, self.limits)
                        .await
                        .map_err(PageFailure::Record)?;
            }
            Mode::Careful => {
                for changed in changed_records {
                    let savepoint = txn.begin().await?;
                    let one = std::slice::from_ref(&changed);
                    match update_batch(&savepoint, context.run_id, one, now, self.limits).await {
                        Ok(_) => {
                            savepoint.commit().await?;
                            counts.updated += 1;
                        }
                        Err(error) => {
                            savepoint.rollback().await?;
                            failed.push(persist_failure(changed.1.clone(), &error));
                        }
                    }
                }
            }
        }

        self.finish(txn, counts, failed, totals, now).await
    }

    /// The page as all new: one insert and the bookkeeping, without a lookup, in one
    /// round trip on SQLite (`sqlite_batch.rs`) and on PostgreSQL without TLS
    /// (`postgres_batch.rs`), in a transaction elsewhere. `None`, with nothing written,
    /// when any row was not inserted, whether it existed or the database refused it: the
    /// caller then writes the page the usual way, which decides and counts each record
    /// exactly as if this had not been tried.
    async fn write_all_new(
        &self,
        db: &DatabasePools,
        totals: &mut RunCounts,
    ) -> Result<Option<PageStoreCounts>, DbErr> {
        let now = Utc::now();
        let mut counts = self.counts;
        if let Some(lane) = db.sqlite_write_lane() {
            counts.inserted += self.records.len() as u64;
            let after = self.totals_after(totals, &counts);
            let batch = NewPageBatch::new(
                self.context,
                self.records,
                &self.bookkeeping(&after, now),
                now,
            )?;
            if !batch.write(lane).await? {
                return Ok(None);
            }
            *totals = after;
            return Ok(Some(counts));
        }
        // Without TLS a page may be one statement; a replay leaves the checkpoint alone
        // and takes the transaction below.
        let one_statement = db.get_database_backend() == DbBackend::Postgres
            && self.limits.whole_pages()
            && !self.context.leave_checkpoint;
        if one_statement {
            counts.inserted += self.records.len() as u64;
            let after = self.totals_after(totals, &counts);
            let stored = postgres_batch::write_new_page(
                db,
                self.context,
                self.records,
                &self.bookkeeping(&after, now),
            )
            .await?;
            if !stored {
                return Ok(None);
            }
            *totals = after;
            return Ok(Some(counts));
        }
        let txn = begin_page_transaction(db).await?;
        let records: Vec<&Record> = self.records.iter().collect();
        match insert_fast(&txn, self.context, &records, now, self.limits).await {
            Ok(insert) if insert.inserted == records.len() as u64 => {
                counts.inserted += insert.inserted;
                match self.finish(txn, counts, Vec::new(), totals, now).await {
                    Ok(counts) => Ok(Some(counts)),
                    Err(PageFailure::Record(error) | PageFailure::Database(error)) => Err(error),
                }
            }
            _ => {
                txn.rollback().await?;
                Ok(None)
            }
        }
    }

    /// The end of every page: its error rows (the records set aside before any write,
    /// then those in `failed` the database refused), the run's counters and the
    /// checkpoint, then the commit.
    async fn finish(
        &self,
        txn: DatabaseTransaction,
        mut counts: PageStoreCounts,
        failed: Vec<RejectedRecord>,
        totals: &mut RunCounts,
        now: DateTime<Utc>,
    ) -> Result<PageStoreCounts, PageFailure> {
        let context = self.context;
        counts.failed = (self.rejected.len() + failed.len()) as u64;
        for rejected in [self.rejected, &failed] {
            insert_run_errors(
                &txn,
                context,
                rejected,
                ErrorScope::Record,
                now,
                self.limits,
            )
            .await?;
        }

        let after = self.totals_after(totals, &counts);
        let bookkeeping = self.bookkeeping(&after, now);
        save_page_bookkeeping(&txn, &bookkeeping).await?;
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
        after
    }

    /// The page's bookkeeping: the run's counters `after` it, and its checkpoint.
    fn bookkeeping<'b>(&'b self, after: &'b RunCounts, now: DateTime<Utc>) -> PageBookkeeping<'b> {
        PageBookkeeping {
            run_id: self.context.run_id,
            counts: after,
            connection_id: self.context.connection.id,
            checkpoint: (!self.context.leave_checkpoint).then_some(self.context.next_checkpoint),
            now,
        }
    }
}

/// Opens a page's transaction. On SQLite it takes the write lock at once (`BEGIN
/// IMMEDIATE`), waiting for it under the busy timeout. A deferred transaction would read
/// the lookup's snapshot first and ask for the write lock only at the insert; if another
/// process (a `sync` beside the daemon, or two `sync`s for different users) committed in
/// between, SQLite refuses the upgrade at once with `SQLITE_BUSY` ("database is locked"),
/// and the whole page would fail. Taking the lock first also means no other writer can
/// insert a key between our lookup and our insert. Other backends ignore the mode.
async fn begin_page_transaction(db: &DatabaseConnection) -> Result<DatabaseTransaction, DbErr> {
    db.begin_with_options(TransactionOptions {
        sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
        ..TransactionOptions::default()
    })
    .await
}

/// When a page repeats a key, the last copy wins; the earlier ones count as duplicates.
fn keep_last_of_each_key(records: Vec<Record>, counts: &mut PageStoreCounts) -> Vec<Record> {
    let mut last_index: HashMap<&str, usize> = HashMap::with_capacity(records.len());
    for (index, record) in records.iter().enumerate() {
        last_index.insert(record.external_id.as_str(), index);
    }
    if last_index.len() == records.len() {
        return records;
    }
    let keep: Vec<bool> = records
        .iter()
        .enumerate()
        .map(|(index, record)| last_index.get(record.external_id.as_str()) == Some(&index))
        .collect();
    counts.duplicate += keep.iter().filter(|kept| !**kept).count() as u64;
    records
        .into_iter()
        .zip(keep)
        .filter_map(|(record, kept)| kept.then_some(record))
        .collect()
}
