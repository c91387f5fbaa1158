//! A run's counters and a page's, and the statements that store a run's in `sync_runs`.

use sea_orm::{ActiveModelTrait, ConnectionTrait, DbErr, EntityTrait, Set};
use serde::Serialize;

use crate::entities::sync_run;

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
    /// [`PageExpectation::Unchanged`](crate::pipeline::PageExpectation::Unchanged)).
    pub deferred: bool,
}

/// A run's counters, as stored in `sync_runs`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RunCounts {
    pub pages_fetched: u64,
    /// Records the API returned, good and bad.
    pub fetched: u64,
    pub inserted: u64,
    pub updated: u64,
    pub unchanged: u64,
    /// Skipped because the key was already written (repeated in a page, or a concurrent
    /// writer inserted it first).
    pub duplicate: u64,
    pub failed: u64,
    /// Records whose watermark lay beyond the clock by more than the allowed skew.
    pub watermark_anomalies: u64,
    /// Records marked deleted: the API reported them deleted, or the run's complete
    /// listing no longer returned them (marked as it closed).
    pub deleted: u64,
    /// Deleted records the run saw again (with or without new content) and restored.
    pub restored: u64,
    /// A child stream's parents whose children the API no longer lists.
    pub parents_skipped: u64,
    /// Records the provider's configured filter dropped before storing.
    pub filtered: u64,
}

/// Counters are stored as signed 64-bit integers; saturate rather than wrap.
pub(crate) fn to_db(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// Writes the run's counters and heartbeat (inside a page's transaction); false when the
/// run's row is gone.
pub(crate) async fn update_counts(
    db: &impl ConnectionTrait,
    run_id: i64,
    counts: &RunCounts,
) -> Result<bool, DbErr> {
    let mut row = counts_model(run_id, counts);
    row.heartbeat_at = Set(crate::db::now());
    // Without RETURNING (or, on SQLite, the read-back that stands in for it).
    let result = sync_run::Entity::update(row)
        .exec_without_returning(db)
        .await?;
    Ok(result.rows_affected > 0)
}

/// The run's row with its counters set, for an update.
pub(crate) fn counts_model(run_id: i64, counts: &RunCounts) -> sync_run::ActiveModel {
    let mut row = sync_run::ActiveModel {
        id: Set(run_id),
        ..Default::default()
    };
    for (column, value) in counter_columns(counts) {
        row.set(column, value);
    }
    row
}

/// Each counter of a run and the `sync_runs` column it is stored in: the one mapping that
/// the ORM's updates and the batched statements (`store/backend.rs`) both use.
pub(crate) fn counter_columns(counts: &RunCounts) -> [(sync_run::Column, sea_orm::Value); 12] {
    use sync_run::Column;
    [
        (Column::PagesFetched, to_db(counts.pages_fetched).into()),
        (Column::RecordsFetched, to_db(counts.fetched).into()),
        (Column::RecordsInserted, to_db(counts.inserted).into()),
        (Column::RecordsUpdated, to_db(counts.updated).into()),
        (Column::RecordsUnchanged, to_db(counts.unchanged).into()),
        (Column::RecordsDuplicate, to_db(counts.duplicate).into()),
        (Column::RecordsFailed, to_db(counts.failed).into()),
        (
            Column::WatermarkAnomalies,
            to_db(counts.watermark_anomalies).into(),
        ),
        (Column::RecordsDeleted, to_db(counts.deleted).into()),
        (Column::RecordsRestored, to_db(counts.restored).into()),
        (Column::ParentsSkipped, to_db(counts.parents_skipped).into()),
        (Column::RecordsFiltered, to_db(counts.filtered).into()),
    ]
}
