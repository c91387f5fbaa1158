//! The index the records list reads in: one stream's records (`provider` holds its
//! namespace) in the order they last changed, `(updated_at, id)`, so that each page starts
//! where the last ended instead of scanning or sorting the stream.

use sea_orm_migration::prelude::*;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261204_000061_records_changed_order"
    }
}

const INDEX: &str = "records_provider_updated_at_id";

#[derive(DeriveIden)]
enum Records {
    Table,
    Provider,
    UpdatedAt,
    Id,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // MySQL's DDL is not transactional: the step may run again after a stop.
        if manager.has_index("records", INDEX).await? {
            return Ok(());
        }
        manager
            .create_index(
                Index::create()
                    .name(INDEX)
                    .table(Records::Table)
                    .col(Records::Provider)
                    .col(Records::UpdatedAt)
                    .col(Records::Id)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.has_index("records", INDEX).await? {
            manager
                .drop_index(Index::drop().name(INDEX).table(Records::Table).to_owned())
                .await?;
        }
        Ok(())
    }
}
