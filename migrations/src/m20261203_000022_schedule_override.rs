//! `connections.schedule`: a connection's own cron expression, set by the operator, which
//! replaces its provider's `schedule` (runtime state, kept when config.toml's connections
//! are loaded).

use sea_orm_migration::prelude::*;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261203_000022_schedule_override"
    }
}

#[derive(DeriveIden)]
enum Connections {
    Table,
    Schedule,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Connections::Table)
                    .add_column(ColumnDef::new(Connections::Schedule).string_len(128).null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Connections::Table)
                    .drop_column(Connections::Schedule)
                    .to_owned(),
            )
            .await
    }
}
