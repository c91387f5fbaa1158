//! `change_clock.database_id`: a random id, drawn once per database, that the change
//! feed's cursors carry, so that a cursor read on another database is refused rather than
//! read against that database's changes. Not the server's identity: on PostgreSQL the
//! databases of one cluster share transaction ids, and so seqs. See
//! docs/decisions/change-feed.md.

use sea_orm_migration::prelude::*;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261203_000011_feed_database_id"
    }
}

#[derive(DeriveIden)]
enum ChangeClock {
    Table,
    Id,
    DatabaseId,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(ChangeClock::Table)
                    .add_column(
                        ColumnDef::new(ChangeClock::DatabaseId)
                            .string_len(32)
                            .null(),
                    )
                    .to_owned(),
            )
            .await?;
        // Drawn here rather than in SQL: not every supported server version has a
        // function for random bytes.
        let id = uuid::Uuid::new_v4().simple().to_string();
        manager
            .exec_stmt(
                Query::update()
                    .table(ChangeClock::Table)
                    .value(ChangeClock::DatabaseId, id)
                    .and_where(Expr::col(ChangeClock::Id).eq(1))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(ChangeClock::Table)
                    .drop_column(ChangeClock::DatabaseId)
                    .to_owned(),
            )
            .await
    }
}
