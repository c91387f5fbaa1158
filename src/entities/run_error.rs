//! `run_errors`: the per-run error report, one row per failed record or page.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, serde::Serialize)]
#[sea_orm(table_name = "run_errors")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub run_id: i64,
    pub user_id: String,
    pub provider: String,
    /// Null when the record had no usable id.
    pub external_id: Option<String>,
    /// `fetch`, `parse`, `validate` or `persist`.
    pub stage: String,
    #[sea_orm(column_type = "Text")]
    pub message: String,
    /// The raw record (or page body) as received, so it can be replayed.
    #[sea_orm(column_type = "Text")]
    pub payload: String,
    pub created_at: DateTimeUtc,
    /// The replay run in which this record went through; null while the error is open.
    pub resolved_by_run_id: Option<i64>,
    /// `record` (one record, replayable) or `page` (a page body that could not be read:
    /// re-run the sync instead).
    pub scope: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
