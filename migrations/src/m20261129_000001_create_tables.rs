//! The first schema: connections, records, sync_runs and run_errors.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

use crate::RECORDS_KEY_INDEX;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261129_000001_create_tables"
    }
}

#[derive(DeriveIden)]
enum Connections {
    Table,
    Id,
    UserId,
    Provider,
    Enabled,
    Credentials,
    Cursor,
    Checkpoint,
    LastSuccessRunId,
    LastSuccessAt,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum Records {
    Table,
    Id,
    UserId,
    Provider,
    ExternalId,
    Payload,
    ContentHash,
    FirstSeenRunId,
    LastSeenRunId,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum SyncRuns {
    Table,
    Id,
    UserId,
    Provider,
    Trigger,
    Status,
    StartedAt,
    FinishedAt,
    HeartbeatAt,
    PagesFetched,
    RecordsFetched,
    RecordsInserted,
    RecordsUpdated,
    RecordsUnchanged,
    RecordsDuplicate,
    RecordsFailed,
    Error,
}

#[derive(DeriveIden)]
enum RunErrors {
    Table,
    Id,
    RunId,
    UserId,
    Provider,
    ExternalId,
    Stage,
    Message,
    Payload,
    CreatedAt,
}

/// Lengths shared by every table, so MySQL's index limit (3072 bytes) holds for the key.
const USER_ID_LEN: u32 = 255;
const PROVIDER_LEN: u32 = 64;
const EXTERNAL_ID_LEN: u32 = 255;

pub(crate) fn id(column: impl IntoIden) -> ColumnDef {
    ColumnDef::new(column)
        .big_integer()
        .not_null()
        .auto_increment()
        .primary_key()
        .take()
}

pub(crate) fn string(column: impl IntoIden, len: u32) -> ColumnDef {
    ColumnDef::new(column).string_len(len).not_null().take()
}

/// A UTC instant. MySQL gets DATETIME(6): its TIMESTAMP stops in 2038 and keeps whole
/// seconds only.
pub(crate) fn instant(backend: DbBackend, column: impl IntoIden) -> ColumnDef {
    let mut def = ColumnDef::new(column);
    match backend {
        DbBackend::MySql => def.custom(Alias::new("DATETIME(6)")),
        _ => def.timestamp_with_time_zone(),
    };
    def
}

fn timestamp(backend: DbBackend, column: impl IntoIden) -> ColumnDef {
    instant(backend, column).not_null().take()
}

pub(crate) fn counter(column: impl IntoIden) -> ColumnDef {
    ColumnDef::new(column)
        .big_integer()
        .not_null()
        .default(0)
        .take()
}

/// Unbounded text: TEXT on SQLite and PostgreSQL, LONGTEXT on MySQL (whose TEXT stops at 64 KiB).
pub(crate) fn long_text(backend: DbBackend, column: impl IntoIden) -> ColumnDef {
    let mut def = ColumnDef::new(column);
    match backend {
        DbBackend::MySql => def.custom(Alias::new("LONGTEXT")),
        _ => def.text(),
    };
    def
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();

        manager
            .create_table(
                Table::create()
                    .table(Connections::Table)
                    .col(id(Connections::Id))
                    .col(string(Connections::UserId, USER_ID_LEN))
                    .col(string(Connections::Provider, PROVIDER_LEN))
                    .col(ColumnDef::new(Connections::Enabled).boolean().not_null())
                    .col(long_text(backend, Connections::Credentials).not_null())
                    .col(long_text(backend, Connections::Cursor).null())
                    .col(long_text(backend, Connections::Checkpoint).null())
                    .col(
                        ColumnDef::new(Connections::LastSuccessRunId)
                            .big_integer()
                            .null(),
                    )
                    .col(instant(backend, Connections::LastSuccessAt).null())
                    .col(timestamp(backend, Connections::CreatedAt))
                    .col(timestamp(backend, Connections::UpdatedAt))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("connections_user_provider_key")
                    .table(Connections::Table)
                    .col(Connections::UserId)
                    .col(Connections::Provider)
                    .unique()
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(SyncRuns::Table)
                    .col(id(SyncRuns::Id))
                    .col(string(SyncRuns::UserId, USER_ID_LEN))
                    .col(string(SyncRuns::Provider, PROVIDER_LEN))
                    .col(string(SyncRuns::Trigger, 16))
                    .col(string(SyncRuns::Status, 16))
                    .col(timestamp(backend, SyncRuns::StartedAt))
                    .col(instant(backend, SyncRuns::FinishedAt).null())
                    .col(timestamp(backend, SyncRuns::HeartbeatAt))
                    .col(counter(SyncRuns::PagesFetched))
                    .col(counter(SyncRuns::RecordsFetched))
                    .col(counter(SyncRuns::RecordsInserted))
                    .col(counter(SyncRuns::RecordsUpdated))
                    .col(counter(SyncRuns::RecordsUnchanged))
                    .col(counter(SyncRuns::RecordsDuplicate))
                    .col(counter(SyncRuns::RecordsFailed))
                    .col(long_text(backend, SyncRuns::Error).null())
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("sync_runs_user_provider_started")
                    .table(SyncRuns::Table)
                    .col(SyncRuns::UserId)
                    .col(SyncRuns::Provider)
                    .col(SyncRuns::StartedAt)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("sync_runs_status")
                    .table(SyncRuns::Table)
                    .col(SyncRuns::Status)
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(Records::Table)
                    .col(id(Records::Id))
                    .col(string(Records::UserId, USER_ID_LEN))
                    .col(string(Records::Provider, PROVIDER_LEN))
                    .col(string(Records::ExternalId, EXTERNAL_ID_LEN))
                    .col(long_text(backend, Records::Payload).not_null())
                    .col(string(Records::ContentHash, 64))
                    .col(
                        ColumnDef::new(Records::FirstSeenRunId)
                            .big_integer()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(Records::LastSeenRunId)
                            .big_integer()
                            .not_null(),
                    )
                    .col(timestamp(backend, Records::CreatedAt))
                    .col(timestamp(backend, Records::UpdatedAt))
                    .to_owned(),
            )
            .await?;
        // The backstop of the three-part key: exactly these columns, in this order.
        manager
            .create_index(
                Index::create()
                    .name(RECORDS_KEY_INDEX)
                    .table(Records::Table)
                    .col(Records::UserId)
                    .col(Records::Provider)
                    .col(Records::ExternalId)
                    .unique()
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(RunErrors::Table)
                    .col(id(RunErrors::Id))
                    .col(ColumnDef::new(RunErrors::RunId).big_integer().not_null())
                    .col(string(RunErrors::UserId, USER_ID_LEN))
                    .col(string(RunErrors::Provider, PROVIDER_LEN))
                    .col(
                        ColumnDef::new(RunErrors::ExternalId)
                            .string_len(EXTERNAL_ID_LEN)
                            .null(),
                    )
                    .col(string(RunErrors::Stage, 16))
                    .col(long_text(backend, RunErrors::Message).not_null())
                    .col(long_text(backend, RunErrors::Payload).not_null())
                    .col(timestamp(backend, RunErrors::CreatedAt))
                    .foreign_key(
                        ForeignKey::create()
                            .name("run_errors_run_id_fkey")
                            .from(RunErrors::Table, RunErrors::RunId)
                            .to(SyncRuns::Table, SyncRuns::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("run_errors_run_id")
                    .table(RunErrors::Table)
                    .col(RunErrors::RunId)
                    .to_owned(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            RunErrors::Table.into_iden(),
            Records::Table.into_iden(),
            SyncRuns::Table.into_iden(),
            Connections::Table.into_iden(),
        ] {
            manager
                .drop_table(Table::drop().table(table).if_exists().to_owned())
                .await?;
        }
        Ok(())
    }
}
