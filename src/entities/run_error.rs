//! `run_errors`: the per-run error report, one row per failed record or page.

use sea_orm::entity::prelude::*;
use tributary_providers::RecordStage;

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
    pub stage: Stage,
    #[sea_orm(column_type = "Text")]
    pub message: String,
    /// The raw record (or page body) as received, so it can be replayed.
    #[sea_orm(column_type = "Text")]
    pub payload: String,
    pub created_at: DateTimeUtc,
    /// The replay run in which this record went through; null while the error is open.
    pub resolved_by_run_id: Option<i64>,
    pub scope: Scope,
}

/// Where a record (or page) failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum, serde::Serialize)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(16))")]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    #[sea_orm(string_value = "fetch")]
    Fetch,
    #[sea_orm(string_value = "parse")]
    Parse,
    #[sea_orm(string_value = "validate")]
    Validate,
    #[sea_orm(string_value = "persist")]
    Persist,
}

impl From<RecordStage> for Stage {
    fn from(stage: RecordStage) -> Stage {
        match stage {
            RecordStage::Fetch => Stage::Fetch,
            RecordStage::Parse => Stage::Parse,
            RecordStage::Validate => Stage::Validate,
            RecordStage::Persist => Stage::Persist,
        }
    }
}

/// What a row holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum, serde::Serialize)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(8))")]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// One record: replayable from its payload.
    #[sea_orm(string_value = "record")]
    Record,
    /// A page body that could not be read as records: fetch the page again instead.
    #[sea_orm(string_value = "page")]
    Page,
}

super::display_as_stored!(Stage, Scope);

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
