//! Lease generations: a number every claim of a connection's lease increases, so that a
//! run's writes can be fenced by the claim they were made under (holder and generation),
//! and a process that stalled past its lease's expiry writes nothing once another took it.

use sea_orm_migration::prelude::*;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261203_000003_lease_generation"
    }
}

#[derive(DeriveIden)]
enum Connections {
    Table,
    LeaseGeneration,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Connections::Table)
                    .add_column(
                        ColumnDef::new(Connections::LeaseGeneration)
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
                    .table(Connections::Table)
                    .drop_column(Connections::LeaseGeneration)
                    .to_owned(),
            )
            .await
    }
}
