//! `notification_deliveries`: the outbox of webhooks. A run's notification is written in
//! the transaction that closes the run, and the daemon's delivery worker sends it.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend};

use crate::m20261129_000001_create_tables::{counter, id, instant, long_text, string};
use crate::m20261129_000004_exact_key_collation::{alter, exact_collation, Column};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261202_000003_notifications"
    }
}

#[derive(DeriveIden)]
enum NotificationDeliveries {
    Table,
    Id,
    DeliveryId,
    RunId,
    UserId,
    Provider,
    Body,
    Status,
    Attempts,
    LastError,
    NextAttemptAt,
    CreatedAt,
    DeliveredAt,
}

/// The connection's columns, compared byte for byte on MySQL as in every other table.
const KEY_COLUMNS: &[Column] = &[("user_id", 255, false), ("provider", 64, false)];

/// The index the worker reads due deliveries by.
const DUE_INDEX: &str = "notification_deliveries_status_next_attempt_at";
/// The index that finds a connection's earlier pending delivery.
const CONNECTION_INDEX: &str = "notification_deliveries_user_provider_status_id";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        use NotificationDeliveries as T;
        let backend = manager.get_database_backend();
        manager
            .create_table(
                Table::create()
                    .table(T::Table)
                    .col(id(T::Id))
                    .col(string(T::DeliveryId, 36).unique_key())
                    .col(
                        ColumnDef::new(T::RunId)
                            .big_integer()
                            .not_null()
                            .unique_key(),
                    )
                    .col(string(T::UserId, 255))
                    .col(string(T::Provider, 64))
                    .col(long_text(backend, T::Body).not_null())
                    .col(string(T::Status, 16))
                    .col(counter(T::Attempts))
                    .col(ColumnDef::new(T::LastError).text().null())
                    .col(instant(backend, T::NextAttemptAt).not_null())
                    .col(instant(backend, T::CreatedAt).not_null())
                    .col(instant(backend, T::DeliveredAt).null())
                    .to_owned(),
            )
            .await?;
        if backend == DbBackend::MySql {
            let collation = exact_collation(manager).await?;
            manager
                .get_connection()
                .execute_unprepared(&alter(
                    "notification_deliveries",
                    KEY_COLUMNS,
                    Some(&collation),
                ))
                .await?;
        }
        manager
            .create_index(
                Index::create()
                    .name(DUE_INDEX)
                    .table(T::Table)
                    .col(T::Status)
                    .col(T::NextAttemptAt)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name(CONNECTION_INDEX)
                    .table(T::Table)
                    .col(T::UserId)
                    .col(T::Provider)
                    .col(T::Status)
                    .col(T::Id)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(NotificationDeliveries::Table)
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}
