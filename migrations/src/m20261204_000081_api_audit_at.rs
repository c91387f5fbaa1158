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
        create_index_once(manager, TABLE, INDEX, "at").await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        drop_index_once(manager, TABLE, INDEX).await
    }
}

/// Creates the index `index` on `table`'s `column` unless it exists: MySQL's DDL is not
/// transactional and has no `IF NOT EXISTS` for indexes, so the step may run again after
/// a stop.
pub(crate) async fn create_index_once(
    manager: &SchemaManager<'_>,
    table: &str,
    index: &str,
    column: &str,
) -> Result<(), DbErr> {
    if !manager.has_index(table, index).await? {
        manager
            .create_index(
                Index::create()
                    .name(index)
                    .table(Alias::new(table))
                    .col(Alias::new(column))
                    .to_owned(),
            )
            .await?;
    }
    Ok(())
}

/// Drops the index `index` of `table` if it exists.
pub(crate) async fn drop_index_once(
    manager: &SchemaManager<'_>,
    table: &str,
    index: &str,
) -> Result<(), DbErr> {
    if manager.has_index(table, index).await? {
        manager
            .drop_index(
                Index::drop()
                    .name(index)
                    .table(Alias::new(table))
                    .to_owned(),
            )
            .await?;
    }
    Ok(())
}
