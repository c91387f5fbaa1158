//! `webhook_deliveries`' routing: the provider-side accounts a delivery names (read at
//! receipt, where the headers are still at hand: Shopify names its shop only there), and
//! the connection and job its processing chose (docs/decisions/inbound-webhooks.md).

use sea_orm_migration::prelude::*;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261205_000110_webhook_routing"
    }
}

#[derive(DeriveIden)]
enum WebhookDeliveries {
    Table,
    AccountIds,
    ConnectionId,
    JobId,
}

const TABLE: &str = "webhook_deliveries";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // MySQL's DDL is not transactional: every step may run again after a stop.
        let columns = [
            (
                "account_ids",
                ColumnDef::new(WebhookDeliveries::AccountIds)
                    .string_len(255)
                    .null()
                    .to_owned(),
            ),
            (
                "connection_id",
                ColumnDef::new(WebhookDeliveries::ConnectionId)
                    .big_integer()
                    .null()
                    .to_owned(),
            ),
            (
                "job_id",
                ColumnDef::new(WebhookDeliveries::JobId)
                    .big_integer()
                    .null()
                    .to_owned(),
            ),
        ];
        for (name, column) in columns {
            if !manager.has_column(TABLE, name).await? {
                let alter = Table::alter()
                    .table(WebhookDeliveries::Table)
                    .add_column(column)
                    .to_owned();
                manager.alter_table(alter).await?;
            }
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in [
            WebhookDeliveries::AccountIds,
            WebhookDeliveries::ConnectionId,
            WebhookDeliveries::JobId,
        ] {
            let alter = Table::alter()
                .table(WebhookDeliveries::Table)
                .drop_column(column)
                .to_owned();
            manager.alter_table(alter).await?;
        }
        Ok(())
    }
}
