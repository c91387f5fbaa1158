//! Sync jobs (`sync_jobs`): a schedule slot of a connection is one job, whichever
//! instance computes it first. Every daemon fires every schedule; each tries to insert the
//! slot's job for each connection, and only the one whose insert goes in runs it, so N
//! instances send a provider the requests of one (docs/decisions/job-queue.md).

use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseConnection, DbErr, EntityTrait, NotSet, QueryFilter,
    Set, SqlErr,
};

use crate::entities::instance;
use crate::entities::sync_job::{self, JobKind, JobStatus};

/// What a job whose instance stopped says.
const ORPHANED: &str = "its instance stopped before the job ended; the connection's next \
    slot goes on from its checkpoint once the lease expires";

/// Takes slot `slot_at` of connection `connection_id` for `holder`: inserts its job as
/// running and returns its id, or `None` when another instance inserted it first.
pub(crate) async fn take_slot(
    db: &DatabaseConnection,
    connection_id: i64,
    slot_at: DateTime<Utc>,
    holder: &str,
) -> Result<Option<i64>, DbErr> {
    let now = Utc::now();
    let job = sync_job::ActiveModel {
        id: NotSet,
        connection_id: Set(connection_id),
        stream: Set(String::new()),
        kind: Set(JobKind::Scheduled),
        slot_at: Set(Some(slot_at)),
        status: Set(JobStatus::Running),
        holder: Set(Some(holder.to_string())),
        created_at: Set(now),
        started_at: Set(Some(now)),
        finished_at: Set(None),
        outcome: Set(None),
    };
    match job.insert(db).await {
        Ok(row) => Ok(Some(row.id)),
        Err(error) => match error.sql_err() {
            Some(SqlErr::UniqueConstraintViolation(_)) => Ok(None),
            _ => Err(error),
        },
    }
}

/// Records how job `job_id` ended.
pub(crate) async fn finish(
    db: &DatabaseConnection,
    job_id: i64,
    status: JobStatus,
    outcome: String,
) -> Result<(), DbErr> {
    sync_job::Entity::update_many()
        .col_expr(sync_job::Column::Status, Expr::value(status))
        .col_expr(sync_job::Column::Outcome, Expr::value(outcome))
        .col_expr(sync_job::Column::FinishedAt, Expr::value(Utc::now()))
        .filter(sync_job::Column::Id.eq(job_id))
        .exec(db)
        .await?;
    Ok(())
}

/// Marks `interrupted` the running jobs whose instance is gone (a worker killed mid-job):
/// no row in `instances` with a fresh heartbeat has their holder's host and pid (the
/// holder's nonce differs from call to call within a process). Returns how many.
pub(crate) async fn interrupt_orphans(
    db: &DatabaseConnection,
    now: DateTime<Utc>,
) -> Result<u64, DbErr> {
    let live: Vec<String> = instance::Entity::find()
        .filter(instance::Column::HeartbeatAt.gte(crate::db::stale_before(now)))
        .all(db)
        .await?
        .into_iter()
        .map(|row| format!("{}:{}:", row.host, row.pid))
        .collect();
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
    Ok(sync_job::Entity::update_many()
        .col_expr(
            sync_job::Column::Status,
            Expr::value(JobStatus::Interrupted),
        )
        .col_expr(sync_job::Column::Outcome, Expr::value(ORPHANED))
        .col_expr(sync_job::Column::FinishedAt, Expr::value(now))
        .filter(sync_job::Column::Status.eq(JobStatus::Running))
        .filter(sync_job::Column::Id.is_in(orphans))
        .exec(db)
        .await?
        .rows_affected)
}

/// Deletes the jobs that finished before `before`; returns how many.
pub(crate) async fn sweep_finished(
    db: &DatabaseConnection,
    before: DateTime<Utc>,
) -> Result<u64, DbErr> {
    Ok(sync_job::Entity::delete_many()
        .filter(sync_job::Column::FinishedAt.lt(before))
        .exec(db)
        .await?
        .rows_affected)
}
