//! `webhook_deliveries_received_at`: the index on `webhook_deliveries.received_at` by which
//! the retention sweep finds the first delivery young enough to keep, as the other history
//! tables' age indexes do.

use sea_orm_migration::prelude::*;

use crate::m20261204_000081_api_audit_at::{create_index_once, drop_index_once};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261205_000095_webhook_received_at"
    }
}

const TABLE: &str = "webhook_deliveries";
const INDEX: &str = "webhook_deliveries_received_at";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        create_index_once(manager, TABLE, INDEX, "received_at").await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        drop_index_once(manager, TABLE, INDEX).await
    }
}
