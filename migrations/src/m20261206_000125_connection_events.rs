//! Connection events in `notification_deliveries`: `run_id` becomes nullable, `event`
//! names what a delivery reports (`run` for every row from before), and `event_key`, unique,
//! is a connection event's idempotency key (null for runs, which `run_id` keys).
//!
//! SQLite cannot drop a column's NOT NULL, so there the table is rebuilt, in the
//! migration's transaction (SQLite's DDL is transactional).

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend};

use crate::m20261129_000001_create_tables::{counter, id, instant, long_text, string};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261206_000125_connection_events"
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
    Event,
    EventKey,
}

const TABLE: &str = "notification_deliveries";
/// The SQLite rebuild's new table, renamed over the old one.
const REBUILT: &str = "notification_deliveries_rebuilt";
const EVENT_KEY_INDEX: &str = "notification_deliveries_event_key";
/// The indexes the table had, recreated after SQLite's rebuild.
const INDEXES: &[(&str, &[&str])] = &[
    (
        "notification_deliveries_status_next_attempt_at",
        &["status", "next_attempt_at"],
    ),
    (
        "notification_deliveries_user_provider_status_id",
        &["user_id", "provider", "status", "id"],
    ),
    ("notification_deliveries_created_at", &["created_at"]),
];
/// The columns copied by the rebuild.
const COLUMNS: &str = "id, delivery_id, run_id, user_id, provider, body, status, attempts, \
                       last_error, next_attempt_at, created_at, delivered_at";

fn event() -> ColumnDef {
    string(NotificationDeliveries::Event, 40)
        .default("run")
        .to_owned()
}

fn event_key() -> ColumnDef {
    ColumnDef::new(NotificationDeliveries::EventKey)
        .string_len(191)
        .null()
        .to_owned()
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        let db = manager.get_connection();
        match backend {
            DbBackend::Sqlite => {
                if manager.has_column(TABLE, "event").await? {
                    return Ok(());
                }
                rebuild_on_sqlite(manager).await?;
            }
            // MySQL's DDL is not transactional: every step may run again after a stop.
            DbBackend::MySql => {
                db.execute_unprepared(
                    "ALTER TABLE notification_deliveries MODIFY run_id BIGINT NULL",
                )
                .await?;
            }
            _ => {
                db.execute_unprepared(
                    "ALTER TABLE notification_deliveries ALTER COLUMN run_id DROP NOT NULL",
                )
                .await?;
            }
        }
        for (name, column) in [("event", event()), ("event_key", event_key())] {
            if !manager.has_column(TABLE, name).await? {
                let alter = Table::alter()
                    .table(NotificationDeliveries::Table)
                    .add_column(column)
                    .to_owned();
                manager.alter_table(alter).await?;
            }
        }
        manager
            .create_index(
                Index::create()
                    .name(EVENT_KEY_INDEX)
                    .table(NotificationDeliveries::Table)
                    .col(NotificationDeliveries::EventKey)
                    .unique()
                    .if_not_exists()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // Connection events have no run: they cannot stay once `run_id` is required again.
        manager
            .get_connection()
            .execute_unprepared("DELETE FROM notification_deliveries WHERE run_id IS NULL")
            .await?;
        manager
            .drop_index(
                Index::drop()
                    .name(EVENT_KEY_INDEX)
                    .table(NotificationDeliveries::Table)
                    .to_owned(),
            )
            .await?;
        for column in [
            NotificationDeliveries::Event,
            NotificationDeliveries::EventKey,
        ] {
            let alter = Table::alter()
                .table(NotificationDeliveries::Table)
                .drop_column(column)
                .to_owned();
            manager.alter_table(alter).await?;
        }
        Ok(())
    }
}

/// Copies the table into one whose `run_id` is nullable, then swaps them; the new
/// columns are added after, as on the other backends.
async fn rebuild_on_sqlite(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    use NotificationDeliveries as T;
    let backend = manager.get_database_backend();
    let db = manager.get_connection();
    manager
        .create_table(
            Table::create()
                .table(Alias::new(REBUILT))
                .col(id(T::Id))
                .col(string(T::DeliveryId, 36).unique_key())
                .col(ColumnDef::new(T::RunId).big_integer().null().unique_key())
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
    db.execute_unprepared(&format!(
        "INSERT INTO {REBUILT} ({COLUMNS}) SELECT {COLUMNS} FROM {TABLE}"
    ))
    .await?;
    db.execute_unprepared(&format!("DROP TABLE {TABLE}"))
        .await?;
    db.execute_unprepared(&format!("ALTER TABLE {REBUILT} RENAME TO {TABLE}"))
        .await?;
    for (name, columns) in INDEXES {
        let mut index = Index::create();
        index.name(*name).table(T::Table);
        for column in *columns {
            index.col(Alias::new(*column));
        }
        manager.create_index(index.to_owned()).await?;
    }
    Ok(())
}
