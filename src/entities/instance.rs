//! `instances`: one row per process that syncs (the daemon, `sync`), written when it
//! starts, refreshed by its heartbeat and removed when it exits cleanly.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, serde::Serialize)]
#[sea_orm(table_name = "instances")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    /// `host:pid:nonce`, unique per process; its leases' holders start with `host:pid:`.
    #[sea_orm(unique)]
    pub holder: String,
    pub host: String,
    pub pid: i64,
    /// The command the process runs: `daemon`, `sync`, ...
    pub command: String,
    /// The release, as `tributary --version` prints it.
    pub version: String,
    /// The newest migration the binary knows.
    pub schema_version: String,
    pub started_at: DateTimeUtc,
    /// Refreshed while the process runs; a row whose heartbeat is older than
    /// `db::instances::STALE_AFTER` belongs to a process that is gone.
    pub heartbeat_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
