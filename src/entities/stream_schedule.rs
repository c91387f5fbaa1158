//! `stream_schedules`: a stream of a connection on a schedule of its own (a cron
//! expression with seconds), replacing its connection's or provider's for that stream.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, serde::Serialize)]
#[sea_orm(table_name = "stream_schedules")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub connection_id: i64,
    pub stream: String,
    pub schedule: String,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
