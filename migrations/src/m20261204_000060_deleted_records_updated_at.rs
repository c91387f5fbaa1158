//! `records.updated_at` becomes the time a record last changed, its deletion included:
//! marking a record deleted now sets it too, and this gives the records marked deleted
//! before that their `deleted_at`, so that reading records changed since an instant (the
//! API's `modified_after`) finds their tombstones.

use sea_orm_migration::prelude::*;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261204_000060_deleted_records_updated_at"
    }
}

#[derive(DeriveIden)]
enum Records {
    Table,
    UpdatedAt,
    DeletedAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // Idempotent: a row already moved no longer matches.
        manager
            .exec_stmt(
                Query::update()
                    .table(Records::Table)
                    .value(Records::UpdatedAt, Expr::col(Records::DeletedAt))
                    .and_where(Expr::col(Records::DeletedAt).is_not_null())
                    .and_where(Expr::col(Records::DeletedAt).gt(Expr::col(Records::UpdatedAt)))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, _manager: &SchemaManager) -> Result<(), DbErr> {
        // The rewrite times it replaced are gone; a later time is still a correct
        // "changed since" for the older code, which reads it as the last rewrite.
        Ok(())
    }
}
