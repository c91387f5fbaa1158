//! `change_batches`: the changes one transaction recorded, stamped with its seq as its
//! last statement before it commits: the clock's next seq, or on PostgreSQL the
//! transaction's id plus the clock's offset.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "change_batches")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    /// The batch's place in the feed; null only inside the transaction writing it.
    pub seq: Option<i64>,
    pub run_id: i64,
    /// The connection whose records changed.
    pub user_id: String,
    pub provider: String,
    /// When the batch was stamped, just before its transaction committed.
    pub committed_at: Option<DateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
