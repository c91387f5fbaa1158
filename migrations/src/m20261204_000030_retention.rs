//! Indexes for the retention sweep and for the history listings on a large history:
//! `runs` filtered by connection or provider (and stream) newest first, open errors
//! oldest first, and each history table's age, which bounds the sweep's walk.

use sea_orm_migration::prelude::*;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261204_000030_retention"
    }
}

/// `(name, table, columns)` of every index this migration creates.
const INDEXES: &[(&str, &str, &[&str])] = &[
    // `runs --user --provider`, newest first: without it PostgreSQL walks the whole
    // primary key backwards for a connection with few runs.
    (
        "sync_runs_user_provider_id",
        "sync_runs",
        &["user_id", "provider", "id"],
    ),
    // `runs --user --provider --stream`, and the sweep's "a later run of the same
    // connection and stream exists".
    (
        "sync_runs_user_provider_stream_id",
        "sync_runs",
        &["user_id", "provider", "stream", "id"],
    ),
    // `runs --provider [--stream]`.
    (
        "sync_runs_provider_stream_id",
        "sync_runs",
        &["provider", "stream", "id"],
    ),
    // The sweep's first run young enough to keep.
    ("sync_runs_started_at", "sync_runs", &["started_at"]),
    // `errors` (open ones, oldest first) and the sweep's "a replay resolved a kept error".
    (
        "run_errors_resolved_by_run_id_id",
        "run_errors",
        &["resolved_by_run_id", "id"],
    ),
    // The sweep's first error young enough to keep.
    ("run_errors_created_at", "run_errors", &["created_at"]),
    // The sweep's first delivery young enough to keep.
    (
        "notification_deliveries_created_at",
        "notification_deliveries",
        &["created_at"],
    ),
];

/// The indexes those take over: nothing filters runs by start time within a connection,
/// and PostgreSQL, its statistics stale after a bulk load, may pick that index to find a
/// connection's newest run and sort all its runs for it.
const REPLACED: &[(&str, &str, &[&str])] = &[
    (
        "run_errors_resolved_by_run_id",
        "run_errors",
        &["resolved_by_run_id"],
    ),
    (
        "sync_runs_user_provider_started",
        "sync_runs",
        &["user_id", "provider", "started_at"],
    ),
];

fn create(name: &str, table: &str, columns: &[&str]) -> IndexCreateStatement {
    let mut index = Index::create();
    index.name(name).table(Alias::new(table)).if_not_exists();
    for column in columns {
        index.col(Alias::new(*column));
    }
    index.to_owned()
}

async fn drop_if_exists(manager: &SchemaManager<'_>, name: &str, table: &str) -> Result<(), DbErr> {
    if manager.has_index(table, name).await? {
        manager
            .drop_index(Index::drop().name(name).table(Alias::new(table)).to_owned())
            .await?;
    }
    Ok(())
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // MySQL's DDL is not transactional: every step can run again after a stop.
        for (name, table, columns) in INDEXES {
            if !manager.has_index(table, name).await? {
                manager.create_index(create(name, table, columns)).await?;
            }
        }
        for (name, table, _) in REPLACED {
            drop_if_exists(manager, name, table).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for (name, table, columns) in REPLACED {
            if !manager.has_index(table, name).await? {
                manager.create_index(create(name, table, columns)).await?;
            }
        }
        for (name, table, _) in INDEXES {
            drop_if_exists(manager, name, table).await?;
        }
        Ok(())
    }
}
