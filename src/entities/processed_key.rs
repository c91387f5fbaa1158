//! `processed_keys`: the keys an append-only provider has written, kept for its retention.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, serde::Serialize)]
#[sea_orm(table_name = "processed_keys")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub user_id: String,
    pub provider: String,
    pub external_id: String,
    /// When the key was (last) written.
    pub processed_at: DateTimeUtc,
    /// When the key may be forgotten (processed_at + the provider's retention).
    pub expires_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
