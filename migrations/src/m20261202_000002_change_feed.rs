//! The change feed: `change_clock` (one row, the commit-order clock), `change_batches`
//! (one per transaction that changed records, stamped with the clock as it commits) and
//! `changes` (one per record inserted, updated, deleted or restored). See
//! docs/decisions/change-feed.md.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

use crate::m20261129_000001_create_tables::instant;
use crate::m20261129_000004_exact_key_collation::{alter, exact_collation, Column};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261202_000002_change_feed"
    }
}

#[derive(DeriveIden)]
enum ChangeClock {
    Table,
    Id,
    Seq,
    SweptSeq,
}

#[derive(DeriveIden)]
enum ChangeBatches {
    Table,
    Id,
    Seq,
    RunId,
    UserId,
    Provider,
    CommittedAt,
}

#[derive(DeriveIden)]
enum Changes {
    Table,
    BatchId,
    Ordinal,
    ExternalId,
    Kind,
}

/// The key columns of the new tables, which compare byte for byte on MySQL as the
/// `records` key does (the feed joins `records` on them).
const KEY_COLUMNS: &[(&str, &[Column])] = &[
    (
        "change_batches",
        &[("user_id", 255, false), ("provider", 64, false)],
    ),
    ("changes", &[("external_id", 255, false)]),
];

fn id(column: impl IntoIden) -> ColumnDef {
    ColumnDef::new(column)
        .big_integer()
        .not_null()
        .auto_increment()
        .primary_key()
        .take()
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        manager
            .create_table(
                Table::create()
                    .table(ChangeClock::Table)
                    .col(
                        ColumnDef::new(ChangeClock::Id)
                            .big_integer()
                            .not_null()
                            .primary_key(),
                    )
                    .col(
                        ColumnDef::new(ChangeClock::Seq)
                            .big_integer()
                            .not_null()
                            .default(0),
                    )
                    .col(
                        ColumnDef::new(ChangeClock::SweptSeq)
                            .big_integer()
                            .not_null()
                            .default(0),
                    )
                    .to_owned(),
            )
            .await?;
        // The clock's one row: every transaction that records changes takes it last.
        manager
            .get_connection()
            .execute_unprepared("INSERT INTO change_clock (id, seq, swept_seq) VALUES (1, 0, 0)")
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(ChangeBatches::Table)
                    .col(id(ChangeBatches::Id))
                    .col(ColumnDef::new(ChangeBatches::Seq).big_integer().null())
                    .col(
                        ColumnDef::new(ChangeBatches::RunId)
                            .big_integer()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(ChangeBatches::UserId)
                            .string_len(255)
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(ChangeBatches::Provider)
                            .string_len(64)
                            .not_null(),
                    )
                    .col(instant(backend, ChangeBatches::CommittedAt).null())
                    .to_owned(),
            )
            .await?;
        for (name, column, unique) in [
            ("change_batches_seq_key", ChangeBatches::Seq, true),
            ("change_batches_run_id", ChangeBatches::RunId, false),
            (
                "change_batches_committed_at",
                ChangeBatches::CommittedAt,
                false,
            ),
        ] {
            let mut index = Index::create();
            index.name(name).table(ChangeBatches::Table).col(column);
            if unique {
                index.unique();
            }
            manager.create_index(index.to_owned()).await?;
        }

        // Keyed by (batch, ordinal in it): one index to write per change, and a
        // batch's changes are a range of it. On SQLite the table is that index.
        let mut changes = Table::create();
        changes
            .table(Changes::Table)
            .col(ColumnDef::new(Changes::BatchId).big_integer().not_null())
            .col(ColumnDef::new(Changes::Ordinal).integer().not_null())
            .col(
                ColumnDef::new(Changes::ExternalId)
                    .string_len(255)
                    .not_null(),
            )
            .col(ColumnDef::new(Changes::Kind).string_len(16).not_null())
            .primary_key(Index::create().col(Changes::BatchId).col(Changes::Ordinal));
        if backend == DbBackend::Sqlite {
            changes.extra("WITHOUT ROWID");
        }
        manager.create_table(changes.to_owned()).await?;

        if backend == DbBackend::MySql {
            let collation = exact_collation(manager).await?;
            for (table, columns) in KEY_COLUMNS {
                manager
                    .get_connection()
                    .execute_unprepared(&alter(table, columns, Some(&collation)))
                    .await?;
            }
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            Changes::Table.into_iden(),
            ChangeBatches::Table.into_iden(),
            ChangeClock::Table.into_iden(),
        ] {
            manager
                .drop_table(Table::drop().table(table).if_exists().to_owned())
                .await?;
        }
        Ok(())
    }
}
