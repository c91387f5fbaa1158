//! `stream_schedules`: one stream of a connection on a schedule of its own, replacing its
//! connection's (or provider's) for that stream; the connection's other streams keep
//! theirs. Runtime state, like `connections.schedule`.

use sea_orm_migration::prelude::*;

use crate::m20261129_000001_create_tables::{id, instant, string};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261204_000024_stream_schedules"
    }
}

#[derive(DeriveIden)]
enum StreamSchedules {
    Table,
    Id,
    ConnectionId,
    Stream,
    Schedule,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum Connections {
    Table,
    Id,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        use StreamSchedules as T;
        let backend = manager.get_database_backend();
        manager
            .create_table(
                Table::create()
                    .table(T::Table)
                    .if_not_exists()
                    .col(id(T::Id))
                    .col(ColumnDef::new(T::ConnectionId).big_integer().not_null())
                    .col(string(T::Stream, 64))
                    .col(string(T::Schedule, 128))
                    .col(instant(backend, T::UpdatedAt).not_null().to_owned())
                    .foreign_key(
                        ForeignKey::create()
                            .name("stream_schedules_connection_id_fkey")
                            .from(T::Table, T::ConnectionId)
                            .to(Connections::Table, Connections::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("stream_schedules_key")
                    .table(T::Table)
                    .col(T::ConnectionId)
                    .col(T::Stream)
                    .unique()
                    .if_not_exists()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(StreamSchedules::Table)
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}
