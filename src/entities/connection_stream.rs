//! `connection_streams`: one row per (connection, stream), with the stream's sync state.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, serde::Serialize)]
#[sea_orm(table_name = "connection_streams")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub connection_id: i64,
    /// The stream's name (`issues`, `pull_requests`), as config.toml's `streams` names it.
    pub stream: String,
    /// The incremental-sync watermark, advanced only after the records it covers commit.
    #[sea_orm(column_type = "Text", nullable)]
    pub cursor: Option<String>,
    /// The in-progress page position of an unfinished run (JSON), committed with each page.
    #[sea_orm(column_type = "Text", nullable)]
    pub checkpoint: Option<String>,
    /// The last run of the stream that ended `succeeded` or `partial`.
    pub last_success_run_id: Option<i64>,
    pub last_success_at: Option<DateTimeUtc>,
    /// `full_sync_schedule` firings not yet served by a complete full pass of the stream:
    /// while above 0, its runs are full passes.
    pub full_passes_owed: i64,
    /// Since when the operator has paused the stream: its schedule's firings leave it out
    /// (the connection's other streams go on); a `sync` asked for still runs it.
    pub paused_at: Option<DateTimeUtc>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
