//! `feed_readers`: one row per reader of the change feed, an API key that reads
//! `/v1/changes`: the furthest position a read returned to it and when it last read
//! (docs/decisions/feed-readers.md).

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "feed_readers")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    /// Who reads: `key:ID` for an API key.
    #[sea_orm(unique)]
    pub reader: String,
    /// The `api_keys.id` of the key, for its name and prefix.
    pub key_id: Option<i64>,
    /// The position (`next_cursor`) a read returned to it: never moves back.
    pub seq: i64,
    pub ordinal: i64,
    /// When it last read, to within a minute.
    pub read_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
