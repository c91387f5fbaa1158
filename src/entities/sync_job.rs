//! `sync_jobs`: what should run. A schedule slot of a connection is one job whichever
//! instance computes it first (the unique connection, stream, kind and slot); jobs wait
//! `queued` until `not_before` and are claimed, the highest `priority` first, by whichever
//! instance is free.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, serde::Serialize)]
#[sea_orm(table_name = "sync_jobs")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub connection_id: i64,
    /// The connection's provider, so that a claim reads this table alone.
    pub provider: String,
    /// The stream it runs; empty for every stream the provider syncs.
    pub stream: String,
    pub kind: JobKind,
    /// The schedule slot a scheduled job is for; unique with the connection and stream.
    pub slot_at: Option<DateTimeUtc>,
    pub status: JobStatus,
    /// Claimed before jobs of lower priority (see [`JobKind::priority`]).
    pub priority: i32,
    /// Not claimed before this time (a slot's time, a retry's backoff, a budget's reopening).
    pub not_before: Option<DateTimeUtc>,
    /// How many times it was tried before: a retry's number, or re-queues after its
    /// instance stopped.
    pub attempt: i32,
    /// Its runs make full passes.
    pub full: bool,
    /// The instance that took it (`instances.holder`).
    pub holder: Option<String>,
    pub created_at: DateTimeUtc,
    pub started_at: Option<DateTimeUtc>,
    pub finished_at: Option<DateTimeUtc>,
    /// What its runs did, or why it did not run.
    #[sea_orm(column_type = "Text")]
    pub outcome: Option<String>,
    /// When someone asked a running job to stop: its instance's worker reads this and
    /// stops the run between pages; the job then ends `cancelled`.
    pub cancel_requested_at: Option<DateTimeUtc>,
}

/// Why a job exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum, serde::Serialize)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(16))")]
#[serde(rename_all = "lowercase")]
pub enum JobKind {
    /// A slot of the provider's `schedule` (or the connection's own).
    #[sea_orm(string_value = "scheduled")]
    Scheduled,
    /// A time of the provider's `full_sync_schedule`.
    #[sea_orm(string_value = "full")]
    Full,
    /// Asked for now (`tributary sync`, the operations layer).
    #[sea_orm(string_value = "manual")]
    Manual,
    /// Another try after a run that failed, after a backoff.
    #[sea_orm(string_value = "retry")]
    Retry,
    /// The rest of a run that yielded or was deferred, going on from its checkpoint.
    #[sea_orm(string_value = "resume")]
    Resume,
    /// An incremental run a provider's webhook delivery asked for; deliveries arriving
    /// while it waits join it.
    #[sea_orm(string_value = "webhook")]
    Webhook,
}

impl JobKind {
    /// Claimed in this order: a run someone asked for first, retries last so that a
    /// recovering provider serves due slots before the backlog of failures.
    pub fn priority(self) -> i32 {
        match self {
            JobKind::Manual => 100,
            // Fresher than a slot's run, never ahead of someone waiting at a terminal.
            JobKind::Webhook => 50,
            JobKind::Scheduled | JobKind::Full | JobKind::Resume => 10,
            JobKind::Retry => 5,
        }
    }
}

/// Where a job stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum, serde::Serialize)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(16))")]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    /// Waiting to be claimed, from `not_before` on.
    #[sea_orm(string_value = "queued")]
    Queued,
    /// Taken by `holder`, its runs going.
    #[sea_orm(string_value = "running")]
    Running,
    /// Its runs ended (each run's own status is in `sync_runs`).
    #[sea_orm(string_value = "done")]
    Done,
    /// Not run: a run of the connection was already going, or the connection is gone,
    /// disabled or paused (the outcome says which).
    #[sea_orm(string_value = "skipped")]
    Skipped,
    /// Its runs could not be recorded (the database failed).
    #[sea_orm(string_value = "failed")]
    Failed,
    /// Its runs were stopped (the instance shut down) before they ended; the next job
    /// of the connection goes on from its checkpoint.
    #[sea_orm(string_value = "interrupted")]
    Interrupted,
    /// Cancelled on request: before it ran, or its run stopped between pages (the pages
    /// it committed are kept, and the next run goes on from the checkpoint). Never retried.
    #[sea_orm(string_value = "cancelled")]
    Cancelled,
}

super::display_as_stored!(JobKind, JobStatus);

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
