//! `rate_budgets`: the requests taken from one window of one budget, by every instance.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, serde::Serialize)]
#[sea_orm(table_name = "rate_budgets")]
pub struct Model {
    /// Whose budget: `provider:NAME` (the application's) or `connection:ID` (a token's).
    #[sea_orm(primary_key, auto_increment = false)]
    pub scope: String,
    /// The window's length in seconds.
    #[sea_orm(primary_key, auto_increment = false)]
    pub period_seconds: i64,
    /// The window's start, in seconds since the Unix epoch (a multiple of its length).
    #[sea_orm(primary_key, auto_increment = false)]
    pub window_start: i64,
    /// The window's end, in seconds since the Unix epoch; rows past it are swept.
    pub window_end: i64,
    /// Requests taken in the window, or as many as the API said were used.
    pub used: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
