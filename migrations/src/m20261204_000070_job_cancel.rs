//! `sync_jobs.cancel_requested_at`: a running job asked to stop. The instance running it
//! reads the column (its worker polls its own running jobs) and stops the run between
//! pages, so a cancel reaches whichever instance holds the job; nothing is held in memory.

use sea_orm_migration::prelude::*;

use crate::m20261129_000001_create_tables::instant;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261204_000070_job_cancel"
    }
}

#[derive(DeriveIden)]
enum SyncJobs {
    Table,
    CancelRequestedAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        manager
            .alter_table(
                Table::alter()
                    .table(SyncJobs::Table)
                    .add_column(
                        instant(backend, SyncJobs::CancelRequestedAt)
                            .null()
                            .to_owned(),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(SyncJobs::Table)
                    .drop_column(SyncJobs::CancelRequestedAt)
                    .to_owned(),
            )
            .await
    }
}
