//! `webhook_deliveries`: the inbox of verified provider webhooks, one row per delivery,
//! unique on (`provider`, `delivery_id`), with what a worker needs to claim and settle it
//! (docs/decisions/inbound-webhooks.md).

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

use crate::m20261129_000001_create_tables::{counter, id, instant, long_text, string};
use crate::m20261129_000004_exact_key_collation::{alter, exact_collation};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261205_000091_webhook_inbox"
    }
}

#[derive(DeriveIden)]
enum WebhookDeliveries {
    Table,
    Id,
    Provider,
    DeliveryId,
    EventType,
    ReceivedAt,
    Body,
    Status,
    Attempts,
    NextAttemptAt,
    Error,
    AppliedAt,
}

const TABLE: &str = "webhook_deliveries";
const KEY_INDEX: &str = "webhook_deliveries_provider_delivery_id";
const DUE_INDEX: &str = "webhook_deliveries_status_next_attempt_at";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        // MySQL's DDL is not transactional: every step may run again after a stop.
        manager
            .create_table(
                Table::create()
                    .table(WebhookDeliveries::Table)
                    .if_not_exists()
                    .col(id(WebhookDeliveries::Id))
                    .col(string(WebhookDeliveries::Provider, 64))
                    .col(string(WebhookDeliveries::DeliveryId, 255))
                    .col(
                        ColumnDef::new(WebhookDeliveries::EventType)
                            .string_len(255)
                            .null(),
                    )
                    .col(instant(backend, WebhookDeliveries::ReceivedAt).not_null())
                    .col(long_text(backend, WebhookDeliveries::Body).not_null())
                    .col(string(WebhookDeliveries::Status, 16))
                    .col(counter(WebhookDeliveries::Attempts))
                    .col(instant(backend, WebhookDeliveries::NextAttemptAt).not_null())
                    .col(ColumnDef::new(WebhookDeliveries::Error).text().null())
                    .col(instant(backend, WebhookDeliveries::AppliedAt).null())
                    .to_owned(),
            )
            .await?;
        if backend == DbBackend::MySql {
            // Delivery ids are compared byte for byte, as on the other backends: Stripe's
            // `evt_...` ids differ by case alone.
            let collation = exact_collation(manager).await?;
            let columns = [("provider", 64, false), ("delivery_id", 255, false)];
            manager
                .get_connection()
                .execute_unprepared(&alter(TABLE, &columns, Some(&collation)))
                .await?;
        }
        if !manager.has_index(TABLE, KEY_INDEX).await? {
            manager
                .create_index(
                    Index::create()
                        .name(KEY_INDEX)
                        .table(WebhookDeliveries::Table)
                        .col(WebhookDeliveries::Provider)
                        .col(WebhookDeliveries::DeliveryId)
                        .unique()
                        .to_owned(),
                )
                .await?;
        }
        if !manager.has_index(TABLE, DUE_INDEX).await? {
            manager
                .create_index(
                    Index::create()
                        .name(DUE_INDEX)
                        .table(WebhookDeliveries::Table)
                        .col(WebhookDeliveries::Status)
                        .col(WebhookDeliveries::NextAttemptAt)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(WebhookDeliveries::Table)
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}
