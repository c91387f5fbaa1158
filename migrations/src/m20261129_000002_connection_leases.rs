//! Leases on connections: which process runs a connection now, and until when.

use sea_orm_migration::prelude::*;

use crate::m20261129_000001_create_tables::instant;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261129_000002_connection_leases"
    }
}

#[derive(DeriveIden)]
enum Connections {
    Table,
    LeaseHolder,
    LeaseExpiresAt,
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
                        ColumnDef::new(Connections::LeaseHolder)
                            .string_len(255)
                            .null(),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Connections::Table)
                    .add_column(
                        instant(manager.get_database_backend(), Connections::LeaseExpiresAt).null(),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in [Connections::LeaseExpiresAt, Connections::LeaseHolder] {
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
