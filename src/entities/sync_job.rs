//! `sync_jobs`: what should run. A schedule slot of a connection is one job whichever
//! instance computes it first (the unique connection, stream and slot); the instance that
//! inserted it runs it.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, serde::Serialize)]
#[sea_orm(table_name = "sync_jobs")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub connection_id: i64,
    /// The stream it runs; empty for every stream the provider syncs.
    pub stream: String,
    pub kind: JobKind,
    /// The schedule slot a scheduled job is for; unique with the connection and stream.
    pub slot_at: Option<DateTimeUtc>,
    pub status: JobStatus,
    /// The instance that took it (`instances.holder`).
    pub holder: Option<String>,
    pub created_at: DateTimeUtc,
    pub started_at: Option<DateTimeUtc>,
    pub finished_at: Option<DateTimeUtc>,
    /// What its runs did, or why it did not run.
    #[sea_orm(column_type = "Text")]
    pub outcome: Option<String>,
}

/// Why a job exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum, serde::Serialize)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(16))")]
#[serde(rename_all = "lowercase")]
pub enum JobKind {
    /// A slot of the provider's `schedule`.
    #[sea_orm(string_value = "scheduled")]
    Scheduled,
}

/// Where a job stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum, serde::Serialize)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(16))")]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    /// Taken by `holder`, its runs going.
    #[sea_orm(string_value = "running")]
    Running,
    /// Its runs ended (each run's own status is in `sync_runs`).
    #[sea_orm(string_value = "done")]
    Done,
    /// Not run: a run of the connection was already going.
    #[sea_orm(string_value = "skipped")]
    Skipped,
    /// Its runs could not be recorded (the database failed).
    #[sea_orm(string_value = "failed")]
    Failed,
    /// Its instance stopped (killed, or its machine gone) before the job ended; the
    /// connection's next slot goes on from its checkpoint once the lease expires.
    #[sea_orm(string_value = "interrupted")]
    Interrupted,
}

super::display_as_stored!(JobKind, JobStatus);

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
