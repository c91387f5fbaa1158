//! `connection_streams.paused_at`: one stream of a connection paused by the operator is
//! left out of its schedule's firings until resumed, while the connection's other streams
//! go on (runtime state, as `connections.paused_at`).

use sea_orm_migration::prelude::*;

use crate::m20261129_000001_create_tables::instant;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261206_000120_stream_paused"
    }
}

#[derive(DeriveIden)]
enum ConnectionStreams {
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
                    .table(ConnectionStreams::Table)
                    .add_column(
                        instant(backend, ConnectionStreams::PausedAt)
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
                    .table(ConnectionStreams::Table)
                    .drop_column(ConnectionStreams::PausedAt)
                    .to_owned(),
            )
            .await
    }
}
