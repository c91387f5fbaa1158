//! `api_audit`: one row per write request made through the HTTP API.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "api_audit")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    /// The key that made it; `None` when the request named no known key.
    pub key_id: Option<i64>,
    pub method: String,
    /// The path, without the query string.
    pub path: String,
    /// The answer's HTTP status.
    pub status: i32,
    pub at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
