//! `records`: the synced records, unique on (user_id, provider, external_id).

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, serde::Serialize)]
#[sea_orm(table_name = "records")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub user_id: String,
    pub provider: String,
    pub external_id: String,
    /// The record's JSON text as the API sent it.
    #[sea_orm(column_type = "Text")]
    pub payload: String,
    /// Hex sha256 of `payload`.
    pub content_hash: String,
    /// The run that inserted the record.
    pub first_seen_run_id: i64,
    /// The last run that fetched this record with new content (an unchanged re-sync
    /// writes nothing: docs/decisions/last-seen.md).
    pub last_seen_run_id: i64,
    pub created_at: DateTimeUtc,
    /// When the record last changed: inserted, rewritten, marked deleted or restored.
    pub updated_at: DateTimeUtc,
    /// When a complete listing no longer returned the record (null while it is live).
    pub deleted_at: Option<DateTimeUtc>,
    /// The run whose complete listing no longer returned it.
    pub deleted_by_run_id: Option<i64>,
    /// The version of the object a webhook delivery last stored (`None`: no delivery
    /// has); a delivery writes only over an older one.
    pub source_version: Option<String>,
}

/// The three-part key, defined once: the pipeline looks records up and resolves insert
/// conflicts on exactly these columns, and the unique index must cover exactly them.
pub const KEY_COLUMNS: [Column; 3] = [Column::UserId, Column::Provider, Column::ExternalId];

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
