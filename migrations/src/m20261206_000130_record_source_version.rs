//! `records.source_version`: the version of the object a webhook delivery stored (the
//! provider's own `updated_at`, or a Stripe event's `created` and the object's state),
//! written only over an older one, so that deliveries arriving out of order or twice
//! never put older data over newer (docs/decisions/webhook-versions.md).

use sea_orm_migration::prelude::*;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261206_000130_record_source_version"
    }
}

#[derive(DeriveIden)]
enum Records {
    Table,
    SourceVersion,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // MySQL's DDL is not transactional: the step may run again after a stop.
        if manager.has_column("records", "source_version").await? {
            return Ok(());
        }
        manager
            .alter_table(
                Table::alter()
                    .table(Records::Table)
                    .add_column(ColumnDef::new(Records::SourceVersion).string_len(64).null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let alter = Table::alter()
            .table(Records::Table)
            .drop_column(Records::SourceVersion)
            .to_owned();
        manager.alter_table(alter).await
    }
}
