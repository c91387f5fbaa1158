//! `api_keys` and `api_audit`: the HTTP API's keys, kept as a public prefix and a SHA-256
//! hash of the secret (never the key), and a row per write request made through it.

use sea_orm_migration::prelude::*;

use crate::m20261129_000001_create_tables::{id, instant, string};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261204_000050_api_keys"
    }
}

#[derive(DeriveIden)]
enum ApiKeys {
    Table,
    Id,
    Name,
    Prefix,
    SecretHash,
    Scopes,
    CreatedAt,
    LastUsedAt,
    RevokedAt,
}

#[derive(DeriveIden)]
enum ApiAudit {
    Table,
    Id,
    KeyId,
    Method,
    Path,
    Status,
    At,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        // MySQL's DDL is not transactional: every step may run again after a stop.
        manager
            .create_table(
                Table::create()
                    .table(ApiKeys::Table)
                    .if_not_exists()
                    .col(id(ApiKeys::Id))
                    .col(string(ApiKeys::Name, 128).unique_key())
                    .col(string(ApiKeys::Prefix, 32).unique_key())
                    .col(string(ApiKeys::SecretHash, 64))
                    .col(string(ApiKeys::Scopes, 255))
                    .col(instant(backend, ApiKeys::CreatedAt).not_null())
                    .col(instant(backend, ApiKeys::LastUsedAt).null())
                    .col(instant(backend, ApiKeys::RevokedAt).null())
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(ApiAudit::Table)
                    .if_not_exists()
                    .col(id(ApiAudit::Id))
                    // Null when the request named no known key (it was refused).
                    .col(ColumnDef::new(ApiAudit::KeyId).big_integer().null())
                    .col(string(ApiAudit::Method, 16))
                    .col(string(ApiAudit::Path, 1024))
                    .col(ColumnDef::new(ApiAudit::Status).integer().not_null())
                    .col(instant(backend, ApiAudit::At).not_null())
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("api_audit_key_id_at")
                    .table(ApiAudit::Table)
                    .col(ApiAudit::KeyId)
                    .col(ApiAudit::At)
                    .if_not_exists()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(ApiAudit::Table).if_exists().to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(ApiKeys::Table).if_exists().to_owned())
            .await
    }
}
