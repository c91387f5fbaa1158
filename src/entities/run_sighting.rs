//! `run_sightings`: the keys a run that tracks deletions saw in its full pass. The run's
//! closing transaction marks the connection's records without one deleted, then removes
//! them; they never live longer than the run (and the next run of the connection removes
//! a killed run's).

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "run_sightings")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub run_id: i64,
    #[sea_orm(primary_key, auto_increment = false)]
    pub external_id: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
