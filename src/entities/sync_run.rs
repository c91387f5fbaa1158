//! `sync_runs`: one row per run of one connection.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, serde::Serialize)]
#[sea_orm(table_name = "sync_runs")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub user_id: String,
    pub provider: String,
    /// `manual`, `schedule` or `replay`.
    pub trigger: String,
    /// `running`, `succeeded`, `partial`, `failed` or `interrupted`.
    pub status: String,
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
    /// The run-level failure, else null.
    #[sea_orm(column_type = "Text", nullable)]
    pub error: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
