//! Schema migrations for tributary, run on start and by `tributary migrate`.
//!
//! Column names are a contract: operators query these tables directly. Change the schema
//! only by adding a migration; never edit one that has shipped.

pub use sea_orm_migration::prelude::*;

mod m20261129_000001_create_tables;
mod m20261129_000002_connection_leases;
mod m20261129_000003_replay_and_append;
mod m20261129_000004_exact_key_collation;
mod m20261201_000001_watermark_anomalies;
mod m20261201_000002_refresh_claims;
mod m20261201_000003_connection_origin;
mod m20261202_000002_change_feed;
mod m20261202_000003_notifications;
mod m20261202_000004_deletion_tracking;
mod m20261203_000001_streams;
mod m20261203_000003_lease_generation;
mod m20261203_000005_full_pass_owed;
mod m20261203_000010_instances;
mod m20261203_000011_feed_database_id;
mod m20261203_000020_sync_jobs;
mod m20261203_000021_paused;
mod m20261203_000022_schedule_override;
mod m20261204_000023_job_queue;
mod m20261204_000024_stream_schedules;
mod m20261204_000030_retention;
mod m20261204_000040_rate_budgets;
mod m20261204_000050_api_keys;
mod m20261204_000060_deleted_records_updated_at;
mod m20261204_000061_records_changed_order;
mod m20261204_000070_job_cancel;
mod m20261204_000071_api_key_rate_limit;
mod m20261204_000080_run_stamps_from;
mod m20261204_000081_api_audit_at;
mod m20261205_000090_connect_sessions;
mod m20261205_000091_webhook_inbox;
mod m20261205_000095_webhook_received_at;
mod m20261205_000096_job_claim_order;
mod m20261205_000097_connect_oauth;
mod m20261205_000098_connection_account_id;
mod m20261205_000099_one_job_per_slot;
mod m20261205_000100_needs_reconnect;
mod m20261205_000110_webhook_routing;
mod m20261206_000120_stream_paused;
mod m20261206_000125_connection_events;
mod m20261206_000130_record_source_version;
mod m20261206_000135_operator_sessions;
mod m20261206_000150_feed_readers;
mod m20261207_000200_shopify_connect;

/// All migrations, oldest first.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261129_000001_create_tables::Migration),
            Box::new(m20261129_000002_connection_leases::Migration),
            Box::new(m20261129_000003_replay_and_append::Migration),
            Box::new(m20261129_000004_exact_key_collation::Migration),
            Box::new(m20261201_000001_watermark_anomalies::Migration),
            Box::new(m20261201_000002_refresh_claims::Migration),
            Box::new(m20261201_000003_connection_origin::Migration),
            Box::new(m20261202_000002_change_feed::Migration),
            Box::new(m20261202_000003_notifications::Migration),
            Box::new(m20261202_000004_deletion_tracking::Migration),
            Box::new(m20261203_000001_streams::Migration),
            Box::new(m20261203_000003_lease_generation::Migration),
            Box::new(m20261203_000005_full_pass_owed::Migration),
            Box::new(m20261203_000010_instances::Migration),
            Box::new(m20261203_000011_feed_database_id::Migration),
            Box::new(m20261203_000020_sync_jobs::Migration),
            Box::new(m20261203_000021_paused::Migration),
            Box::new(m20261203_000022_schedule_override::Migration),
            Box::new(m20261204_000023_job_queue::Migration),
            Box::new(m20261204_000024_stream_schedules::Migration),
            Box::new(m20261204_000030_retention::Migration),
            Box::new(m20261204_000040_rate_budgets::Migration),
            Box::new(m20261204_000050_api_keys::Migration),
            Box::new(m20261204_000060_deleted_records_updated_at::Migration),
            Box::new(m20261204_000061_records_changed_order::Migration),
            Box::new(m20261204_000070_job_cancel::Migration),
            Box::new(m20261204_000071_api_key_rate_limit::Migration),
            Box::new(m20261204_000080_run_stamps_from::Migration),
            Box::new(m20261204_000081_api_audit_at::Migration),
            Box::new(m20261205_000090_connect_sessions::Migration),
            Box::new(m20261205_000091_webhook_inbox::Migration),
            Box::new(m20261205_000095_webhook_received_at::Migration),
            Box::new(m20261205_000096_job_claim_order::Migration),
            Box::new(m20261205_000097_connect_oauth::Migration),
            Box::new(m20261205_000098_connection_account_id::Migration),
            Box::new(m20261205_000099_one_job_per_slot::Migration),
            Box::new(m20261205_000100_needs_reconnect::Migration),
            Box::new(m20261205_000110_webhook_routing::Migration),
            Box::new(m20261206_000120_stream_paused::Migration),
            Box::new(m20261206_000125_connection_events::Migration),
            Box::new(m20261206_000130_record_source_version::Migration),
            Box::new(m20261206_000135_operator_sessions::Migration),
            Box::new(m20261206_000150_feed_readers::Migration),
            Box::new(m20261207_000200_shopify_connect::Migration),
        ]
    }
}

/// The name of the composite unique index on `records` (user_id, provider, external_id).
pub const RECORDS_KEY_INDEX: &str = "records_user_provider_external_id_key";

/// The migrations recorded as applied in `seaql_migrations`, oldest first, read without
/// creating the table (none on a fresh database). Unlike the migrator's own status, it
/// does not fail on versions this crate does not know: a newer release applied those.
pub async fn applied_versions(
    db: &sea_orm_migration::sea_orm::DatabaseConnection,
) -> Result<Vec<String>, DbErr> {
    use sea_orm_migration::sea_orm::{EntityTrait, QueryOrder};
    use sea_orm_migration::seaql_migrations;
    if !has_table(db, "seaql_migrations").await? {
        return Ok(Vec::new());
    }
    Ok(seaql_migrations::Entity::find()
        .order_by_asc(seaql_migrations::Column::Version)
        .all(db)
        .await?
        .into_iter()
        .map(|row| row.version)
        .collect())
}

/// Whether the database has `table`.
pub async fn has_table(
    db: &sea_orm_migration::sea_orm::DatabaseConnection,
    table: &str,
) -> Result<bool, DbErr> {
    SchemaManager::new(db).has_table(table).await
}
