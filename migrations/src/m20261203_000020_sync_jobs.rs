//! `sync_jobs`: what should run, one row per job. A schedule slot of a connection is one
//! job whichever instance computes it first: the unique (connection, stream, slot) key
//! makes every other instance's insert of it fail.

use sea_orm_migration::prelude::*;

use crate::m20261129_000001_create_tables::{id, instant, long_text, string};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261203_000020_sync_jobs"
    }
}

#[derive(DeriveIden)]
enum SyncJobs {
    Table,
    Id,
    ConnectionId,
    Stream,
    Kind,
    SlotAt,
    Status,
    Holder,
    CreatedAt,
    StartedAt,
    FinishedAt,
    Outcome,
}

#[derive(DeriveIden)]
enum Connections {
    Table,
    Id,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        use SyncJobs as T;
        let backend = manager.get_database_backend();
        // MySQL's DDL is not transactional: a migration stopped after the table was
        // created but before it was recorded runs again.
        manager
            .create_table(
                Table::create()
                    .table(T::Table)
                    .if_not_exists()
                    .col(id(T::Id))
                    .col(ColumnDef::new(T::ConnectionId).big_integer().not_null())
                    .col(string(T::Stream, 64))
                    .col(string(T::Kind, 16))
                    .col(instant(backend, T::SlotAt).null().to_owned())
                    .col(string(T::Status, 16))
                    .col(ColumnDef::new(T::Holder).string_len(255).null())
                    .col(instant(backend, T::CreatedAt).not_null().to_owned())
                    .col(instant(backend, T::StartedAt).null().to_owned())
                    .col(instant(backend, T::FinishedAt).null().to_owned())
                    .col(long_text(backend, T::Outcome).null().to_owned())
                    .foreign_key(
                        ForeignKey::create()
                            .name("sync_jobs_connection_id_fkey")
                            .from(T::Table, T::ConnectionId)
                            .to(Connections::Table, Connections::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("sync_jobs_slot_key")
                    .table(T::Table)
                    .col(T::ConnectionId)
                    .col(T::Stream)
                    .col(T::SlotAt)
                    .unique()
                    .if_not_exists()
                    .to_owned(),
            )
            .await?;
        // The sweep deletes finished jobs by age.
        manager
            .create_index(
                Index::create()
                    .name("sync_jobs_finished_at_idx")
                    .table(T::Table)
                    .col(T::FinishedAt)
                    .if_not_exists()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(SyncJobs::Table).if_exists().to_owned())
            .await
    }
}
