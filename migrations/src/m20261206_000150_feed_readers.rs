//! `feed_readers`: one row per reader of the change feed (an API key that reads
//! `/v1/changes`), with the position its last recorded read returned and when it last
//! read, so that the operator page shows how far behind each reader is
//! (docs/decisions/feed-readers.md).

use sea_orm_migration::prelude::*;

use crate::m20261129_000001_create_tables::{id, instant, string};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261206_000150_feed_readers"
    }
}

#[derive(DeriveIden)]
enum FeedReaders {
    Table,
    Id,
    Reader,
    KeyId,
    Seq,
    Ordinal,
    ReadAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        manager
            .create_table(
                Table::create()
                    .table(FeedReaders::Table)
                    .if_not_exists()
                    .col(id(FeedReaders::Id))
                    // `key:ID`: the conflict target of the first read's insert.
                    .col(string(FeedReaders::Reader, 160).unique_key())
                    .col(ColumnDef::new(FeedReaders::KeyId).big_integer().null())
                    .col(ColumnDef::new(FeedReaders::Seq).big_integer().not_null())
                    .col(
                        ColumnDef::new(FeedReaders::Ordinal)
                            .big_integer()
                            .not_null(),
                    )
                    .col(instant(backend, FeedReaders::ReadAt).not_null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(FeedReaders::Table)
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}
