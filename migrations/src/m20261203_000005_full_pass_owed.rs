//! `connection_streams.full_passes_owed`: the `full_sync_schedule` firings a stream has not
//! yet had a complete full pass for, so a full pass falling due while the connection is
//! busy stays owed, across restarts and instances.

use sea_orm_migration::prelude::*;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261203_000005_full_pass_owed"
    }
}

#[derive(DeriveIden)]
enum ConnectionStreams {
    Table,
    FullPassesOwed,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(ConnectionStreams::Table)
                    .add_column(
                        ColumnDef::new(ConnectionStreams::FullPassesOwed)
                            .big_integer()
                            .not_null()
                            .default(0),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(ConnectionStreams::Table)
                    .drop_column(ConnectionStreams::FullPassesOwed)
                    .to_owned(),
            )
            .await
    }
}
