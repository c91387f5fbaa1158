//! `sync_runs.stamps_from`: the earliest change time a running run can still give a
//! record. The records list reads only below the smallest of its provider's running runs
//! (docs/decisions/records-api.md), so that a page stamped before a reader's position but
//! committed after it is never skipped. A run of an older release leaves it null; the
//! list then takes the run's start, which is earlier still.

use sea_orm_migration::prelude::*;

use crate::m20261129_000001_create_tables::instant;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261204_000080_run_stamps_from"
    }
}

#[derive(DeriveIden)]
enum SyncRuns {
    Table,
    StampsFrom,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        manager
            .alter_table(
                Table::alter()
                    .table(SyncRuns::Table)
                    .add_column(instant(backend, SyncRuns::StampsFrom).null().to_owned())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(SyncRuns::Table)
                    .drop_column(SyncRuns::StampsFrom)
                    .to_owned(),
            )
            .await
    }
}
