//! Deletion detection: `records.deleted_at` and `deleted_by_run_id` (a record a complete
//! listing no longer returned is marked, never removed), `sync_runs.records_deleted` and
//! `records_restored`, and `run_sightings`, the keys a tracked full pass saw, kept out of
//! `records` so that an unchanged re-sync still writes nothing there.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend};

use crate::m20261129_000001_create_tables::{counter, instant, string};
use crate::m20261129_000004_exact_key_collation::{alter, exact_collation, Column};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261202_000004_deletion_tracking"
    }
}

#[derive(DeriveIden)]
enum Records {
    Table,
    DeletedAt,
    DeletedByRunId,
}

#[derive(DeriveIden)]
enum SyncRuns {
    Table,
    RecordsDeleted,
    RecordsRestored,
}

#[derive(DeriveIden)]
enum RunSightings {
    Table,
    RunId,
    ExternalId,
}

/// The sighting's key compares byte for byte on MySQL, as `records.external_id` does.
const SIGHTING_KEY: &[Column] = &[("external_id", 255, false)];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        // One column per statement: SQLite adds one column per ALTER TABLE.
        let new_columns = [
            (
                Records::Table.into_iden(),
                instant(backend, Records::DeletedAt).null().to_owned(),
            ),
            (
                Records::Table.into_iden(),
                ColumnDef::new(Records::DeletedByRunId)
                    .big_integer()
                    .null()
                    .to_owned(),
            ),
            (
                SyncRuns::Table.into_iden(),
                counter(SyncRuns::RecordsDeleted),
            ),
            (
                SyncRuns::Table.into_iden(),
                counter(SyncRuns::RecordsRestored),
            ),
        ];
        for (table, mut column) in new_columns {
            manager
                .alter_table(
                    Table::alter()
                        .table(table)
                        .add_column(&mut column)
                        .to_owned(),
                )
                .await?;
        }
        manager
            .create_table(
                Table::create()
                    .table(RunSightings::Table)
                    .col(ColumnDef::new(RunSightings::RunId).big_integer().not_null())
                    .col(string(RunSightings::ExternalId, 255))
                    .primary_key(
                        Index::create()
                            .col(RunSightings::RunId)
                            .col(RunSightings::ExternalId),
                    )
                    .to_owned(),
            )
            .await?;
        if backend == DbBackend::MySql {
            let collation = exact_collation(manager).await?;
            manager
                .get_connection()
                .execute_unprepared(&alter("run_sightings", SIGHTING_KEY, Some(&collation)))
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(RunSightings::Table)
                    .if_exists()
                    .to_owned(),
            )
            .await?;
        let old_columns = [
            (Records::Table.into_iden(), Records::DeletedAt.into_iden()),
            (
                Records::Table.into_iden(),
                Records::DeletedByRunId.into_iden(),
            ),
            (
                SyncRuns::Table.into_iden(),
                SyncRuns::RecordsDeleted.into_iden(),
            ),
            (
                SyncRuns::Table.into_iden(),
                SyncRuns::RecordsRestored.into_iden(),
            ),
        ];
        for (table, column) in old_columns {
            manager
                .alter_table(Table::alter().table(table).drop_column(column).to_owned())
                .await?;
        }
        Ok(())
    }
}
