//! A run: its `sync_runs` row opened `running`, the pages it stores with its running
//! totals, and its close, which commits the stream's checkpoint and cursor, the
//! deletions a complete pass decided and the notification in one transaction.

use std::time::Duration;

use chrono::Utc;
use futures::future::BoxFuture;
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr,
    EntityTrait, QueryFilter, Set,
};
use serde::Serialize;

use tributary_providers::{PageItem, Watermark};

use super::checkpoint::{checkpoint_column, Checkpoint, CheckpointMove};
use super::deletions::{self, DeletionPass};
use super::fence;
use super::ground::PageStoreCounts;
use super::ground::{begin_page_transaction, counts_model, RunCounts};
use super::store::{self, PageContext, PageExpectation};
use super::streams::{find_stream, open_stream, StreamScope};
use crate::config::{NotifyRuns, StreamSettings, WriteMode};
use crate::db::DatabasePools;
pub(crate) use crate::entities::sync_run::{RunStatus, Trigger};
use crate::entities::{connection, connection_stream, sync_run};
use crate::lease::Fence;

/// The result of one run of one connection.
#[derive(Clone, Debug, Serialize)]
pub struct RunOutcome {
    pub run_id: i64,
    pub user_id: String,
    pub provider: String,
    pub stream: String,
    pub status: RunStatus,
    pub counts: RunCounts,
    /// The run-level failure, when the status is `failed`.
    pub error: Option<String>,
    /// The run ended by a panic (its status is `failed`, the message in `error`).
    #[serde(skip)]
    pub panicked: bool,
    /// The run stopped after `max_run_duration` to give other jobs their turn (its status
    /// is `partial`); the rest is owed from its checkpoint.
    #[serde(skip)]
    pub yielded: bool,
    /// For a `deferred` run: when the spent request budget reopens, so it may resume.
    pub resume_at: Option<chrono::DateTime<Utc>>,
    #[serde(skip)]
    pub elapsed: Duration,
}

impl RunOutcome {
    /// The run as the metrics record it.
    pub(crate) fn metrics(&self, listing_complete: bool) -> crate::telemetry::RunFinished<'_> {
        crate::telemetry::RunFinished {
            provider: &self.provider,
            stream: &self.stream,
            status: self.status.to_string(),
            inserted: self.counts.inserted,
            updated: self.counts.updated,
            unchanged: self.counts.unchanged,
            duplicate: self.counts.duplicate,
            failed: self.counts.failed,
            deleted: self.counts.deleted,
            restored: self.counts.restored,
            panicked: self.panicked,
            elapsed: self.elapsed,
            listing_complete,
        }
    }
}

/// One run of one stream of one connection, from its `running` row to its close. It keeps
/// the run's totals: each page it stores adds what it came to as the page commits, and
/// [`Run::close`] stores them with the run's end. Every write of the run is fenced by its
/// lease, when it holds one (see `fence.rs`).
pub struct Run<'a> {
    db: &'a DatabasePools,
    connection: &'a connection::Model,
    stream: StreamScope,
    id: i64,
    lease: Option<&'a Fence>,
    counts: RunCounts,
}

/// A run's `running` row inserted in a transaction of the caller's ([`Run::open_in`]),
/// with its stream as that transaction read it.
#[derive(Debug)]
pub(crate) struct OpenedRun {
    stream: StreamScope,
    id: i64,
}

/// A page for [`Run::store`]: its items, and what the store needs to know about it.
#[derive(Debug, Default)]
pub struct RunPage<'p> {
    pub items: Vec<PageItem>,
    /// Where the next page starts: committed as the stream's checkpoint with the page
    /// (`None` on the last page).
    pub next_checkpoint: Option<&'p Checkpoint>,
    /// How the provider's records are written.
    pub mode: WriteMode,
    /// Leave the stream's checkpoint as it is (a replay's loose records, not a page of the
    /// listing).
    pub leave_checkpoint: bool,
    /// What the page most likely holds, which picks a shortcut.
    pub expect: PageExpectation,
    /// Note the page's keys in `run_sightings` (a tracked full pass).
    pub sightings: bool,
    /// Pages the call counts as fetched: 1 for a page of the listing, 0 for loose records.
    pub pages: u64,
    /// The page's records whose watermark lay beyond the clock (counted with the page).
    pub watermark_anomalies: u64,
    /// The page's records the provider's filter dropped (counted with the page).
    pub filtered: u64,
    /// For the object a webhook delivery carried: its version, which the store compares
    /// with the stored one and writes only over an older one.
    pub version: Option<&'p str>,
}

impl<'a> Run<'a> {
    /// Opens stream `stream` of `connection` (see [`open_stream`]) and inserts the
    /// `running` row of a new run of it. `lease`: the lease the caller holds on the
    /// connection, which fences every write of the run (`None`: the run's writes are
    /// conditional on its row being `running` only).
    pub async fn open(
        db: &'a DatabasePools,
        connection: &'a connection::Model,
        stream: &StreamSettings,
        trigger: Trigger,
        lease: Option<&'a Fence>,
    ) -> Result<Run<'a>, DbErr> {
        let stream = open_stream(db, connection, stream).await?;
        let id = start_run(db, connection, &stream, trigger).await?;
        Ok(Run {
            db,
            connection,
            stream,
            id,
            lease,
            counts: RunCounts::default(),
        })
    }

    /// Inserts, as a statement of `txn` (the lease's claim), the `running` row of a new
    /// run of `stream`, which must have run before: `None` when its state row does not
    /// exist yet, for [`Run::open`] to create in a transaction of its own.
    pub(crate) async fn open_in(
        txn: &impl ConnectionTrait,
        connection: &connection::Model,
        stream: &StreamSettings,
        trigger: Trigger,
    ) -> Result<Option<OpenedRun>, DbErr> {
        let Some(stream) = find_stream(txn, connection, stream).await? else {
            return Ok(None);
        };
        let id = start_run(txn, connection, &stream, trigger).await?;
        Ok(Some(OpenedRun { stream, id }))
    }

    /// The run [`Run::open_in`] opened, once its transaction committed.
    pub(crate) fn opened(
        db: &'a DatabasePools,
        connection: &'a connection::Model,
        opened: OpenedRun,
        lease: Option<&'a Fence>,
    ) -> Run<'a> {
        Run {
            db,
            connection,
            stream: opened.stream,
            id: opened.id,
            lease,
            counts: RunCounts::default(),
        }
    }

    /// The run's id (its row in `sync_runs`).
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The run's totals so far: those of its committed pages, and of the pages stored
    /// unchanged since, which ride its next commit.
    pub fn counts(&self) -> &RunCounts {
        &self.counts
    }

    /// The stream the run syncs, as it was when the run opened.
    pub(crate) fn stream(&self) -> &StreamScope {
        &self.stream
    }

    /// Stores one page in one transaction (see `store::store_page`) and adds its counts to
    /// the run's totals, which that transaction saves to the run's row. A page that fails
    /// adds nothing.
    pub async fn store(&mut self, page: RunPage<'_>) -> Result<PageStoreCounts, DbErr> {
        let context = self.context(&page);
        let mut after = self.counts;
        after.pages_fetched = after.pages_fetched.saturating_add(page.pages);
        after.watermark_anomalies = after
            .watermark_anomalies
            .saturating_add(page.watermark_anomalies);
        after.filtered = after.filtered.saturating_add(page.filtered);
        let stored = store::store_page(self.db, &context, page.items, &mut after).await?;
        self.counts = after;
        Ok(stored)
    }

    /// What the store knows about `page` of this run.
    fn context<'c>(&'c self, page: &RunPage<'c>) -> PageContext<'c> {
        PageContext {
            run_id: self.id,
            connection: self.connection,
            stream: &self.stream,
            next_checkpoint: page.next_checkpoint,
            mode: page.mode,
            leave_checkpoint: page.leave_checkpoint,
            expect: page.expect,
            sightings: page.sightings,
            lease: self.lease,
            version: page.version,
        }
    }

    /// Keeps the report of a page that could not be read: its body is the only copy of
    /// its records.
    pub(crate) async fn record_page_error(
        &self,
        mode: WriteMode,
        stage: tributary_providers::RecordStage,
        message: &str,
        body: &str,
    ) -> Result<(), DbErr> {
        let page = RunPage {
            mode,
            expect: PageExpectation::Unknown,
            ..RunPage::default()
        };
        store::record_page_error(self.db, &self.context(&page), stage, message, body).await
    }

    /// Counts a page the walk passed over without storing it (a parent whose children the
    /// API no longer lists); it rides the run's next commit.
    pub(crate) fn count_skipped_parent(&mut self) {
        self.counts.pages_fetched = self.counts.pages_fetched.saturating_add(1);
        self.counts.parents_skipped = self.counts.parents_skipped.saturating_add(1);
    }

    /// Counts a record that failed before it could be stored (a replay's payload that no
    /// longer keys); it rides the run's next commit.
    pub(crate) fn count_unstored_failure(&mut self) {
        self.counts.fetched = self.counts.fetched.saturating_add(1);
        self.counts.failed = self.counts.failed.saturating_add(1);
    }

    /// Closes the run in one transaction: its status and totals, and as `end` says, the
    /// stream's checkpoint and cursor, the deletions a complete pass decided and its
    /// notification. A run that lost its lease closes `interrupted` and commits nothing
    /// else; a run whose row another process closed is left as they closed it.
    pub async fn close(self, end: RunEnd<'_>) -> Result<RunClosed, DbErr> {
        finish_run(&self, &end, None).await
    }

    /// [`Run::close`] with `also`'s writes in its transaction, when it commits the run's
    /// end (not when the run lost its lease or its row).
    pub(crate) async fn close_with(
        self,
        end: RunEnd<'_>,
        also: Option<&dyn CloseStep>,
    ) -> Result<RunClosed, DbErr> {
        finish_run(&self, &end, also).await
    }
}

/// Writes of the caller's that commit with a run's close, in its transaction (a job's
/// end and its lease's release), given the run's id and how it closed.
pub(crate) trait CloseStep: Sync {
    fn write<'t>(
        &'t self,
        txn: &'t DatabaseTransaction,
        run_id: i64,
        closed: &'t RunClosed,
    ) -> BoxFuture<'t, Result<(), DbErr>>;
}

/// Inserts the `running` row for a new run of `stream` and returns its id.
async fn start_run(
    db: &impl ConnectionTrait,
    connection: &connection::Model,
    stream: &StreamScope,
    trigger: Trigger,
) -> Result<i64, DbErr> {
    let now = crate::db::now();
    let row = sync_run::ActiveModel {
        user_id: Set(connection.user_id.clone()),
        provider: Set(connection.provider.clone()),
        stream: Set(Some(stream.name().to_string())),
        trigger: Set(trigger),
        status: Set(RunStatus::Running),
        started_at: Set(now),
        finished_at: Set(None),
        heartbeat_at: Set(now),
        stamps_from: Set(Some(now)),
        pages_fetched: Set(0),
        records_fetched: Set(0),
        records_inserted: Set(0),
        records_updated: Set(0),
        records_unchanged: Set(0),
        records_duplicate: Set(0),
        records_failed: Set(0),
        watermark_anomalies: Set(0),
        records_deleted: Set(0),
        records_restored: Set(0),
        parents_skipped: Set(0),
        records_filtered: Set(0),
        error: Set(None),
        ..Default::default()
    }
    .insert(db)
    .await?;
    Ok(row.id)
}

/// How a run ended, for [`Run::close`].
pub struct RunEnd<'a> {
    pub status: RunStatus,
    /// The run-level reason, for `failed` runs and runs stopped early.
    pub error: Option<&'a str>,
    /// Every page of the listing was fetched: the stream counts as synced as of this run
    /// and its cursor advances.
    pub listing_complete: bool,
    /// What becomes of the stream's checkpoint: kept, cleared (the next run starts
    /// from the first page), or written (the pages stored unchanged since the last commit).
    pub checkpoint: CheckpointMove<'a>,
    /// The stream's new incremental watermark (only with `listing_complete`).
    pub watermark: Option<Watermark>,
    /// Which runs write a notification into the outbox as they close.
    pub notify: NotifyRuns,
    /// Whether the run marks the records its listing no longer returned deleted.
    pub deletions: DeletionPass,
    /// The `full_sync_schedule` firings the run served: what the stream owed when it
    /// began, for a full pass whose listing completed (only with `listing_complete`).
    pub full_passes_served: i64,
    /// The provider answered 401 to the connection's credentials (after any refresh):
    /// the connection needs a reconnect.
    pub authorization_refused: bool,
}

/// How a run closed: its status, reason and counters as stored, which deciding
/// deletions may have changed (the count, or `partial` with the valve's reason).
#[derive(Clone, Debug)]
pub struct RunClosed {
    pub status: RunStatus,
    pub error: Option<String>,
    pub counts: RunCounts,
}

/// Closes a run: final status, counters and error. When the listing was walked to its end
/// the stream's checkpoint is cleared, its cursor advanced and its last successful run
/// noted, all in the same transaction, so the cursor never runs ahead of the records.
/// A run that notifies writes its delivery in that transaction too.
///
/// The transaction is fenced like a page's: it locks the run's row while `running` and the
/// connection's while it holds the run's `lease` first. A run that lost its lease commits
/// none of it, and only its own row is closed, `interrupted` with the reason; a run whose
/// row someone else closed (marked `interrupted` as abandoned) is left as they closed it.
async fn finish_run(
    run: &Run<'_>,
    end: &RunEnd<'_>,
    also: Option<&dyn CloseStep>,
) -> Result<RunClosed, DbErr> {
    let db: &DatabaseConnection = run.db;
    let (connection, stream, run_id) = (run.connection, &run.stream, run.id);
    let (counts, lease) = (&run.counts, run.lease);
    // The write lock first on SQLite: deciding deletions reads before it writes.
    let txn = begin_page_transaction(db).await?;
    let now = crate::db::now();
    if let Err(unheld) = fence::hold(&txn, run_id, connection.id, lease, now).await? {
        txn.rollback().await?;
        return close_unheld(db, run_id, counts, unheld, now).await;
    }
    let mut closed = RunClosed {
        status: end.status,
        error: end.error.map(str::to_string),
        counts: *counts,
    };
    let decided = deletion_step(end, &mut closed);
    let mut row = counts_model(run_id, &closed.counts);
    row.status = Set(closed.status);
    row.finished_at = Set(Some(now));
    row.heartbeat_at = Set(now);
    row.error = Set(closed.error.clone());
    row.update(&txn).await?;

    let checkpoint = match end.checkpoint {
        CheckpointMove::Keep => None,
        CheckpointMove::Write(checkpoint) => Some(checkpoint_column(checkpoint)?),
    };
    if end.listing_complete || checkpoint.is_some() {
        let mut state = connection_stream::ActiveModel {
            id: Set(stream.state.id),
            updated_at: Set(now),
            ..Default::default()
        };
        if let Some(checkpoint) = checkpoint {
            state.checkpoint = Set(checkpoint);
        }
        if end.listing_complete {
            state.last_success_run_id = Set(Some(run_id));
            state.last_success_at = Set(Some(now));
            if let Some(watermark) = &end.watermark {
                let cursor = serde_json::to_string(watermark)
                    .map_err(|error| DbErr::Custom(format!("serialising the cursor: {error}")))?;
                state.cursor = Set(Some(cursor));
            }
        }
        // The connection's row first, as every writer of the connection takes it; a
        // leased run's fence holds it already.
        if lease.is_none() {
            lock_connection(&txn, connection.id, now).await?;
        }
        connection_stream::Entity::update(state).exec(&txn).await?;
        if end.listing_complete && end.full_passes_served > 0 {
            serve_full_passes(&txn, stream, end.full_passes_served).await?;
        }
    }
    if let Some(max_fraction) = decided {
        // After the run's and the connection's rows, as every writer of the connection.
        let applied = deletions::apply(
            &txn,
            connection,
            stream,
            run_id,
            max_fraction,
            closed.counts.restored,
            now,
        )
        .await?;
        closed.counts.deleted = closed.counts.deleted.saturating_add(applied.deleted);
        if let Some(reason) = applied.refused {
            tracing::warn!(
                reason = reason.as_str(),
                "The safety valve held back deletions."
            );
            closed.status = RunStatus::Partial;
            closed.error = Some(reason);
        }
        if applied.deleted > 0 || closed.status != end.status {
            let mut row = counts_model(run_id, &closed.counts);
            row.status = Set(closed.status);
            row.error = Set(closed.error.clone());
            row.update(&txn).await?;
        }
    }
    if end.deletions != DeletionPass::Off {
        deletions::forget_sightings(&txn, run_id).await?;
    }
    // A run that succeeded proves the authorization works again; a 401 says it does not.
    let announce = crate::db::Announce::under(end.notify);
    if end.authorization_refused
        && crate::db::mark_needs_reconnect(&txn, connection.id, now, announce).await?
    {
        tracing::warn!(
            connection_id = connection.id,
            "The provider refused the connection's credentials with 401; the connection needs a reconnect."
        );
    }
    // Only a whole listing fetched proves it: a replay or a webhook's object asks nothing.
    if closed.status == RunStatus::Succeeded
        && end.listing_complete
        && crate::db::clear_needs_reconnect(&txn, connection.id, now, announce).await?
    {
        tracing::info!(
            connection_id = connection.id,
            "The run succeeded; the connection no longer needs a reconnect."
        );
    }
    let outbox_run = super::outbox::ClosedRun {
        connection,
        stream: stream.name(),
        run_id,
        status: closed.status,
        counts: &closed.counts,
        notify: end.notify,
        now,
    };
    let delivery_id = super::outbox::write(&txn, &outbox_run).await?;
    if let Some(also) = also {
        also.write(&txn, run_id, &closed).await?;
    }
    txn.commit().await?;
    if let Some(delivery_id) = delivery_id {
        tracing::debug!(run_id, delivery_id, "Notification queued.");
    }
    Ok(closed)
}

/// Notes on a closed `deferred` run when it may resume: a statement of its own after
/// the run closed, taken only by deferred runs, so the closing transaction is unchanged.
pub(crate) async fn note_resume_at(
    db: &DatabaseConnection,
    run_id: i64,
    resume_at: chrono::DateTime<Utc>,
) -> Result<(), DbErr> {
    sync_run::Entity::update_many()
        .col_expr(sync_run::Column::ResumeAt, Expr::value(resume_at))
        .filter(sync_run::Column::Id.eq(run_id))
        .filter(sync_run::Column::Status.eq(RunStatus::Deferred))
        .exec(db)
        .await?;
    Ok(())
}

/// Takes the `served` firings off what the stream owes; firings noted since the run
/// began stay owed, so its next run is a full pass again.
async fn serve_full_passes(
    txn: &impl ConnectionTrait,
    stream: &StreamScope,
    served: i64,
) -> Result<(), DbErr> {
    let owed = connection_stream::Column::FullPassesOwed;
    connection_stream::Entity::update_many()
        .col_expr(owed, Expr::col(owed).sub(served))
        .filter(connection_stream::Column::Id.eq(stream.state.id))
        .filter(owed.gte(served))
        .exec(txn)
        .await?;
    Ok(())
}

/// Closes a run that may not commit its end (see [`finish_run`]): a run that lost its lease
/// ends `interrupted` with the reason ([`fence::LEASE_LOST`]), in its own row only (whether it was still
/// `running` or already marked `interrupted` by the process that took the lease over); a
/// run closed by someone else stays as it is.
async fn close_unheld(
    db: &DatabaseConnection,
    run_id: i64,
    counts: &RunCounts,
    unheld: fence::Unheld,
    now: chrono::DateTime<Utc>,
) -> Result<RunClosed, DbErr> {
    if unheld == fence::Unheld::RunGone {
        return Err(DbErr::RecordNotUpdated);
    }
    let reason = unheld.lost_lease_reason();
    if let Some(reason) = reason {
        tracing::warn!(
            reason = ?unheld,
            "The run lost its connection's lease; it ends interrupted, committing nothing more."
        );
        sync_run::Entity::update_many()
            .col_expr(
                sync_run::Column::Status,
                sea_orm::sea_query::Expr::value(RunStatus::Interrupted),
            )
            .col_expr(
                sync_run::Column::Error,
                sea_orm::sea_query::Expr::value(reason),
            )
            .col_expr(
                sync_run::Column::FinishedAt,
                sea_orm::sea_query::Expr::value(now),
            )
            .filter(sync_run::Column::Id.eq(run_id))
            .filter(sync_run::Column::Status.is_in([RunStatus::Running, RunStatus::Interrupted]))
            .exec(db)
            .await?;
    }
    let row = sync_run::Entity::find_by_id(run_id)
        .one(db)
        .await?
        .ok_or(DbErr::RecordNotUpdated)?;
    if reason.is_none() {
        tracing::warn!(
            status = %row.status,
            "The run's row was closed by another process; it is left as it is."
        );
    }
    Ok(RunClosed {
        status: row.status,
        error: row.error,
        counts: *counts,
    })
}

/// Locks the connection's row by writing its `updated_at`, as the page transactions'
/// first statement does; fails when the connection is gone.
async fn lock_connection(
    txn: &impl ConnectionTrait,
    connection_id: i64,
    now: chrono::DateTime<Utc>,
) -> Result<(), DbErr> {
    let locked = connection::Entity::update_many()
        .col_expr(connection::Column::UpdatedAt, now.into())
        .filter(connection::Column::Id.eq(connection_id))
        .exec(txn)
        .await?;
    if locked.rows_affected == 0 {
        return Err(DbErr::RecordNotUpdated);
    }
    Ok(())
}

/// What `end`'s deletion pass asks of the closing transaction: `Some(max_fraction)` when
/// deletions are to be applied. A skipped pass's reason is logged and becomes the run's
/// error when it has none of its own.
fn deletion_step(end: &RunEnd<'_>, closed: &mut RunClosed) -> Option<f64> {
    match &end.deletions {
        DeletionPass::Off | DeletionPass::Skipped { reason: None } => None,
        DeletionPass::Skipped {
            reason: Some(reason),
        } => {
            tracing::warn!(reason = reason.as_str(), "Deletions were not applied.");
            if closed.error.is_none() {
                closed.error = Some(reason.clone());
            }
            None
        }
        DeletionPass::Apply { max_fraction } => Some(*max_fraction),
    }
}
