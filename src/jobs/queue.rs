//! The `sync_jobs` table as a queue: jobs are inserted idempotently (a schedule slot is
//! one job whichever instance computes it first), wait `queued` until `not_before`, and
//! are claimed, the most urgent first, with `FOR UPDATE SKIP LOCKED` on PostgreSQL and
//! MySQL/MariaDB or under SQLite's one writer (docs/decisions/job-queue.md).

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, ExprTrait, LockBehavior, LockType, OnConflict};
use sea_orm::{
    ColumnTrait, Condition, DatabaseBackend, DatabaseConnection, DbErr, EntityTrait, NotSet,
    QueryFilter, QueryOrder, QuerySelect, Set, SqliteTransactionMode, TransactionOptions,
    TransactionTrait,
};

use std::collections::HashMap;

use crate::entities::sync_job::{self, JobKind, JobStatus};
use crate::entities::{connection, instance};

/// Rows per insert statement: far below SQLite's limit on bound parameters.
const INSERT_CHUNK: usize = 500;

/// What a re-queued job whose instance stopped says.
const REQUEUED: &str = "re-queued: its instance stopped before the job ended";

/// A job to insert.
#[derive(Clone, Debug)]
pub(crate) struct NewJob {
    pub connection_id: i64,
    pub provider: String,
    /// Empty: every stream the provider syncs.
    pub stream: String,
    pub kind: JobKind,
    /// The schedule slot (scheduled and full jobs): one job per connection, stream, kind
    /// and slot.
    pub slot_at: Option<DateTime<Utc>>,
    pub not_before: DateTime<Utc>,
    pub attempt: i32,
    pub full: bool,
}

impl NewJob {
    fn row(
        &self,
        now: DateTime<Utc>,
        status: JobStatus,
        holder: Option<&str>,
    ) -> sync_job::ActiveModel {
        sync_job::ActiveModel {
            id: NotSet,
            connection_id: Set(self.connection_id),
            provider: Set(self.provider.clone()),
            stream: Set(self.stream.clone()),
            kind: Set(self.kind),
            slot_at: Set(self.slot_at),
            status: Set(status),
            priority: Set(self.kind.priority()),
            not_before: Set(Some(self.not_before)),
            attempt: Set(self.attempt),
            full: Set(self.full),
            holder: Set(holder.map(str::to_string)),
            created_at: Set(now),
            started_at: Set(holder.map(|_| now)),
            finished_at: Set(None),
            outcome: Set(None),
            cancel_requested_at: Set(None),
        }
    }
}

/// Queues `jobs`; a slot some instance queued already is left as it is. Returns how many
/// were inserted.
pub(crate) async fn enqueue(
    db: &impl sea_orm::ConnectionTrait,
    jobs: &[NewJob],
) -> Result<u64, DbErr> {
    let now = crate::db::now();
    let mut inserted = 0u64;
    for chunk in jobs.chunks(INSERT_CHUNK) {
        let rows = chunk
            .iter()
            .map(|job| job.row(now, JobStatus::Queued, None));
        let result = sync_job::Entity::insert_many(rows)
            .on_conflict(
                // No target: a slot is one job whatever its kind (`sync_jobs_slot_once_key`),
                // and the release before keeps its own key (connection, stream, kind, slot)
                // for as long as it may run beside this one.
                OnConflict::new()
                    // MySQL has no DO NOTHING: `ON DUPLICATE KEY UPDATE ... = ...` changes no row.
                    .do_nothing_on([sync_job::Column::ConnectionId])
                    .to_owned(),
            )
            .exec_without_returning(db)
            .await?;
        inserted = inserted.saturating_add(result);
    }
    Ok(inserted)
}

/// Inserts `job` already claimed by `holder` (a run this process starts at once, such
/// as `tributary sync`'s) and returns its id.
pub(crate) async fn insert_claimed(
    db: &DatabaseConnection,
    job: &NewJob,
    holder: &str,
) -> Result<i64, DbErr> {
    use sea_orm::ActiveModelTrait;
    let row = job
        .row(crate::db::now(), JobStatus::Running, Some(holder))
        .insert(db)
        .await?;
    Ok(row.id)
}

/// Queues `job` (one with no slot, which never conflicts) and returns its id.
pub(crate) async fn insert_queued(
    db: &impl sea_orm::ConnectionTrait,
    job: &NewJob,
) -> Result<i64, DbErr> {
    use sea_orm::ActiveModelTrait;
    let row = job
        .row(crate::db::now(), JobStatus::Queued, None)
        .insert(db)
        .await?;
    Ok(row.id)
}

/// A job claimed, with its connection's row as the claim read it (`None`: removed) and
/// the connection's paused streams.
pub(crate) struct Claimed {
    pub job: sync_job::Model,
    pub connection: Option<connection::Model>,
    pub paused_streams: Vec<String>,
}

/// What a claim took, and whether more may be due.
pub(crate) struct Claims {
    pub claimed: Vec<Claimed>,
    /// The claim read as many due jobs as it could take (some perhaps superseded, or
    /// taken by another instance first): more may be due. False: none was left.
    pub more_due: bool,
    /// Jobs it skipped, superseded by a later slot of their connection.
    pub superseded: u64,
}

/// `provider`'s queued jobs due at `now`.
fn due_jobs(provider: &str, now: DateTime<Utc>) -> sea_orm::Select<sync_job::Entity> {
    sync_job::Entity::find()
        .filter(sync_job::Column::Status.eq(JobStatus::Queued))
        .filter(sync_job::Column::Provider.eq(provider))
        .filter(
            Condition::any()
                .add(sync_job::Column::NotBefore.is_null())
                .add(sync_job::Column::NotBefore.lte(now)),
        )
}

/// Whether any of `provider`'s queued jobs is due at `now`: one read outside a
/// transaction that locks nothing, so that a worker whose last claim left none due looks
/// at the queue for the price of a statement, not of a claim's transaction.
pub(crate) async fn any_due(
    db: &DatabaseConnection,
    provider: &str,
    now: DateTime<Utc>,
) -> Result<bool, DbErr> {
    let due = due_jobs(provider, now)
        .select_only()
        .column(sync_job::Column::Id)
        .limit(1)
        .into_tuple::<i64>()
        .one(db)
        .await?;
    Ok(due.is_some())
}

/// Claims for `holder` up to `limit` of `provider`'s queued jobs due at `now`, the highest
/// priority first, then the longest due. Jobs another instance is claiming at the same
/// moment are skipped, not waited for. A scheduled job with a later slot of its
/// connection queued and due is skipped instead, superseded by it. The connections of
/// the jobs claimed are read in the same transaction, so a run starts without a read of
/// its own.
pub(crate) async fn claim(
    db: &DatabaseConnection,
    provider: &str,
    holder: &str,
    limit: u64,
    now: DateTime<Utc>,
) -> Result<Claims, DbErr> {
    let mut claims = Claims {
        claimed: Vec::new(),
        more_due: true,
        superseded: 0,
    };
    if limit == 0 {
        return Ok(claims);
    }
    // SQLite: the write lock up front, so the read and the update see one state.
    let txn = db
        .begin_with_options(TransactionOptions {
            sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
            ..TransactionOptions::default()
        })
        .await?;
    let mut jobs = claim_order(provider, now, limit, db.get_database_backend())
        .all(&txn)
        .await?;
    claims.more_due = u64::try_from(jobs.len()).is_ok_and(|read| read >= limit);
    let later = later_slots(&txn, &jobs, now).await?;
    let superseded = supersede(&txn, &mut jobs, &later, now).await?;
    claims.superseded = superseded;
    if jobs.is_empty() {
        txn.commit().await?;
        return Ok(claims);
    }
    // One statement per job, by primary key: `id IN (...)` let MariaDB's planner read
    // through the queue's index or the whole table when its statistics were stale,
    // locking jobs it did not claim, and so deadlock with another instance queueing a
    // slot (whose insert locks the duplicates it meets).
    let mut claimed = 0u64;
    for job in &jobs {
        claimed = claimed.saturating_add(
            sync_job::Entity::update_many()
                .col_expr(sync_job::Column::Status, Expr::value(JobStatus::Running))
                .col_expr(sync_job::Column::Holder, Expr::value(holder))
                .col_expr(sync_job::Column::StartedAt, Expr::value(now))
                .filter(sync_job::Column::Id.eq(job.id))
                .filter(sync_job::Column::Status.eq(JobStatus::Queued))
                .exec(&txn)
                .await?
                .rows_affected,
        );
    }
    if usize::try_from(claimed).ok() != Some(jobs.len()) {
        // Only possible without row locks; the next poll tries again.
        txn.rollback().await?;
        claims.more_due = true;
        return Ok(claims);
    }
    let mut ids: Vec<i64> = jobs.iter().map(|job| job.connection_id).collect();
    ids.sort_unstable();
    ids.dedup();
    let connections = connection::Entity::find()
        .filter(connection::Column::Id.is_in(ids.clone()))
        .all(&txn)
        .await?;
    // Only a run someone asked for runs a paused stream: no read when all are such.
    let mut paused = HashMap::new();
    if jobs.iter().any(|job| job.kind != JobKind::Manual) {
        let of = sea_orm::sea_query::Query::select()
            .column(connection::Column::Id)
            .from(connection::Entity)
            .and_where(connection::Column::Id.is_in(ids))
            .to_owned();
        paused = crate::pipeline::streams::paused_streams(&txn, of).await?;
    }
    txn.commit().await?;
    if superseded > 0 {
        tracing::info!(
            provider,
            jobs = superseded,
            "Slots of a backed-up queue skipped: a later slot of their connection runs."
        );
    }
    claims.claimed = jobs
        .into_iter()
        .map(|mut job| {
            job.status = JobStatus::Running;
            job.holder = Some(holder.to_string());
            job.started_at = Some(now);
            let connection = connections
                .iter()
                .find(|connection| connection.id == job.connection_id)
                .cloned();
            let paused_streams = paused.get(&job.connection_id).cloned().unwrap_or_default();
            Claimed {
                job,
                connection,
                paused_streams,
            }
        })
        .collect();
    Ok(claims)
}

/// The jobs a claim takes, locked: `provider`'s due at `now`, the highest priority first,
/// then the longest due, then the oldest, in the order of the queue's index
/// (`sync_jobs_claim_idx`), so that the database reads them off its front rather than
/// sorting the whole queue.
fn claim_order(
    provider: &str,
    now: DateTime<Utc>,
    limit: u64,
    backend: DatabaseBackend,
) -> sea_orm::Select<sync_job::Entity> {
    let due = due_jobs(provider, now)
        .order_by_desc(sync_job::Column::Priority)
        .order_by_asc(sync_job::Column::NotBefore)
        .order_by_asc(sync_job::Column::Id)
        .limit(limit);
    if backend == DatabaseBackend::Sqlite {
        due
    } else {
        due.lock_with_behavior(LockType::Update, LockBehavior::SkipLocked)
    }
}

/// The latest slot of each connection and stream among the scheduled jobs queued and due
/// at `now` for the connections of `jobs`: one read for the whole claim, whose jobs are
/// among them (still `queued` in its view).
async fn later_slots(
    txn: &impl sea_orm::ConnectionTrait,
    jobs: &[sync_job::Model],
    now: DateTime<Utc>,
) -> Result<HashMap<(i64, String), DateTime<Utc>>, DbErr> {
    let mut ids: Vec<i64> = jobs
        .iter()
        .filter(|job| job.kind == JobKind::Scheduled && job.slot_at.is_some())
        .map(|job| job.connection_id)
        .collect();
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    ids.sort_unstable();
    ids.dedup();
    let due: Vec<(i64, String, Option<DateTime<Utc>>)> = sync_job::Entity::find()
        .select_only()
        .column(sync_job::Column::ConnectionId)
        .column(sync_job::Column::Stream)
        .column_as(sync_job::Column::SlotAt.max(), "slot_at")
        .filter(sync_job::Column::ConnectionId.is_in(ids))
        .filter(sync_job::Column::Kind.eq(JobKind::Scheduled))
        .filter(sync_job::Column::Status.eq(JobStatus::Queued))
        .filter(sync_job::Column::NotBefore.lte(now))
        .group_by(sync_job::Column::ConnectionId)
        .group_by(sync_job::Column::Stream)
        .into_tuple()
        .all(txn)
        .await?;
    Ok(due
        .into_iter()
        .filter_map(|(connection, stream, slot)| Some(((connection, stream), slot?)))
        .collect())
}

/// Of the scheduled jobs among `jobs`, marks skipped those with a later slot of their
/// connection and stream queued and due (`latest`, claimed here or not), superseded by
/// it: its run serves them, as one run of a busy connection serves the slots it overlaps.
/// Returns how many.
async fn supersede(
    txn: &impl sea_orm::ConnectionTrait,
    jobs: &mut Vec<sync_job::Model>,
    latest: &HashMap<(i64, String), DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Result<u64, DbErr> {
    let mut superseded: Vec<(i64, DateTime<Utc>)> = Vec::new();
    for job in jobs.iter() {
        if let (JobKind::Scheduled, Some(slot)) = (job.kind, job.slot_at) {
            if let Some(later) = latest.get(&(job.connection_id, job.stream.clone())) {
                if *later > slot {
                    superseded.push((job.id, *later));
                }
            }
        }
    }
    for (id, later) in &superseded {
        sync_job::Entity::update_many()
            .col_expr(sync_job::Column::Status, Expr::value(JobStatus::Skipped))
            .col_expr(
                sync_job::Column::Outcome,
                Expr::value(format!(
                    "superseded by the slot at {later}, queued behind it"
                )),
            )
            .col_expr(sync_job::Column::FinishedAt, Expr::value(now))
            .filter(sync_job::Column::Id.eq(*id))
            .exec(txn)
            .await?;
    }
    jobs.retain(|job| !superseded.iter().any(|(id, _)| *id == job.id));
    Ok(u64::try_from(superseded.len()).unwrap_or(u64::MAX))
}

/// Whether job `job_id` is still running under `holder`, locking its row until the
/// transaction `txn` ends (SQLite: its write lock, taken up front, does). A worker that
/// stalled past its instance's heartbeat finds its job put back and perhaps claimed by
/// another instance: it must then write nothing of the job's end, nor queue a retry or
/// the rest of its run.
pub(crate) async fn still_holds(
    txn: &impl sea_orm::ConnectionTrait,
    job_id: i64,
    holder: &str,
) -> Result<bool, DbErr> {
    let mut query = sync_job::Entity::find_by_id(job_id)
        .filter(sync_job::Column::Holder.eq(holder))
        .filter(sync_job::Column::Status.eq(JobStatus::Running));
    if txn.get_database_backend() != DatabaseBackend::Sqlite {
        query = query.lock(LockType::Update);
    }
    Ok(query.one(txn).await?.is_some())
}

/// Records how job `job_id`, running under `holder`, ended. A job that moved on (put back
/// after its instance was taken for gone, claimed again or ended since) is left as it
/// is: the write is fenced by the holder, as a run's pages are by the lease.
pub(crate) async fn finish(
    db: &impl sea_orm::ConnectionTrait,
    job_id: i64,
    holder: &str,
    status: JobStatus,
    outcome: String,
) -> Result<(), DbErr> {
    let ended = sync_job::Entity::update_many()
        .col_expr(sync_job::Column::Status, Expr::value(status))
        .col_expr(sync_job::Column::Outcome, Expr::value(outcome))
        .col_expr(sync_job::Column::FinishedAt, Expr::value(crate::db::now()))
        .filter(sync_job::Column::Id.eq(job_id))
        .filter(sync_job::Column::Holder.eq(holder))
        .filter(sync_job::Column::Status.eq(JobStatus::Running))
        .exec(db)
        .await?
        .rows_affected;
    if ended == 0 {
        tracing::warn!(
            job_id,
            holder,
            %status,
            "The job had moved on (its instance was taken for gone); its end is not recorded."
        );
    }
    Ok(())
}

/// Puts job `job_id`, running under `holder`, back in the queue, due at `not_before`,
/// saying why; a job someone asked to cancel meanwhile ends `cancelled` instead, and one
/// that moved on is left as it is (see [`finish`]).
pub(crate) async fn requeue(
    db: &impl sea_orm::ConnectionTrait,
    job_id: i64,
    holder: &str,
    not_before: DateTime<Utc>,
    outcome: String,
) -> Result<(), DbErr> {
    let requeued = sync_job::Entity::update_many()
        .col_expr(sync_job::Column::Status, Expr::value(JobStatus::Queued))
        .col_expr(sync_job::Column::Holder, Expr::value(None::<String>))
        .col_expr(sync_job::Column::NotBefore, Expr::value(not_before))
        .col_expr(sync_job::Column::Outcome, Expr::value(outcome.clone()))
        .filter(sync_job::Column::Id.eq(job_id))
        .filter(sync_job::Column::Holder.eq(holder))
        .filter(sync_job::Column::Status.eq(JobStatus::Running))
        .filter(sync_job::Column::CancelRequestedAt.is_null())
        .exec(db)
        .await?
        .rows_affected;
    if requeued == 0 {
        let outcome = format!("cancelled on request; {outcome}");
        finish(db, job_id, holder, JobStatus::Cancelled, outcome).await?;
    }
    Ok(())
}

/// What asking to cancel a job did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CancelOutcome {
    /// It was queued: it is `cancelled` now and never runs.
    Cancelled,
    /// It is running: its instance stops its run between pages (at its next poll).
    Requested,
    /// It had ended already, with this status.
    Ended(JobStatus),
    NotFound,
}

/// Cancels job `job_id`: at once when it is queued, else, when it is running, by asking
/// its instance through `cancel_requested_at`. Each step is one conditional `UPDATE`,
/// so a claim racing the cancel either wins (the run is asked to stop) or finds the job
/// cancelled.
pub(crate) async fn cancel(
    db: &DatabaseConnection,
    job_id: i64,
    now: DateTime<Utc>,
) -> Result<CancelOutcome, DbErr> {
    // A job can go from running back to queued (its run waits for the lease) between
    // the two statements; a few turns settle it.
    for _ in 0..3 {
        let cancelled = sync_job::Entity::update_many()
            .col_expr(sync_job::Column::Status, Expr::value(JobStatus::Cancelled))
            .col_expr(sync_job::Column::CancelRequestedAt, Expr::value(now))
            .col_expr(sync_job::Column::FinishedAt, Expr::value(now))
            .col_expr(
                sync_job::Column::Outcome,
                Expr::value("cancelled on request before it ran"),
            )
            .filter(sync_job::Column::Id.eq(job_id))
            .filter(sync_job::Column::Status.eq(JobStatus::Queued))
            .exec(db)
            .await?
            .rows_affected;
        if cancelled > 0 {
            return Ok(CancelOutcome::Cancelled);
        }
        // The first request's time is kept: asking twice changes nothing.
        sync_job::Entity::update_many()
            .col_expr(sync_job::Column::CancelRequestedAt, Expr::value(now))
            .filter(sync_job::Column::Id.eq(job_id))
            .filter(sync_job::Column::Status.eq(JobStatus::Running))
            .filter(sync_job::Column::CancelRequestedAt.is_null())
            .exec(db)
            .await?;
        let Some(job) = sync_job::Entity::find_by_id(job_id).one(db).await? else {
            return Ok(CancelOutcome::NotFound);
        };
        match job.status {
            JobStatus::Running if job.cancel_requested_at.is_some() => {
                return Ok(CancelOutcome::Requested)
            }
            JobStatus::Running | JobStatus::Queued => continue,
            ended => return Ok(CancelOutcome::Ended(ended)),
        }
    }
    Ok(CancelOutcome::Requested)
}

/// Of `job_ids` (the jobs this instance runs), those someone asked to cancel.
pub(crate) async fn cancel_requested(
    db: &impl sea_orm::ConnectionTrait,
    job_ids: Vec<i64>,
) -> Result<Vec<i64>, DbErr> {
    if job_ids.is_empty() {
        return Ok(Vec::new());
    }
    sync_job::Entity::find()
        .select_only()
        .column(sync_job::Column::Id)
        .filter(sync_job::Column::Id.is_in(job_ids))
        .filter(sync_job::Column::CancelRequestedAt.is_not_null())
        .into_tuple::<i64>()
        .all(db)
        .await
}

/// Whether someone asked to cancel job `job_id`.
pub(crate) async fn is_cancel_requested(
    db: &impl sea_orm::ConnectionTrait,
    job_id: i64,
) -> Result<bool, DbErr> {
    Ok(!cancel_requested(db, vec![job_id]).await?.is_empty())
}

/// Re-queues the running jobs whose instance is gone (a worker killed mid-job, its
/// machine lost): no row in `instances` with a fresh heartbeat has their holder's host
/// and pid (the holder's nonce differs from call to call within a process), and they are
/// not `own` (this process's `host:pid:` prefix: it is alive, announced or not). Another
/// instance claims them; their runs take the connection's lease once it expires, which
/// fences the stopped worker out, and go on from the checkpoint. Returns how many.
pub(crate) async fn requeue_orphans(
    db: &DatabaseConnection,
    own: &str,
    now: DateTime<Utc>,
) -> Result<u64, DbErr> {
    let mut live: Vec<String> = instance::Entity::find()
        .filter(instance::Column::HeartbeatAt.gte(crate::db::stale_before(now)))
        .all(db)
        .await?
        .into_iter()
        .map(|row| format!("{}:{}:", row.host, row.pid))
        .collect();
    live.push(own.to_string());
    let orphans: Vec<i64> = sync_job::Entity::find()
        .filter(sync_job::Column::Status.eq(JobStatus::Running))
        .all(db)
        .await?
        .into_iter()
        .filter(|job| {
            let holder = job.holder.as_deref().unwrap_or_default();
            !live
                .iter()
                .any(|prefix| holder.starts_with(prefix.as_str()))
        })
        .map(|job| job.id)
        .collect();
    if orphans.is_empty() {
        return Ok(0);
    }
    // Asked to stop: the instance is gone, so is the run; nothing is re-queued.
    let cancelled = sync_job::Entity::update_many()
        .col_expr(sync_job::Column::Status, Expr::value(JobStatus::Cancelled))
        .col_expr(sync_job::Column::FinishedAt, Expr::value(now))
        .col_expr(
            sync_job::Column::Outcome,
            Expr::value("cancelled on request; its instance stopped before the run did"),
        )
        .filter(sync_job::Column::Status.eq(JobStatus::Running))
        .filter(sync_job::Column::Id.is_in(orphans.clone()))
        .filter(sync_job::Column::CancelRequestedAt.is_not_null())
        .exec(db)
        .await?
        .rows_affected;
    let requeued = sync_job::Entity::update_many()
        .col_expr(sync_job::Column::Status, Expr::value(JobStatus::Queued))
        .col_expr(sync_job::Column::Holder, Expr::value(None::<String>))
        // `not_before` kept: the job was due long ago and goes ahead of the jobs queued
        // since, not behind a slot's backlog.
        .col_expr(
            sync_job::Column::Attempt,
            Expr::col(sync_job::Column::Attempt).add(1),
        )
        .col_expr(sync_job::Column::Outcome, Expr::value(REQUEUED))
        .filter(sync_job::Column::Status.eq(JobStatus::Running))
        .filter(sync_job::Column::Id.is_in(orphans))
        .exec(db)
        .await?
        .rows_affected;
    Ok(cancelled.saturating_add(requeued))
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;
    use sea_orm::{ConnectionTrait, DatabaseBackend, QueryTrait, Statement};

    use super::*;
    use crate::testing::TestDb;

    /// A job of `connection`'s every stream, due at `not_before`.
    fn job_of(
        connection: &connection::Model,
        kind: JobKind,
        slot_at: Option<DateTime<Utc>>,
        not_before: DateTime<Utc>,
    ) -> NewJob {
        NewJob {
            connection_id: connection.id,
            provider: connection.provider.clone(),
            stream: String::new(),
            kind,
            slot_at,
            not_before,
            attempt: 0,
            full: kind == JobKind::Full,
        }
    }

    async fn job_row(test: &TestDb, job_id: i64) -> sync_job::Model {
        sync_job::Entity::find_by_id(job_id)
            .one(test.main())
            .await
            .expect("query")
            .expect("the job")
    }

    /// What the database's planner says it does for `statement`, one line per step.
    async fn plan(db: &DatabaseConnection, statement: Statement) -> Vec<String> {
        let backend = db.get_database_backend();
        let (explain, column) = match backend {
            DatabaseBackend::Postgres => ("EXPLAIN", "QUERY PLAN"),
            DatabaseBackend::MySql => ("EXPLAIN", "Extra"),
            _ => ("EXPLAIN QUERY PLAN", "detail"),
        };
        let sql = format!("{explain} {}", statement.sql);
        let statement = match statement.values {
            Some(values) => Statement::from_sql_and_values(backend, sql, values),
            None => Statement::from_string(backend, sql),
        };
        db.query_all_raw(statement)
            .await
            .expect("explained")
            .iter()
            .map(|row| {
                row.try_get::<Option<String>>("", column)
                    .expect("a plan's line")
                    .unwrap_or_default()
            })
            .collect()
    }

    /// Two instances that reckon a firing differently (a full pass by one, a plain slot
    /// by the other, started since the last full time) queue the slot once.
    #[tokio::test]
    async fn a_slot_queued_as_a_full_pass_and_as_a_plain_slot_is_one_job() {
        let test = TestDb::new().await;
        let connection = test.alice().await;
        let slot = crate::db::now();
        let job = |kind: JobKind| job_of(&connection, kind, Some(slot), slot);
        let first = enqueue(test.main(), &[job(JobKind::Full)])
            .await
            .expect("queued");
        assert_eq!(first, 1);
        // (MySQL counts the duplicate its ON DUPLICATE KEY UPDATE matched: the rows tell.)
        enqueue(test.main(), &[job(JobKind::Scheduled)])
            .await
            .expect("queued");
        let jobs = sync_job::Entity::find()
            .all(test.main())
            .await
            .expect("jobs");
        assert_eq!(jobs.len(), 1, "{jobs:?}");
        assert_eq!(jobs[0].kind, JobKind::Full);
    }

    /// A worker that stalled past its instance's heartbeat finds its job put back and
    /// claimed by another instance: its late writes of the job's end change nothing, and
    /// the job, re-queued at its old due time, went ahead of jobs queued since.
    #[tokio::test]
    async fn a_stalled_worker_writes_nothing_over_a_job_another_instance_took_over() {
        let test = TestDb::new().await;
        let connection = test.alice().await;
        let due = crate::db::now() - TimeDelta::minutes(10);
        let job = job_of(&connection, JobKind::Manual, None, due);
        let job_id = insert_queued(test.main(), &job).await.expect("queued");
        let (stalled, taker) = ("ghost:2:0001", "live:3:0002");
        let now = crate::db::now();
        let claimed = claim(test.main(), &connection.provider, stalled, 1, now)
            .await
            .expect("claimed");
        assert_eq!(claimed.claimed.len(), 1);

        // No instance row names the stalled worker's host and pid: it is taken for gone.
        let put_back = requeue_orphans(test.main(), "live:3:", now)
            .await
            .expect("orphans");
        assert_eq!(put_back, 1);
        let row = job_row(&test, job_id).await;
        assert_eq!(
            (row.status, row.not_before.map(|at| at.timestamp())),
            (JobStatus::Queued, Some(due.timestamp())),
            "put back at its old due time"
        );
        let retaken = claim(test.main(), &connection.provider, taker, 1, now)
            .await
            .expect("claimed again");
        assert_eq!(retaken.claimed.len(), 1);

        // The stalled worker wakes and records its end every way it could.
        assert!(!still_holds(test.main(), job_id, stalled)
            .await
            .expect("read"));
        finish(test.main(), job_id, stalled, JobStatus::Done, "late".into())
            .await
            .expect("finish");
        requeue(test.main(), job_id, stalled, now, "late".into())
            .await
            .expect("requeue");
        let row = job_row(&test, job_id).await;
        assert_eq!(
            (row.status, row.holder.as_deref()),
            (JobStatus::Running, Some(taker)),
            "the new holder's job is untouched"
        );
        assert!(still_holds(test.main(), job_id, taker).await.expect("read"));
        finish(
            test.main(),
            job_id,
            taker,
            JobStatus::Done,
            "run 1 succeeded".into(),
        )
        .await
        .expect("finish");
        let row = job_row(&test, job_id).await;
        assert_eq!(row.status, JobStatus::Done);
    }

    /// A claim on a backed-up queue reads its jobs off the front of the queue's index:
    /// no step of its plan sorts, which on PostgreSQL cost 17 ms of CPU a claim at 20,000
    /// queued jobs and bounded a fleet of 10,000 connections.
    #[tokio::test]
    async fn a_claim_reads_the_queue_in_its_index_order_sorting_nothing() {
        let test = TestDb::new().await;
        let connection = test.alice().await;
        let start = crate::db::now() - TimeDelta::days(1);
        let jobs: Vec<NewJob> = (0..20_000)
            .map(|i| {
                let slot = start + TimeDelta::seconds(i);
                job_of(&connection, JobKind::Scheduled, Some(slot), slot)
            })
            .collect();
        enqueue(test.main(), &jobs).await.expect("queued");
        // Half of them history, as on a queue that has run a while.
        sync_job::Entity::update_many()
            .col_expr(sync_job::Column::Status, Expr::value(JobStatus::Done))
            .filter(sync_job::Column::SlotAt.lt(start + TimeDelta::seconds(10_000)))
            .exec(test.main())
            .await
            .expect("half done");
        let backend = test.main().get_database_backend();
        let analyze = match backend {
            DatabaseBackend::Postgres => "ANALYZE sync_jobs",
            DatabaseBackend::MySql => "ANALYZE TABLE sync_jobs",
            _ => "ANALYZE",
        };
        test.main()
            .query_all_raw(Statement::from_string(backend, analyze))
            .await
            .expect("analyzed");

        let statement =
            claim_order(&connection.provider, crate::db::now(), 16, backend).build(backend);
        let steps = plan(test.main(), statement).await;
        let sorting: Vec<&String> = steps
            .iter()
            .filter(|step| {
                step.contains("Sort") || step.contains("filesort") || step.contains("TEMP B-TREE")
            })
            .collect();
        assert!(sorting.is_empty(), "the claim sorts: {steps:#?}");
    }
}
