//! `operator_sessions`: a browser's session on the operator page, made by posting an
//! admin API key once. Only a SHA-256 hash of the session's cookie is kept, with the key
//! it came from (its revocation ends the session) and when it expires.

use sea_orm_migration::prelude::*;

use crate::m20261129_000001_create_tables::{id, instant, string};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261206_000135_operator_sessions"
    }
}

#[derive(DeriveIden)]
enum OperatorSessions {
    Table,
    Id,
    TokenHash,
    KeyId,
    CreatedAt,
    ExpiresAt,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        // MySQL's DDL is not transactional: every step may run again after a stop.
        manager
            .create_table(
                Table::create()
                    .table(OperatorSessions::Table)
                    .if_not_exists()
                    .col(id(OperatorSessions::Id))
                    .col(string(OperatorSessions::TokenHash, 64).unique_key())
                    .col(
                        ColumnDef::new(OperatorSessions::KeyId)
                            .big_integer()
                            .not_null(),
                    )
                    .col(instant(backend, OperatorSessions::CreatedAt).not_null())
                    .col(instant(backend, OperatorSessions::ExpiresAt).not_null())
                    .to_owned(),
            )
            .await?;
        // The sweep deletes the expired sessions by this index.
        manager
            .create_index(
                Index::create()
                    .name("operator_sessions_expires_at")
                    .table(OperatorSessions::Table)
                    .col(OperatorSessions::ExpiresAt)
                    .if_not_exists()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(
                Table::drop()
                    .table(OperatorSessions::Table)
                    .if_exists()
                    .to_owned(),
            )
            .await
    }
}
