//! Refresh claims on connections: which process is spending the connection's OAuth refresh
//! token now, and until when, so refreshes take turns without a transaction held across
//! the token endpoint's answer.

use sea_orm_migration::prelude::*;

use crate::m20261129_000001_create_tables::instant;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261201_000002_refresh_claims"
    }
}

#[derive(DeriveIden)]
enum Connections {
    Table,
    RefreshHolder,
    RefreshClaimedUntil,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // SQLite takes one column per ALTER TABLE.
        manager
            .alter_table(
                Table::alter()
                    .table(Connections::Table)
                    .add_column(
                        ColumnDef::new(Connections::RefreshHolder)
                            .string_len(255)
                            .null(),
                    )
                    .to_owned(),
            )
            .await?;
        let backend = manager.get_database_backend();
        manager
            .alter_table(
                Table::alter()
                    .table(Connections::Table)
                    .add_column(instant(backend, Connections::RefreshClaimedUntil).null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in [Connections::RefreshClaimedUntil, Connections::RefreshHolder] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Connections::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
