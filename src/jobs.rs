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

use crate::entities::sync_job::{self, JobKind, JobStatus};

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
