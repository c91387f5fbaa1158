//! `connect_sessions`: the links an app hands its users to connect their own accounts on
//! the Connect page. Only a SHA-256 hash of the link's token is kept, and of the cookie
//! that binds the session to the first browser that opened it.

use sea_orm_migration::prelude::*;

use crate::m20261129_000001_create_tables::{id, instant, string};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261205_000090_connect_sessions"
    }
}

#[derive(DeriveIden)]
enum ConnectSessions {
    Table,
    Id,
    TokenHash,
    UserId,
    Providers,
    ReconnectConnectionId,
    ReturnUrl,
    CreatedAt,
    ExpiresAt,
    UsedAt,
    BindingHash,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        // MySQL's DDL is not transactional: every step may run again after a stop.
        manager
            .create_table(
                Table::create()
                    .table(ConnectSessions::Table)
                    .if_not_exists()
                    .col(id(ConnectSessions::Id))
                    .col(string(ConnectSessions::TokenHash, 64).unique_key())
                    .col(string(ConnectSessions::UserId, 255))
                    // A JSON array of provider names.
                    .col(string(ConnectSessions::Providers, 2048))
                    .col(
                        ColumnDef::new(ConnectSessions::ReconnectConnectionId)
                            .big_integer()
                            .null(),
                    )
                    .col(string(ConnectSessions::ReturnUrl, 2048))
                    .col(instant(backend, ConnectSessions::CreatedAt).not_null())
                    .col(instant(backend, ConnectSessions::ExpiresAt).not_null())
                    .col(instant(backend, ConnectSessions::UsedAt).null())
                    .col(
                        ColumnDef::new(ConnectSessions::BindingHash)
                            .string_len(64)
                            .null(),
                    )
                    .to_owned(),
            )
            .await?;
        // The sweep walks the expired sessions by this index.
        manager
            .create_index(
                Index::create()
                    .name("connect_sessions_expires_at")
                    .table(ConnectSessions::Table)
                    .col(ConnectSessions::ExpiresAt)
                    .if_not_exists()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(ConnectSessions::Table)
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}
