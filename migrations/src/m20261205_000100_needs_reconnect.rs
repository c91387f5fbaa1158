//! `connections.needs_reconnect_since`: set when the provider revoked the connection's
//! authorization (its token endpoint refused the refresh with `invalid_grant`), cleared
//! by a reconnect on the Connect page or a run that succeeds. While set, scheduled jobs
//! end `skipped` without a request to the provider.

use sea_orm_migration::prelude::*;

use crate::m20261129_000001_create_tables::instant;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261205_000100_needs_reconnect"
    }
}

#[derive(DeriveIden)]
enum Connections {
    Table,
    NeedsReconnectSince,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // MySQL's DDL is not transactional: the step may run again after a stop.
        if manager
            .has_column("connections", "needs_reconnect_since")
            .await?
        {
            return Ok(());
        }
        let backend = manager.get_database_backend();
        manager
            .alter_table(
                Table::alter()
                    .table(Connections::Table)
                    .add_column(instant(backend, Connections::NeedsReconnectSince).null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let alter = Table::alter()
            .table(Connections::Table)
            .drop_column(Connections::NeedsReconnectSince)
            .to_owned();
        manager.alter_table(alter).await
    }
}
