//! `api_audit_at`: the index on `api_audit.at` by which the retention sweep finds the
//! first audit row young enough to keep, as the other history tables' age indexes do.

use sea_orm_migration::prelude::*;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261204_000081_api_audit_at"
    }
}

const TABLE: &str = "api_audit";
const INDEX: &str = "api_audit_at";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // MySQL's DDL is not transactional and has no `IF NOT EXISTS` for indexes: the
        // step may run again after a stop.
        if !manager.has_index(TABLE, INDEX).await? {
            manager
                .create_index(
                    Index::create()
                        .name(INDEX)
                        .table(Alias::new(TABLE))
                        .col(Alias::new("at"))
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.has_index(TABLE, INDEX).await? {
            manager
                .drop_index(
                    Index::drop()
                        .name(INDEX)
                        .table(Alias::new(TABLE))
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
