//! `instances`: every process that syncs announces itself in the database while it runs
//! (host, pid, release, the schema it knows, a heartbeat), so that a migration can tell
//! which instances of an older schema are still writing. A row whose heartbeat is older
//! than [`STALE_AFTER`] belongs to a process that is gone (a crash, a kill), and is swept.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveValue::NotSet, ColumnTrait, DatabaseConnection, DbErr, EntityTrait, IntoActiveModel,
    QueryFilter,
};

use crate::entities::instance;

/// The release this binary is, as `tributary --version` prints it and as it announces
/// itself.
pub const RELEASE: &str = env!("CARGO_PKG_VERSION");

/// How often a running instance refreshes its row.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(15);

/// A row (or a run's heartbeat) older than this belongs to a process that is gone: it
/// missed several heartbeats in a row.
pub const STALE_AFTER: Duration = Duration::from_secs(120);

/// The newest migration this binary knows: the schema version it announces.
pub fn schema_version() -> String {
    use tributary_migrations::{Migrator, MigratorTrait};
    Migrator::migrations()
        .last()
        .map(|migration| migration.name().to_string())
        .unwrap_or_default()
}

/// The moment before which a heartbeat is stale.
pub(crate) fn stale_before(now: DateTime<Utc>) -> DateTime<Utc> {
    chrono::TimeDelta::from_std(STALE_AFTER)
        .ok()
        .and_then(|age| now.checked_sub_signed(age))
        .unwrap_or(now)
}

/// This process's row in `instances`, from [`Instance::announce`] until
/// [`Instance::withdraw`].
#[derive(Clone, Debug)]
pub struct Instance {
    row: instance::Model,
}

impl Instance {
    /// Sweeps the rows of processes that are gone, then writes this process's row.
    /// `holder` is unique to the process (`host:pid:nonce`), `command` what it runs.
    pub async fn announce(
        db: &DatabaseConnection,
        holder: &str,
        host: &str,
        command: &str,
    ) -> Result<Instance, DbErr> {
        sweep(db).await?;
        let now = Utc::now();
        let row = instance::Model {
            id: 0,
            holder: holder.to_string(),
            host: host.to_string(),
            pid: i64::from(std::process::id()),
            command: command.to_string(),
            version: RELEASE.to_string(),
            schema_version: schema_version(),
            started_at: now,
            heartbeat_at: now,
        };
        let inserted = insert(db, &row).await?;
        tracing::debug!(holder, command, "Instance announced.");
        Ok(Instance { row: inserted })
    }

    /// The row as written.
    pub fn row(&self) -> &instance::Model {
        &self.row
    }

    /// Refreshes the row's heartbeat and sweeps the rows of processes that are gone. A
    /// row swept meanwhile (this process was stopped past [`STALE_AFTER`]) is written
    /// again.
    pub async fn heartbeat(&mut self, db: &DatabaseConnection) -> Result<(), DbErr> {
        let now = Utc::now();
        let refreshed = instance::Entity::update_many()
            .col_expr(instance::Column::HeartbeatAt, Expr::value(now))
            .filter(instance::Column::Holder.eq(self.row.holder.as_str()))
            .exec(db)
            .await?
            .rows_affected;
        self.row.heartbeat_at = now;
        if refreshed == 0 {
            self.row = insert(db, &self.row).await?;
        }
        sweep(db).await
    }

    /// Removes the row (at a clean exit).
    pub async fn withdraw(self, db: &DatabaseConnection) -> Result<(), DbErr> {
        instance::Entity::delete_many()
            .filter(instance::Column::Holder.eq(self.row.holder.as_str()))
            .exec(db)
            .await?;
        tracing::debug!(holder = self.row.holder, "Instance withdrawn.");
        Ok(())
    }
}

async fn insert(db: &DatabaseConnection, row: &instance::Model) -> Result<instance::Model, DbErr> {
    let mut active = row.clone().into_active_model();
    active.id = NotSet;
    let inserted = instance::Entity::insert(active).exec(db).await?;
    Ok(instance::Model {
        id: inserted.last_insert_id,
        ..row.clone()
    })
}

/// Deletes the rows whose heartbeat is stale: their processes are gone.
pub async fn sweep(db: &DatabaseConnection) -> Result<(), DbErr> {
    let swept = instance::Entity::delete_many()
        .filter(instance::Column::HeartbeatAt.lt(stale_before(Utc::now())))
        .exec(db)
        .await?
        .rows_affected;
    if swept > 0 {
        tracing::info!(
            swept,
            "Rows of instances that stopped heartbeating were swept."
        );
    }
    Ok(())
}
