//! Streams: a connection serves several listings, each with its own sync state.
//!
//! - `connection_streams`: one row per (connection, stream) with the stream's cursor,
//!   checkpoint and last success. The connection keeps its credentials, lease and refresh
//!   claim, which its streams share. Its own `cursor`, `checkpoint` and `last_success_*`
//!   are the state from before streams: the primary stream's row takes them over at its
//!   first run (the migration cannot, since which stream is primary depends on the
//!   provider's kind in config.toml).
//! - `sync_runs.stream`: the stream a run synced; null for runs from before streams.
//! - `sync_runs.parents_skipped`: a child stream's parents whose children the API no
//!   longer lists (a repository the token cannot see any more).
//! - `sync_runs.records_filtered`: records a configured filter dropped before storing.

use sea_orm_migration::prelude::*;

use crate::m20261129_000001_create_tables::{counter, id, instant, long_text, string};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261203_000001_streams"
    }
}

#[derive(DeriveIden)]
enum ConnectionStreams {
    Table,
    Id,
    ConnectionId,
    Stream,
    Cursor,
    Checkpoint,
    LastSuccessRunId,
    LastSuccessAt,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum Connections {
    Table,
    Id,
}

#[derive(DeriveIden)]
enum SyncRuns {
    Table,
    Stream,
    ParentsSkipped,
    RecordsFiltered,
}

/// The longest stream name (config validates names against it).
const STREAM_LEN: u32 = 64;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        manager
            .create_table(
                Table::create()
                    .table(ConnectionStreams::Table)
                    .col(id(ConnectionStreams::Id))
                    .col(
                        ColumnDef::new(ConnectionStreams::ConnectionId)
                            .big_integer()
                            .not_null(),
                    )
                    .col(string(ConnectionStreams::Stream, STREAM_LEN))
                    .col(
                        long_text(backend, ConnectionStreams::Cursor)
                            .null()
                            .to_owned(),
                    )
                    .col(
                        long_text(backend, ConnectionStreams::Checkpoint)
                            .null()
                            .to_owned(),
                    )
                    .col(
                        ColumnDef::new(ConnectionStreams::LastSuccessRunId)
                            .big_integer()
                            .null(),
                    )
                    .col(
                        instant(backend, ConnectionStreams::LastSuccessAt)
                            .null()
                            .to_owned(),
                    )
                    .col(
                        instant(backend, ConnectionStreams::CreatedAt)
                            .not_null()
                            .to_owned(),
                    )
                    .col(
                        instant(backend, ConnectionStreams::UpdatedAt)
                            .not_null()
                            .to_owned(),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .name("connection_streams_connection_id_fkey")
                            .from(ConnectionStreams::Table, ConnectionStreams::ConnectionId)
                            .to(Connections::Table, Connections::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("connection_streams_connection_stream_key")
                    .table(ConnectionStreams::Table)
                    .col(ConnectionStreams::ConnectionId)
                    .col(ConnectionStreams::Stream)
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(SyncRuns::Table)
                    .add_column(
                        ColumnDef::new(SyncRuns::Stream)
                            .string_len(STREAM_LEN)
                            .null(),
                    )
                    .to_owned(),
            )
            .await?;
        // One column per statement: SQLite adds one column per ALTER TABLE.
        for column in [SyncRuns::ParentsSkipped, SyncRuns::RecordsFiltered] {
            manager
                .alter_table(
                    Table::alter()
                        .table(SyncRuns::Table)
                        .add_column(counter(column))
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in [
            SyncRuns::RecordsFiltered,
            SyncRuns::ParentsSkipped,
            SyncRuns::Stream,
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(SyncRuns::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        manager
            .drop_table(Table::drop().table(ConnectionStreams::Table).to_owned())
            .await
    }
}
