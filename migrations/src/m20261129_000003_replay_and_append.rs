//! Replays and append-only streams: `run_errors.resolved_by_run_id` and `scope`, and the
//! `processed_keys` table.

use sea_orm_migration::prelude::*;

use crate::m20261129_000001_create_tables::instant;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261129_000003_replay_and_append"
    }
}

#[derive(DeriveIden)]
enum RunErrors {
    Table,
    ResolvedByRunId,
    Scope,
}

#[derive(DeriveIden)]
enum ProcessedKeys {
    Table,
    Id,
    UserId,
    Provider,
    ExternalId,
    ProcessedAt,
    ExpiresAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        // SQLite takes one column per ALTER TABLE.
        manager
            .alter_table(
                Table::alter()
                    .table(RunErrors::Table)
                    .add_column(
                        ColumnDef::new(RunErrors::ResolvedByRunId)
                            .big_integer()
                            .null(),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(RunErrors::Table)
                    .add_column(
                        ColumnDef::new(RunErrors::Scope)
                            .string_len(8)
                            .not_null()
                            .default("record"),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("run_errors_resolved_by_run_id")
                    .table(RunErrors::Table)
                    .col(RunErrors::ResolvedByRunId)
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(ProcessedKeys::Table)
                    .col(
                        ColumnDef::new(ProcessedKeys::Id)
                            .big_integer()
                            .not_null()
                            .auto_increment()
                            .primary_key(),
                    )
                    .col(
                        ColumnDef::new(ProcessedKeys::UserId)
                            .string_len(255)
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(ProcessedKeys::Provider)
                            .string_len(64)
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(ProcessedKeys::ExternalId)
                            .string_len(255)
                            .not_null(),
                    )
                    .col(instant(backend, ProcessedKeys::ProcessedAt).not_null())
                    .col(instant(backend, ProcessedKeys::ExpiresAt).not_null())
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("processed_keys_user_provider_external_id_key")
                    .table(ProcessedKeys::Table)
                    .col(ProcessedKeys::UserId)
                    .col(ProcessedKeys::Provider)
                    .col(ProcessedKeys::ExternalId)
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("processed_keys_expires_at")
                    .table(ProcessedKeys::Table)
                    .col(ProcessedKeys::ExpiresAt)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(ProcessedKeys::Table)
                    .if_exists()
                    .to_owned(),
            )
            .await?;
        manager
            .drop_index(
                Index::drop()
                    .name("run_errors_resolved_by_run_id")
                    .table(RunErrors::Table)
                    .to_owned(),
            )
            .await?;
        for column in [RunErrors::Scope, RunErrors::ResolvedByRunId] {
            manager
                .alter_table(
                    Table::alter()
                        .table(RunErrors::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
