//! `instances`: every process that syncs announces itself in the database while it runs
//! (host, pid, release, the schema it knows, a heartbeat), so that a migration can tell
//! which instances of an older schema are still writing. A row whose heartbeat is older
//! than [`STALE_AFTER`] belongs to a process that is gone (a crash, a kill), and is swept.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveValue::NotSet, ColumnTrait, DatabaseConnection, DbErr, EntityTrait, IntoActiveModel,
    QueryFilter, QuerySelect,
};

use crate::entities::sync_run::RunStatus;
use crate::entities::{connection, instance, sync_run};

use super::schema::SchemaState;

/// The migrations that made the tables and columns [`alive_under_older_schema`] reads.
const TABLES_MIGRATION: &str = "m20261129_000001_create_tables";
const LEASES_MIGRATION: &str = "m20261129_000002_connection_leases";

/// A connection's user, provider, lease holder and lease expiry.
type LeaseColumns = (String, String, Option<String>, Option<DateTime<Utc>>);

/// How many live instances a refusal names; the rest are counted.
const NAMED_AT_MOST: usize = 10;

/// The release this binary is, as `tributary --version` prints it and as it announces
/// itself: the version and, when built from a git checkout, the commit (`build.rs`).
pub const RELEASE: &str = env!("TRIBUTARY_RELEASE");

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
        let now = super::clock::now();
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

    /// Refreshes the row's heartbeat and sweeps the rows of processes that are gone. A
    /// row swept meanwhile (this process was stopped past [`STALE_AFTER`]) is written
    /// again.
    pub async fn heartbeat(&mut self, db: &DatabaseConnection) -> Result<(), DbErr> {
        let now = super::clock::now();
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
        .filter(instance::Column::HeartbeatAt.lt(stale_before(super::clock::now())))
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

/// The signs of instances alive under a schema older than this binary's, each described
/// for an operator: rows in `instances` with a recent heartbeat and another schema, and,
/// since releases before `instances` do not announce themselves, unexpired leases and
/// `running` runs with a recent heartbeat. Reads only the tables and columns that exist.
pub(crate) async fn alive_under_older_schema(
    db: &DatabaseConnection,
    schema: &SchemaState,
) -> Result<Vec<String>, DbErr> {
    let now = super::clock::now();
    let fresh = stale_before(now);
    let ours = schema_version();
    let mut alive = Vec::new();
    // `host:pid:` of every announced live process: the leases they hold are theirs.
    let mut announced = Vec::new();
    // The table, not its migration's record: a migration stopped before it was recorded
    // left a table instances may already announce themselves in.
    if tributary_migrations::has_table(db, "instances").await? {
        let rows = instance::Entity::find()
            .filter(instance::Column::HeartbeatAt.gte(fresh))
            .all(db)
            .await?;
        for row in rows {
            announced.push(format!("{}:{}:", row.host, row.pid));
            if row.schema_version != ours {
                alive.push(format!(
                    "`{}` on {} (pid {}, tributary {}, schema {}), last heartbeat {}",
                    row.command,
                    row.host,
                    row.pid,
                    row.version,
                    row.schema_version,
                    row.heartbeat_at.to_rfc3339()
                ));
            }
        }
    }
    let unannounced = "an instance that does not announce itself (a release before instances)";
    if schema.has(LEASES_MIGRATION) {
        let leases: Vec<LeaseColumns> = connection::Entity::find()
            .select_only()
            .columns([
                connection::Column::UserId,
                connection::Column::Provider,
                connection::Column::LeaseHolder,
                connection::Column::LeaseExpiresAt,
            ])
            .filter(connection::Column::LeaseHolder.is_not_null())
            .filter(connection::Column::LeaseExpiresAt.gt(now))
            .into_tuple()
            .all(db)
            .await?;
        for (user_id, provider, holder, until) in leases {
            let holder = holder.unwrap_or_default();
            if announced.iter().any(|prefix| holder.starts_with(prefix)) {
                continue;
            }
            alive.push(format!(
                "the lease on {user_id}@{provider} held by {holder} until {} ({unannounced})",
                until.map(|until| until.to_rfc3339()).unwrap_or_default()
            ));
        }
    }
    if schema.has(TABLES_MIGRATION) {
        let runs: Vec<(i64, String, String, DateTime<Utc>)> = sync_run::Entity::find()
            .select_only()
            .columns([
                sync_run::Column::Id,
                sync_run::Column::UserId,
                sync_run::Column::Provider,
                sync_run::Column::HeartbeatAt,
            ])
            .filter(sync_run::Column::Status.eq(RunStatus::Running))
            .filter(sync_run::Column::HeartbeatAt.gte(fresh))
            .into_tuple()
            .all(db)
            .await?;
        for (id, user_id, provider, heartbeat) in runs {
            alive.push(format!(
                "run {id} of {user_id}@{provider}, running, last heartbeat {} ({unannounced})",
                heartbeat.to_rfc3339()
            ));
        }
    }
    if alive.len() > NAMED_AT_MOST {
        let more = alive.len() - NAMED_AT_MOST;
        alive.truncate(NAMED_AT_MOST);
        alive.push(format!("{more} more"));
    }
    Ok(alive)
}

#[cfg(test)]
mod tests {
    use sea_orm::{ActiveValue::NotSet, EntityTrait, Set};

    use super::*;
    use crate::testing::TestDb;

    async fn rows(db: &DatabaseConnection) -> Vec<instance::Model> {
        instance::Entity::find().all(db).await.expect("instances")
    }

    /// A heartbeat writes its row again when a sweep took it, and sweeps the rows whose
    /// heartbeat is stale; the instance's withdrawal removes its own.
    #[tokio::test]
    async fn a_heartbeat_writes_a_swept_row_again_and_sweeps_the_stale_ones() {
        let test = TestDb::new().await;
        let db = test.main();
        let mut instance = Instance::announce(db, "here:1:cafe", "here", "sync")
            .await
            .expect("announced");
        instance::Entity::delete_many()
            .exec(db)
            .await
            .expect("rows swept");
        let heartbeat = Utc::now() - chrono::TimeDelta::hours(1);
        instance::Entity::insert(instance::ActiveModel {
            id: NotSet,
            holder: Set("gone:2:dead".to_string()),
            host: Set("old-host".to_string()),
            pid: Set(4242),
            command: Set("daemon".to_string()),
            version: Set("0.0.9 (old)".to_string()),
            schema_version: Set("m0".to_string()),
            started_at: Set(heartbeat),
            heartbeat_at: Set(heartbeat),
        })
        .exec(db)
        .await
        .expect("a stale row");

        instance.heartbeat(db).await.expect("heartbeat");
        let found = rows(db).await;
        assert_eq!(
            found
                .iter()
                .map(|row| row.holder.as_str())
                .collect::<Vec<_>>(),
            vec!["here:1:cafe"],
            "{found:?}"
        );
        assert!(found[0].heartbeat_at > found[0].started_at, "{found:?}");

        instance.withdraw(db).await.expect("withdrawn");
        assert_eq!(rows(db).await, vec![]);
    }
}
