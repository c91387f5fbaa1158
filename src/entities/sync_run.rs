//! `sync_runs`: one row per run of one connection.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, serde::Serialize)]
#[sea_orm(table_name = "sync_runs")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub user_id: String,
    pub provider: String,
    /// The stream the run synced; `None` for runs from before streams.
    pub stream: Option<String>,
    pub trigger: Trigger,
    pub status: RunStatus,
    pub started_at: DateTimeUtc,
    pub finished_at: Option<DateTimeUtc>,
    /// Refreshed with every committed page while the run works.
    pub heartbeat_at: DateTimeUtc,
    pub pages_fetched: i64,
    pub records_fetched: i64,
    pub records_inserted: i64,
    pub records_updated: i64,
    pub records_unchanged: i64,
    /// Records skipped because the key was already written: repeated within one page, or
    /// inserted by a concurrent writer between the lookup and the insert.
    pub records_duplicate: i64,
    pub records_failed: i64,
    /// Records whose watermark lay beyond the clock by more than the allowed skew; the
    /// cursor was clamped to the fetch time instead.
    pub watermark_anomalies: i64,
    /// Records this run marked deleted (its complete listing no longer returned them).
    pub records_deleted: i64,
    /// Deleted records this run saw again and restored.
    pub records_restored: i64,
    /// A child stream's parents whose children the API no longer lists, passed over.
    pub parents_skipped: i64,
    /// Records the provider's configured filter dropped before storing (not errors).
    pub records_filtered: i64,
    /// The run-level failure, else null.
    #[sea_orm(column_type = "Text", nullable)]
    pub error: Option<String>,
    /// For a `deferred` run: when the spent request budget reopens and it may resume.
    pub resume_at: Option<DateTimeUtc>,
    /// While running: no record this run has yet to commit is stamped earlier (its start,
    /// then each committed page's time). The records list reads below it. Internal: not
    /// shown with the run.
    #[serde(skip)]
    pub stamps_from: Option<DateTimeUtc>,
}

/// What started a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum, serde::Serialize)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(16))")]
#[serde(rename_all = "lowercase")]
pub enum Trigger {
    #[sea_orm(string_value = "manual")]
    Manual,
    #[sea_orm(string_value = "schedule")]
    Schedule,
    #[sea_orm(string_value = "replay")]
    Replay,
    /// The object a webhook delivery carried, stored as it arrived.
    #[sea_orm(string_value = "webhook")]
    Webhook,
}

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum, serde::Serialize)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(16))")]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// Still going (or its process died; see `interrupted`).
    #[sea_orm(string_value = "running")]
    Running,
    /// Every page fetched and every record stored.
    #[sea_orm(string_value = "succeeded")]
    Succeeded,
    /// Every page fetched; some records failed and sit in `run_errors`.
    #[sea_orm(string_value = "partial")]
    Partial,
    /// A run-level fault stopped it; the reason is in `sync_runs.error`.
    #[sea_orm(string_value = "failed")]
    Failed,
    /// Stopped by a shutdown or a crash before it finished.
    #[sea_orm(string_value = "interrupted")]
    Interrupted,
    /// Stopped between pages because a request budget was spent; it may resume at
    /// `resume_at`, from its checkpoint. Never a failure.
    #[sea_orm(string_value = "deferred")]
    Deferred,
}

super::display_as_stored!(Trigger, RunStatus);

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
