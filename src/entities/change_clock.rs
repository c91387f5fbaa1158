//! `change_clock`: one row (`id = 1`), the change feed's clock.

use sea_orm::entity::prelude::*;

/// The id of the clock's one row.
pub const CLOCK_ROW: i64 = 1;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "change_clock")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: i64,
    /// SQLite, MariaDB/MySQL: the seq of the newest committed change batch (0 before the
    /// first). PostgreSQL: the offset added to transaction ids to make seqs, raised only
    /// after a restore into another cluster (`changes::align_clock`).
    pub seq: i64,
    /// The highest seq whose changes the retention sweep may have deleted: a cursor
    /// older than it is expired.
    pub swept_seq: i64,
    /// This database's id, drawn once by the migration that added it and carried in
    /// every cursor the feed issues: a cursor from another database is refused.
    pub database_id: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
