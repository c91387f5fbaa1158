//! Where a connection was defined: `config` (config.toml lists it), `cli`
//! (`tributary connections add`), or `removed` (config.toml listed it and no longer does:
//! disabled, its credentials dropped). Rows from before this migration count as `cli`
//! until config.toml lists them again, so none is disabled by the upgrade itself.

use sea_orm_migration::prelude::*;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261201_000003_connection_origin"
    }
}

#[derive(DeriveIden)]
enum Connections {
    Table,
    DefinedIn,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Connections::Table)
                    .add_column(
                        ColumnDef::new(Connections::DefinedIn)
                            .string_len(16)
                            .not_null()
                            .default("cli"),
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
                    .drop_column(Connections::DefinedIn)
                    .to_owned(),
            )
            .await
    }
}
