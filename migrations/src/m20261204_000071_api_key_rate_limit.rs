//! `api_keys.rate_limit`: a key's own `[api] rate_limit` (`"N/minute"`), replacing the
//! configured one for that key; null for the configured one.

use sea_orm_migration::prelude::*;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261204_000071_api_key_rate_limit"
    }
}

#[derive(DeriveIden)]
enum ApiKeys {
    Table,
    RateLimit,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(ApiKeys::Table)
                    .add_column(ColumnDef::new(ApiKeys::RateLimit).string_len(64).null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(ApiKeys::Table)
                    .drop_column(ApiKeys::RateLimit)
                    .to_owned(),
            )
            .await
    }
}
