//! `instances`: every process that syncs announces itself here while it runs, so that a
//! migration can see which instances of an older schema are still writing.

use sea_orm_migration::prelude::*;

use crate::m20261129_000001_create_tables::{id, instant, string};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261203_000010_instances"
    }
}

#[derive(DeriveIden)]
enum Instances {
    Table,
    Id,
    Holder,
    Host,
    Pid,
    Command,
    Version,
    SchemaVersion,
    StartedAt,
    HeartbeatAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        use Instances as T;
        let backend = manager.get_database_backend();
        // MySQL's DDL is not transactional: a migration stopped after the table was
        // created but before it was recorded runs again.
        manager
            .create_table(
                Table::create()
                    .table(T::Table)
                    .if_not_exists()
                    .col(id(T::Id))
                    .col(string(T::Holder, 255).unique_key())
                    .col(string(T::Host, 255))
                    .col(ColumnDef::new(T::Pid).big_integer().not_null())
                    .col(string(T::Command, 32))
                    .col(string(T::Version, 128))
                    .col(string(T::SchemaVersion, 128))
                    .col(instant(backend, T::StartedAt).not_null())
                    .col(instant(backend, T::HeartbeatAt).not_null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Instances::Table).if_exists().to_owned())
            .await
    }
}
