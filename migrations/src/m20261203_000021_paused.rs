//! `connections.paused_at`: a connection paused by the operator is left out of its
//! schedule's firings until resumed, whatever config.toml says (it is runtime state, so
//! loading the configured connections keeps it).

use sea_orm_migration::prelude::*;

use crate::m20261129_000001_create_tables::instant;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261203_000021_paused"
    }
}

#[derive(DeriveIden)]
enum Connections {
    Table,
    PausedAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        manager
            .alter_table(
                Table::alter()
                    .table(Connections::Table)
                    .add_column(instant(backend, Connections::PausedAt).null().to_owned())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Connections::Table)
                    .drop_column(Connections::PausedAt)
                    .to_owned(),
            )
            .await
    }
}
