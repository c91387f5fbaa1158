//! Deletion detection: after a tracked full pass walked the provider's complete listing,
//! the connection's live records that no page of the run noted in `run_sightings` (and
//! the run did not write itself) are marked deleted, in the transaction that closes the
//! run, with a `deleted` change each. A safety valve refuses a run that would mark too
//! large a share of the live records ([deletion detection](docs/decisions/deletion-detection.md)).

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Condition, Expr, ExprTrait, Query};
use sea_orm::{
    ActiveEnum, ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait, IdenStatic,
    PaginatorTrait, QueryFilter, QuerySelect,
};

use crate::entities::change::ChangeKind;
use crate::entities::{change, connection, record, run_sighting, sync_run};
use crate::lease::Fence;
use crate::pipeline::changes::{self, BatchOwner};
use crate::pipeline::fence;
use crate::pipeline::ground::begin_page_transaction;
use crate::pipeline::streams::StreamScope;

/// What a run's walk saw, as deciding its deletions needs it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WalkSeen {
    /// The run tracks deletions (a full pass of a provider with `track_deletes`).
    pub tracked: bool,
    pub listing_complete: bool,
    /// It went on from an earlier run's checkpoint.
    pub resumed: bool,
    /// Records it could not key.
    pub unkeyed: u64,
    /// Parents of a child stream whose children could not be listed.
    pub parents_skipped: u64,
}

/// What a closing run does about deletions.
#[derive(Clone, Debug, PartialEq)]
pub enum DeletionPass {
    /// The run does not track deletions (the provider does not, or it was incremental).
    Off,
    /// The run tracked its keys, but its listing is not known complete: nothing is
    /// marked. `reason` is given when the run's own error does not say why.
    Skipped { reason: Option<String> },
    /// The run walked the complete listing: mark what it did not see, unless that is more
    /// than `max_fraction` of the connection's live records.
    Apply { max_fraction: f64 },
}

impl DeletionPass {
    /// The pass of a tracked run that ended as its walk did.
    pub(crate) fn for_run(walk: &WalkSeen, max_fraction: f64) -> DeletionPass {
        let WalkSeen {
            tracked,
            listing_complete,
            resumed,
            unkeyed,
            parents_skipped,
        } = *walk;
        if !tracked {
            DeletionPass::Off
        } else if !listing_complete {
            DeletionPass::Skipped { reason: None }
        } else if resumed {
            // Common after an interrupted run, and no fault: said in the log only.
            tracing::info!(
                "Deletions not applied: the run went on from an earlier run's checkpoint, \
                 so it did not see the whole listing."
            );
            DeletionPass::Skipped { reason: None }
        } else if unkeyed > 0 {
            DeletionPass::Skipped {
                reason: Some(format!(
                    "deletions not applied: {unkeyed} record(s) of the listing could not be \
                     keyed, so which records it returned is not known"
                )),
            }
        } else if parents_skipped > 0 {
            // A parent skipped for a while (a repository answering 403) would otherwise
            // lose all its children.
            DeletionPass::Skipped {
                reason: Some(format!(
                    "deletions not applied: {parents_skipped} parent record(s) could not be \
                     listed, so which of their records still exist is not known"
                )),
            }
        } else {
            DeletionPass::Apply { max_fraction }
        }
    }
}

/// What the closing transaction did about deletions.
#[derive(Debug, Default)]
pub(crate) struct Decided {
    /// Records marked deleted.
    pub deleted: u64,
    /// Why none were marked although the listing was complete (the safety valve).
    pub refused: Option<String>,
}

/// The stream's live records of the connection's user (not marked deleted).
fn live(connection: &connection::Model, stream: &StreamScope) -> Condition {
    Condition::all()
        .add(record::Column::UserId.eq(connection.user_id.as_str()))
        .add(record::Column::Provider.eq(stream.namespace()))
        .add(record::Column::DeletedAt.is_null())
}

/// The connection's live records that run `run_id` neither wrote (a record it inserted,
/// updated or restored carries its id in `last_seen_run_id`) nor noted as seen, and that
/// were last written before the run started: a record another run wrote meanwhile may
/// have come into the listing after this run's walk went past its place.
fn unseen(
    connection: &connection::Model,
    stream: &StreamScope,
    run_id: i64,
    started_at: DateTime<Utc>,
) -> Condition {
    let sighting = Query::select()
        .expr(Expr::val(1))
        .from(run_sighting::Entity)
        .and_where(Expr::col((run_sighting::Entity, run_sighting::Column::RunId)).eq(run_id))
        .and_where(
            Expr::col((run_sighting::Entity, run_sighting::Column::ExternalId))
                .equals((record::Entity, record::Column::ExternalId)),
        )
        .to_owned();
    live(connection, stream)
        .add(record::Column::LastSeenRunId.ne(run_id))
        .add(record::Column::UpdatedAt.lt(started_at))
        .add(Expr::exists(sighting).not())
}

/// The stream's records that were live when run `run_id` started: live now, neither
/// inserted by the run nor by anyone after it started, less the `restored` ones the run
/// brought back (they were deleted before it).
async fn live_before(
    txn: &impl ConnectionTrait,
    connection: &connection::Model,
    stream: &StreamScope,
    run_id: i64,
    started_at: DateTime<Utc>,
    restored: u64,
) -> Result<u64, DbErr> {
    let live_now_and_older = record::Entity::find()
        .filter(
            live(connection, stream)
                .add(record::Column::FirstSeenRunId.ne(run_id))
                .add(record::Column::CreatedAt.lt(started_at)),
        )
        .count(txn)
        .await?;
    Ok(live_now_and_older.saturating_sub(restored))
}

/// Why the valve holds back marking `candidates` of the `live` records that were live
/// before the run, if it does.
fn valve(candidates: u64, live: u64, max_fraction: f64) -> Option<String> {
    if candidates >= live {
        // A listing that replaced everything (another tenant's page, a changed
        // `records_path` or `id_field`) looks exactly like an account emptied, so no
        // setting lets a run mark every live record.
        return Some(format!(
            "deletions not applied: the complete listing returned none of the stream's \
             {live} records that were live before the run, and a run never marks every live \
             record deleted; nothing was marked (see deletion detection in \
             docs/configuration.md)"
        ));
    }
    // Counts fit an f64 exactly far beyond any table's size.
    if candidates as f64 > max_fraction * live as f64 {
        return Some(format!(
            "deletions not applied: the complete listing no longer returned {candidates} of \
             the connection's {live} live records (live before the run), more than \
             max_delete_fraction = {max_fraction} of them; nothing was marked, and the next \
             complete run decides again"
        ));
    }
    None
}

/// Marks the connection's records the run did not see deleted, within the valve, and
/// records their changes in one batch stamped at the end; in the run's closing `txn`.
/// `restored` is how many deleted records the run restored.
pub(crate) async fn apply(
    txn: &impl ConnectionTrait,
    connection: &connection::Model,
    stream: &StreamScope,
    run_id: i64,
    max_fraction: f64,
    restored: u64,
    now: DateTime<Utc>,
) -> Result<Decided, DbErr> {
    let started_at = sync_run::Entity::find_by_id(run_id)
        .one(txn)
        .await?
        .ok_or_else(|| DbErr::RecordNotFound(format!("run {run_id}")))?
        .started_at;
    let candidates = record::Entity::find()
        .filter(unseen(connection, stream, run_id, started_at))
        .count(txn)
        .await?;
    if candidates == 0 {
        return Ok(Decided::default());
    }
    // The share is of what the run would lose: records it inserted or restored would
    // dilute it, so a listing of entirely new ids could mark every old record.
    let live = live_before(txn, connection, stream, run_id, started_at, restored).await?;
    if let Some(reason) = valve(candidates, live, max_fraction) {
        return Ok(Decided {
            deleted: 0,
            refused: Some(reason),
        });
    }
    let deleted = record::Entity::update_many()
        .col_expr(record::Column::DeletedAt, Expr::value(now))
        .col_expr(record::Column::DeletedByRunId, Expr::value(run_id))
        // A deletion is a change: readers of what changed since an instant find it.
        .col_expr(record::Column::UpdatedAt, Expr::value(now))
        .filter(unseen(connection, stream, run_id, started_at))
        .exec(txn)
        .await?
        .rows_affected;
    if deleted > 0 {
        record_deletions(txn, connection, stream, run_id, deleted, now).await?;
    }
    Ok(Decided {
        deleted,
        refused: None,
    })
}

/// One `deleted` change per record run `run_id` just marked, in key order, in a batch of
/// their own, stamped last.
async fn record_deletions(
    txn: &impl ConnectionTrait,
    connection: &connection::Model,
    stream: &StreamScope,
    run_id: i64,
    deleted: u64,
    now: DateTime<Utc>,
) -> Result<(), DbErr> {
    let owner = BatchOwner {
        run_id,
        user_id: &connection.user_id,
        provider: stream.namespace(),
    };
    let mut batch = changes::open_batch(txn, owner).await?;
    let count = usize::try_from(deleted)
        .map_err(|_| DbErr::Custom(format!("{deleted} deletions do not fit one batch")))?;
    let slot = batch.reserve(count)?;
    // Both numbers are ours (a row id and an ordinal), never text from outside.
    let ordinal = format!(
        "{} + row_number() OVER (ORDER BY {}) - 1",
        slot.first,
        record::Column::ExternalId.as_str()
    );
    let marked = Query::select()
        .expr(Expr::val(slot.batch_id))
        .expr(Expr::cust(ordinal))
        .column(record::Column::ExternalId)
        .expr(Expr::val(ChangeKind::Deleted.to_value()))
        .from(record::Entity)
        .and_where(record::Column::UserId.eq(connection.user_id.as_str()))
        .and_where(record::Column::Provider.eq(stream.namespace()))
        .and_where(record::Column::DeletedByRunId.eq(run_id))
        .to_owned();
    let insert = Query::insert()
        .into_table(change::Entity)
        .columns([
            change::Column::BatchId,
            change::Column::Ordinal,
            change::Column::ExternalId,
            change::Column::Kind,
        ])
        .select_from(marked)
        .map_err(|error| DbErr::Custom(format!("building the deletions' changes: {error}")))?
        .to_owned();
    txn.execute(&insert).await?;
    changes::stamp_batch(txn, &batch, now).await
}

/// Removes run `run_id`'s sightings (it is closing).
pub(crate) async fn forget_sightings(txn: &impl ConnectionTrait, run_id: i64) -> Result<(), DbErr> {
    run_sighting::Entity::delete_many()
        .filter(run_sighting::Column::RunId.eq(run_id))
        .exec(txn)
        .await?;
    Ok(())
}

/// Removes the sightings that earlier runs of the connection left behind (a run killed
/// before it closed): runs of one connection take turns, so none of them is still going.
/// Fenced like a page: a run that stalled before it got here and lost its lease meanwhile
/// must not remove the sightings of the run that took the connection over, so nothing is
/// removed and `None` is returned (the run's first commit finds the lease lost and ends it).
/// Read first, then deleted run by run, so that no statement locks other runs' rows.
pub(crate) async fn remove_orphans(
    db: &DatabaseConnection,
    connection: &connection::Model,
    run_id: i64,
    lease: Option<&Fence>,
) -> Result<Option<u64>, DbErr> {
    let earlier_runs = Query::select()
        .column(sync_run::Column::Id)
        .from(sync_run::Entity)
        .and_where(sync_run::Column::UserId.eq(connection.user_id.as_str()))
        .and_where(sync_run::Column::Provider.eq(connection.provider.as_str()))
        .and_where(sync_run::Column::Id.lt(run_id))
        .to_owned();
    let orphaned: Vec<i64> = run_sighting::Entity::find()
        .select_only()
        .column(run_sighting::Column::RunId)
        .distinct()
        .filter(run_sighting::Column::RunId.in_subquery(earlier_runs))
        .into_tuple()
        .all(db)
        .await?;
    if orphaned.is_empty() {
        return Ok(Some(0));
    }
    let txn = begin_page_transaction(db).await?;
    if fence::hold(&txn, run_id, connection.id, lease, Utc::now())
        .await?
        .is_err()
    {
        txn.rollback().await?;
        return Ok(None);
    }
    let mut removed = 0u64;
    for orphan in orphaned {
        let deleted = run_sighting::Entity::delete_many()
            .filter(run_sighting::Column::RunId.eq(orphan))
            .exec(&txn)
            .await?
            .rows_affected;
        removed = removed.saturating_add(deleted);
    }
    txn.commit().await?;
    Ok(Some(removed))
}
