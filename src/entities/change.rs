//! `changes`: one row per record a batch inserted, updated, deleted or restored.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "changes")]
pub struct Model {
    /// The batch (`change_batches.id`), which names the run, the user and the provider.
    #[sea_orm(primary_key, auto_increment = false)]
    pub batch_id: i64,
    /// The change's place within its batch (unique in it, not necessarily dense).
    #[sea_orm(primary_key, auto_increment = false)]
    pub ordinal: i32,
    pub external_id: String,
    pub kind: ChangeKind,
}

/// What happened to a record.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    EnumIter,
    DeriveActiveEnum,
    serde::Serialize,
)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(16))")]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    /// A new key.
    #[sea_orm(string_value = "inserted")]
    Inserted,
    /// New content for a stored key.
    #[sea_orm(string_value = "updated")]
    Updated,
    /// A complete listing no longer returned it.
    #[sea_orm(string_value = "deleted")]
    Deleted,
    /// A deleted record came back.
    #[sea_orm(string_value = "restored")]
    Restored,
}

super::display_as_stored!(ChangeKind);

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
